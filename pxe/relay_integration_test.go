//go:build integration

package pxe_test

import (
	"context"
	"net"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"cozy.dev/cozy/internal/netnstest"
	"cozy.dev/cozy/internal/prereq"
	"cozy.dev/cozy/internal/syncbuf"
)

// TestFullModeThroughRelay serves a network the server is not on, through
// ISC's dhcrelay adding option 82: client -- relay -- server, three
// namespaces, two veth pairs.
func TestFullModeThroughRelay(t *testing.T) {
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

	r.start(t, "--mode", "full", "--subnet", "10.80.1.0/24", "--range", "10.80.1.100-10.80.1.150",
		"--gateway", "10.80.1.1", "--allow-unknown")

	dir := t.TempDir()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	dhcrelay := relay.Command(ctx, "dhcrelay", "-4", "-d", "-a", "-pf", filepath.Join(dir, "dhcrelay.pid"),
		"-iu", "up0", "-id", "down0", serverAddr)
	var relayLog syncbuf.Buffer
	dhcrelay.Stdout, dhcrelay.Stderr = &relayLog, &relayLog
	if err := dhcrelay.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { cancel(); _ = dhcrelay.Wait() }()

	var ack net.IP
	var lastErr error
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); {
		l, err := r.lease(t, mac(7))
		if err == nil {
			ack = l.ACK.YourIPAddr
			if rt := l.ACK.Router(); len(rt) != 1 || rt[0].String() != "10.80.1.1" {
				t.Errorf("router %v, want the relay's 10.80.1.1", rt)
			}
			break
		}
		lastErr = err // dhcrelay may still be opening its sockets
	}
	if ack == nil {
		t.Fatalf("no lease through the relay: %v\nrelay:\n%s\nserver:\n%s", lastErr, relayLog.String(), r.stderr)
	}
	if !strings.HasPrefix(ack.String(), "10.80.1.1") || ack.String() == "10.80.1.1" {
		t.Errorf("lease %s is not from the relayed network's pool", ack)
	}
	logs := r.stderr.String()
	if !hasLine(logs, `msg="dhcp reply"`, "outcome=ack", "relay=10.80.1.1", "option82=true", "to=10.80.1.1:67") {
		t.Errorf("the ACK did not go back to the relay with option 82:\n%s", logs)
	}
}
