// Package bmc drives servers' baseboard management controllers: power
// state, power actions, a one-time network boot and the hardware
// inventory, over Redfish (package bmc's Redfish client is gofish).
//
// A machine's BMC is named in the rack file by an address and a
// credentials file; the credentials never appear in the rack, in logs or
// in errors.
package bmc

import (
	"fmt"
	"net"
	"net/url"
	"strings"
)

// Protocol is how Cozy talks to a BMC.
type Protocol string

// The protocols an address can name.
const (
	Redfish Protocol = "redfish"
	IPMI    Protocol = "ipmi"
)

// SystemsPath is where a Redfish service lists its computer systems.
const SystemsPath = "/redfish/v1/Systems"

// Address is a parsed BMC address from the rack file.
type Address struct {
	Protocol Protocol
	// Endpoint is the BMC's base URL for Redfish (https://HOST[:PORT]),
	// HOST:PORT for IPMI.
	Endpoint string
	// System is the Redfish ComputerSystem's path; empty means the
	// service has one system and Cozy finds it.
	System string
}

// ParseAddress reads redfish+https://HOST[:PORT][/redfish/v1/Systems/ID],
// redfish+http://… (a BMC without TLS, such as an emulator on a lab
// network) or ipmi://HOST[:PORT].
func ParseAddress(s string) (Address, error) {
	u, err := url.Parse(s)
	if err != nil {
		return Address{}, fmt.Errorf("%q is not a URL: use redfish+https://HOST[:PORT][/redfish/v1/Systems/ID] or ipmi://HOST[:PORT]", s)
	}
	if u.User != nil {
		// Never echo the address back: it holds a password.
		return Address{}, fmt.Errorf("the address must not hold credentials: put them in credentialsFile")
	}
	if u.Host == "" || u.Hostname() == "" {
		return Address{}, fmt.Errorf("%q has no host", s)
	}
	if u.RawQuery != "" || u.Fragment != "" {
		return Address{}, fmt.Errorf("%q: a BMC address has no query or fragment", s)
	}
	if p := u.Port(); p != "" {
		if _, err := net.LookupPort("tcp", p); err != nil || strings.HasPrefix(p, "0") {
			return Address{}, fmt.Errorf("%q: port %q is not a port number", s, p)
		}
	}
	switch u.Scheme {
	case "redfish+https", "redfish+http":
		a := Address{Protocol: Redfish, Endpoint: strings.TrimPrefix(u.Scheme, "redfish+") + "://" + u.Host}
		path := strings.TrimSuffix(u.EscapedPath(), "/")
		switch {
		case path == "":
		case strings.HasPrefix(path, SystemsPath+"/") && !strings.Contains(path[len(SystemsPath)+1:], "/"):
			a.System = path
		default:
			return Address{}, fmt.Errorf("%q: the path must be empty or a system, %s/ID", s, SystemsPath)
		}
		return a, nil
	case "ipmi":
		if u.Path != "" && u.Path != "/" {
			return Address{}, fmt.Errorf("%q: an IPMI address has no path", s)
		}
		host := u.Host
		if u.Port() == "" {
			host = net.JoinHostPort(u.Hostname(), "623")
		}
		return Address{Protocol: IPMI, Endpoint: host}, nil
	default:
		return Address{}, fmt.Errorf("%q: scheme %q is not one of redfish+https, redfish+http, ipmi", s, u.Scheme)
	}
}

// String is the address as the rack file writes it.
func (a Address) String() string {
	if a.Protocol == IPMI {
		return "ipmi://" + a.Endpoint
	}
	return "redfish+" + a.Endpoint + a.System
}
