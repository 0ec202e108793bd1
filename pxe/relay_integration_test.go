//go:build integration

package pxe_test

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/insomniacslk/dhcp/dhcpv4"
	"github.com/insomniacslk/dhcp/dhcpv4/nclient4"

	"cozy.dev/cozy/internal/testing/netnstest"
	"cozy.dev/cozy/internal/testing/poll"
	"cozy.dev/cozy/internal/testing/prereq"
	"cozy.dev/cozy/internal/testing/syncbuf"
)

// TestFullModeThroughRelay serves a network the server is not on, through
// ISC's dhcrelay adding option 82: client -- relay -- server, three
// namespaces, two veth pairs.
func TestFullModeThroughRelay(t *testing.T) {
	r, relay := newRelayRig(t)
	r.start(t, "--mode", "full", "--subnet", "10.80.1.0/24", "--range", "10.80.1.100-10.80.1.150",
		"--gateway", "10.80.1.1", "--allow-unknown")
	relayLog := runRelay(t, relay)

	ack := leaseThroughRelay(t, r, mac(7), relayLog)
	if !strings.HasPrefix(ack.YourIPAddr.String(), "10.80.1.1") || ack.YourIPAddr.String() == "10.80.1.1" {
		t.Errorf("lease %s is not from the relayed network's pool", ack.YourIPAddr)
	}
	if rt := ack.Router(); len(rt) != 1 || rt[0].String() != "10.80.1.1" {
		t.Errorf("router %v, want the relay's 10.80.1.1", rt)
	}
	waitLine(t, r.stderr, "the ACK going back to the relay with option 82",
		`msg="dhcp reply"`, "outcome=ack", "relay=10.80.1.1", "option82=true", "to=10.80.1.1:67")
}

// TestFullModePools serves the server's own link and two networks behind
// relays, each from its own pool: a client behind the relay gets its
// reservation there (and the network's router), a client on the server's
// link an address of the local pool.
func TestFullModePools(t *testing.T) {
	r, relay := newRelayRig(t)
	r.start(t, "--mode", "full", "--range", "10.77.0.100-10.77.0.150", "--gateway", serverAddr,
		"--pool", "10.80.1.0/24,10.80.1.100-10.80.1.150,gateway=10.80.1.1,dns=10.77.0.1",
		"--pool", "10.80.2.0/24,10.80.2.100-10.80.2.150,gateway=10.80.2.1",
		"--reserve", mac(7).String()+"=10.80.1.77", "--reserve", mac(8).String()+"=10.77.0.88",
		"--allow-unknown")
	relayLog := runRelay(t, relay)

	ack := leaseThroughRelay(t, r, mac(7), relayLog)
	if ack.YourIPAddr.String() != "10.80.1.77" || len(ack.Router()) != 1 || ack.Router()[0].String() != "10.80.1.1" ||
		len(ack.DNS()) != 1 || ack.DNS()[0].String() != "10.77.0.1" {
		t.Errorf("relayed client: %s, want its reservation 10.80.1.77, router 10.80.1.1, DNS 10.77.0.1", ack.Summary())
	}
	if ack := leaseThroughRelay(t, r, mac(9), relayLog); !strings.HasPrefix(ack.YourIPAddr.String(), "10.80.1.1") {
		t.Errorf("second relayed client got %s, want one of 10.80.1.100-150", ack.YourIPAddr)
	}

	// A client on the server's link: the relay's uplink, seen from the
	// relay's namespace.
	var c *nclient4.Client
	if err := relay.Do(func() error {
		var err error
		c, err = nclient4.New("up0", nclient4.WithHWAddr(mac(8)), nclient4.WithTimeout(2*time.Second), nclient4.WithRetry(2))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	l, err := c.Request(ctx)
	if err != nil {
		t.Fatalf("local client: %v\n%s", err, r.stderr)
	}
	if l.ACK.YourIPAddr.String() != "10.77.0.88" || l.ACK.Router()[0].String() != serverAddr {
		t.Errorf("local client: %s, want its reservation 10.77.0.88 with router %s", l.ACK.Summary(), serverAddr)
	}
}

// TestRackRelayedPools: `pxe serve --rack` with network.dhcp.relayed
// serves a machine behind the relay at the address the rack gives it,
// with its network's router and DNS, and only the rack's machines.
func TestRackRelayedPools(t *testing.T) {
	r, relay := newRelayRig(t)
	rackFile := filepath.Join(t.TempDir(), "rack.yaml")
	rackYAML := fmt.Sprintf(`apiVersion: cozy.dev/v1alpha1
kind: Rack
metadata: {name: relayed}
network:
  interface: boot0
  subnet: 10.77.0.0/24
  dhcp:
    mode: full
    range: 10.77.0.100-10.77.0.150
    relayed:
      - {subnet: 10.80.1.0/24, range: 10.80.1.100-10.80.1.150, gateway: 10.80.1.1, dns: [10.77.0.1]}
machines:
  - hostname: w1
    role: controlplane
    mac: "%s"
    install: {disk: /dev/vda}
    interfaces:
      - {mac: "%s", addresses: [10.80.1.77/24], gateway: 10.80.1.1}
`, mac(7), mac(7))
	if err := os.WriteFile(rackFile, []byte(rackYAML), 0o600); err != nil {
		t.Fatal(err)
	}
	r.start(t, "--rack", rackFile)
	relayLog := runRelay(t, relay)

	ack := leaseThroughRelay(t, r, mac(7), relayLog)
	if ack.YourIPAddr.String() != "10.80.1.77" || len(ack.Router()) != 1 || ack.Router()[0].String() != "10.80.1.1" ||
		len(ack.DNS()) != 1 || ack.DNS()[0].String() != "10.77.0.1" {
		t.Errorf("the rack's machine behind the relay: %s, want 10.80.1.77, router 10.80.1.1, DNS 10.77.0.1", ack.Summary())
	}
	waitLine(t, r.stderr, "the ACK going back through the relay", `msg="dhcp reply"`, "outcome=ack", "relay=10.80.1.1")
}

// waitLine waits for a line of log holding every one of subs. The server
// logs a reply after sending it, so the client may hold the ACK before the
// line is written: CI once read the log in between.
func waitLine(t *testing.T, log *syncbuf.Buffer, what string, subs ...string) {
	t.Helper()
	poll.Within(t, 10*time.Second, 50*time.Millisecond, what, func() error {
		if hasLine(log.String(), subs...) {
			return nil
		}
		return fmt.Errorf("no such line in the server's log:\n%s", log)
	})
}

// newRelayRig is newRig with a relay namespace between the server and the
// client: the server's link 10.77.0.0/24 (relay at 10.77.0.2) and the
// client's network 10.80.1.0/24 (relay at 10.80.1.1).
func newRelayRig(t *testing.T) (*rig, *netnstest.NS) {
	t.Helper()
	if _, err := exec.LookPath("dhcrelay"); err != nil {
		prereq.Missing(t, "dhcrelay (Debian isc-dhcp-relay) is not installed")
	}
	r := newRig(t) // server 10.77.0.1 on boot0; its peer is moved below
	relay := netnstest.New(t, "relay")
	// Re-home the client's veth end: the relay takes the server side.
	r.cli.IP(t, "link", "set", "eth0", "netns", relay.Name)
	relay.IP(t, "link", "set", "eth0", "name", "up0")
	relay.IP(t, "addr", "add", "10.77.0.2/24", "dev", "up0")
	relay.IP(t, "link", "set", "up0", "up")
	netnstest.Veth(t, relay, "down0", "10.80.1.1/24", r.cli, "eth0", "")
	r.srv.IP(t, "route", "add", "10.80.1.0/24", "via", "10.77.0.2")
	return r, relay
}

// runRelay starts ISC dhcrelay (adding option 82) in the relay namespace,
// stopped at the end of the test.
func runRelay(t *testing.T, relay *netnstest.NS) *syncbuf.Buffer {
	t.Helper()
	dir := t.TempDir()
	ctx, cancel := context.WithCancel(context.Background())
	dhcrelay := relay.Command(ctx, "dhcrelay", "-4", "-d", "-a", "-pf", filepath.Join(dir, "dhcrelay.pid"),
		"-iu", "up0", "-id", "down0", serverAddr)
	var relayLog syncbuf.Buffer
	dhcrelay.Stdout, dhcrelay.Stderr = &relayLog, &relayLog
	if err := dhcrelay.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cancel(); _ = dhcrelay.Wait() })
	return &relayLog
}

// leaseThroughRelay runs a DORA from the client namespace, retrying while
// dhcrelay may still be opening its sockets.
func leaseThroughRelay(t *testing.T, r *rig, hw net.HardwareAddr, relayLog *syncbuf.Buffer) *dhcpv4.DHCPv4 {
	t.Helper()
	var lastErr error
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); {
		l, err := r.lease(t, hw)
		if err == nil {
			return l.ACK
		}
		lastErr = err
	}
	t.Fatalf("no lease through the relay: %v\nrelay:\n%s\nserver:\n%s", lastErr, relayLog.String(), r.stderr)
	return nil
}
