package dhcp

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"

	"github.com/insomniacslk/dhcp/dhcpv4"

	"cozy.dev/cozy/pxe/lease"
)

// Ports a proxyDHCP server listens on: the DHCP server port, shared with the
// network's real DHCP server, and the PXE boot-server port, which clients
// ask after they have an address (PXE 2.1, section 2.2).
const (
	PortDHCP = 67
	PortPXE  = 4011
)

// BootFiles are the iPXE binaries offered per firmware, as file names on the
// TFTP server (and under /boot/ on the HTTP server, for UEFI HTTP boot).
type BootFiles struct {
	BIOS      string // e.g. undionly.kpxe
	UEFIAMD64 string // e.g. ipxe.efi, or snponly.efi
	UEFIARM64 string // empty: arm64 clients are told nothing
}

// Config is what a Proxy needs to know.
type Config struct {
	// ServerIP is this server's address on the boot network: the TFTP
	// next-server, the DHCP server identifier and the HTTP host.
	ServerIP netip.Addr
	HTTPPort int
	Files    BootFiles
	// Allow decides which clients are answered. Nil answers nobody: a
	// netboot server that answers every machine on an office network is an
	// outage, so answering is always an explicit choice.
	Allow func(Client) bool
	// BootFile, if set, overrides Files for one client (say, snponly.efi
	// for a machine whose NIC misbehaves with ipxe.efi's own drivers).
	BootFile func(Client) string
}

// Proxy answers PXE clients without handing out addresses, so it coexists
// with the network's own DHCP server.
type Proxy struct {
	cfg Config
}

// NewProxy checks cfg and returns a Proxy.
func NewProxy(cfg Config) (*Proxy, error) {
	if !cfg.ServerIP.Is4() || cfg.ServerIP.IsUnspecified() {
		return nil, fmt.Errorf("server IP %v: need this server's IPv4 address on the boot network", cfg.ServerIP)
	}
	if cfg.HTTPPort <= 0 || cfg.HTTPPort > 65535 {
		return nil, fmt.Errorf("HTTP port %d out of range", cfg.HTTPPort)
	}
	return &Proxy{cfg: cfg}, nil
}

// Outcome says what Reply did with a request, for logs and metrics.
type Outcome string

// Outcomes of Reply.
const (
	Offered          Outcome = "offer"
	Acked            Outcome = "ack"
	IgnoredNotPXE    Outcome = "ignored-not-netboot"
	IgnoredUnknown   Outcome = "ignored-unknown-machine"
	IgnoredType      Outcome = "ignored-message-type"
	IgnoredOtherHost Outcome = "ignored-other-server"
	Rejected         Outcome = "rejected"
)

// Decision is the answer to one request.
type Decision struct {
	// Reply is the packet to send; nil means stay silent.
	Reply   *dhcpv4.DHCPv4
	Outcome Outcome
	// RequestType is the request's message type (option 53).
	RequestType dhcpv4.MessageType
	// Client is what the request says about a netboot client, read once
	// for everyone who needs it; Netboot is false for every other request.
	Client  Client
	Netboot bool
	// Commit is the lease journal position that must be durable
	// (Leases.Sync) before Reply may leave; zero means nothing to wait for.
	Commit lease.Seq
}

// Reply computes the answer to req received on port (PortDHCP or PortPXE).
// A nil reply means stay silent; the outcome says why, and err says what
// was wrong with a request that was rejected.
func (p *Proxy) Reply(req *dhcpv4.DHCPv4, port int) (*dhcpv4.DHCPv4, Outcome, error) {
	d, err := p.Decide(req, port)
	return d.Reply, d.Outcome, err
}

// Decide is Reply with the request's classification kept in the decision.
// A proxy writes no leases, so its decisions never wait for a commit.
func (p *Proxy) Decide(req *dhcpv4.DHCPv4, port int) (Decision, error) {
	if req.OpCode != dhcpv4.OpcodeBootRequest {
		return Decision{Outcome: IgnoredType, RequestType: messageType(req)}, nil
	}
	client, err := Classify(req)
	return p.decide(req, port, client, err)
}

// decide answers req given its classification (client, classifyErr).
func (p *Proxy) decide(req *dhcpv4.DHCPv4, port int, client Client, classifyErr error) (Decision, error) {
	d := Decision{RequestType: messageType(req), Client: client, Netboot: classifyErr == nil}
	if errors.Is(classifyErr, ErrNotNetboot) {
		d.Outcome = IgnoredNotPXE
		return d, nil
	}
	if classifyErr != nil {
		d.Outcome = Rejected
		return d, classifyErr
	}
	if p.cfg.Allow == nil || !p.cfg.Allow(client) {
		d.Outcome = IgnoredUnknown
		return d, nil
	}

	var replyType dhcpv4.MessageType
	switch mt := d.RequestType; {
	case port == PortDHCP && mt == dhcpv4.MessageTypeDiscover:
		replyType = dhcpv4.MessageTypeOffer
	case port == PortPXE && (mt == dhcpv4.MessageTypeRequest || mt == dhcpv4.MessageTypeInform):
		// The boot-server request: the client already has an address.
		replyType = dhcpv4.MessageTypeAck
	case port == PortDHCP && mt == dhcpv4.MessageTypeRequest:
		// Requests on 67 are for the DHCP server that offered the
		// address; a proxy has no lease to confirm.
		d.Outcome = IgnoredOtherHost
		return d, nil
	default:
		d.Outcome = IgnoredType
		return d, nil
	}
	if sid := req.ServerIdentifier(); port == PortPXE && sid != nil && !sid.Equal(p.serverIP()) {
		d.Outcome = IgnoredOtherHost
		return d, nil
	}

	mods, err := p.bootMods(req, client)
	if err != nil {
		d.Outcome = Rejected
		return d, err
	}
	mods = append(mods,
		dhcpv4.WithMessageType(replyType),
		dhcpv4.WithYourIP(net.IPv4zero),
		dhcpv4.WithOption(dhcpv4.OptServerIdentifier(p.serverIP())),
	)
	d.Reply, d.Outcome = newReply(req, mods...), outcomeOf(replyType)
	return d, nil
}

// bootMods returns what points client at its next boot stage: next
// server, boot file and the options PXE clients need to accept it.
func (p *Proxy) bootMods(req *dhcpv4.DHCPv4, client Client) ([]dhcpv4.Modifier, error) {
	file, err := p.bootFile(client)
	if err != nil {
		return nil, err
	}
	vendorClass := "PXEClient"
	if client.HTTPBoot {
		// UEFI HTTP boot clients accept only offers that say HTTPClient.
		vendorClass = "HTTPClient"
	}
	mods := []dhcpv4.Modifier{
		dhcpv4.WithServerIP(p.serverIP()),
		dhcpv4.WithOption(dhcpv4.OptClassIdentifier(vendorClass)),
		func(d *dhcpv4.DHCPv4) {
			d.ServerHostName = p.cfg.ServerIP.String()
			d.BootFileName = file
		},
	}
	if guid := req.GetOneOption(dhcpv4.OptionClientMachineIdentifier); guid != nil {
		// PXE clients drop offers that do not echo their GUID.
		mods = append(mods, dhcpv4.WithGeneric(dhcpv4.OptionClientMachineIdentifier, guid))
	}
	if client.Firmware == BIOS && !client.IPXE {
		// Vendor option 6 (PXE_DISCOVERY_CONTROL) = 8: skip boot-server
		// discovery and load the file named in this offer.
		mods = append(mods, dhcpv4.WithGeneric(dhcpv4.OptionVendorSpecificInformation, []byte{6, 1, 8, 255}))
	}
	return mods, nil
}

func outcomeOf(t dhcpv4.MessageType) Outcome {
	if t == dhcpv4.MessageTypeOffer {
		return Offered
	}
	return Acked
}

func (p *Proxy) serverIP() net.IP { return net.IP(p.cfg.ServerIP.AsSlice()) }

// bootFile is the TFTP file name, or URL, the client should load next.
func (p *Proxy) bootFile(c Client) (string, error) {
	base := fmt.Sprintf("http://%s/", netip.AddrPortFrom(p.cfg.ServerIP, uint16(p.cfg.HTTPPort)))
	if c.IPXE {
		return base + "ipxe/" + macPath(c.MAC) + ".ipxe", nil
	}
	file := ""
	if p.cfg.BootFile != nil {
		file = p.cfg.BootFile(c)
	}
	if file == "" {
		switch {
		case c.Firmware == BIOS:
			file = p.cfg.Files.BIOS
		case c.CPU == AMD64:
			file = p.cfg.Files.UEFIAMD64
		case c.CPU == ARM64:
			file = p.cfg.Files.UEFIARM64
		}
	}
	if file == "" {
		return "", fmt.Errorf("no boot file configured for %s %s clients (%s)", c.CPU, c.Firmware, c.MAC)
	}
	if c.HTTPBoot {
		return base + "boot/" + file, nil
	}
	return file, nil
}

// macPath renders a MAC for URLs: lower case, dash-separated, no colons.
func macPath(mac net.HardwareAddr) string {
	return strings.ReplaceAll(mac.String(), ":", "-")
}
