//go:build integration

package pxe_test

import (
	"context"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/insomniacslk/dhcp/dhcpv4"
	"github.com/insomniacslk/dhcp/dhcpv4/nclient4"

	"cozy.dev/cozy/internal/prereq"
	"cozy.dev/cozy/internal/syncbuf"
)

var fullModeArgs = []string{"--mode", "full", "--range", "10.77.0.100-10.77.0.102", "--allow-unknown",
	"--gateway", serverAddr, "--dns", serverAddr, "--lease-time", "10m"}

// lease runs a full DORA with nclient4 from the client namespace.
func (r *rig) lease(t *testing.T, mac net.HardwareAddr, mods ...dhcpv4.Modifier) (*nclient4.Lease, error) {
	t.Helper()
	c := r.dhcpClient(t, mac)
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return c.Request(ctx, mods...)
}

func mac(last byte) net.HardwareAddr { return net.HardwareAddr{0x52, 0x54, 0x00, 0xf0, 0x00, last} }

func TestFullModeClients(t *testing.T) {
	r := newRig(t)
	r.start(t, fullModeArgs...)

	l, err := r.lease(t, mac(1))
	if err != nil {
		t.Fatalf("nclient4 DORA: %v\n%s", err, r.stderr)
	}
	ack := l.ACK
	if ip := ack.YourIPAddr.String(); !strings.HasPrefix(ip, "10.77.0.10") {
		t.Errorf("nclient4 got %s, want an address from the range", ip)
	}
	if len(ack.Router()) != 1 || ack.Router()[0].String() != serverAddr || ack.IPAddressLeaseTime(0) != 10*time.Minute {
		t.Errorf("ACK options: %s", ack.Summary())
	}

	// busybox udhcpc: its script prints what it was given.
	script := filepath.Join(t.TempDir(), "udhcpc.sh")
	if err := os.WriteFile(script, []byte("#!/bin/sh\n[ \"$1\" = bound ] && echo \"bound $ip $router $dns $lease\"\nexit 0\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := r.cli.Command(ctx, "busybox", "udhcpc", "-i", "eth0", "-n", "-q", "-f", "-t", "5", "-s", script).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "bound 10.77.0.10") || !strings.Contains(string(out), " 600") {
		t.Errorf("udhcpc: %v\n%s\n%s", err, out, r.stderr)
	}

	// ISC dhclient, with a script that changes nothing on this host.
	if _, err := exec.LookPath("dhclient"); err != nil {
		prereq.Missing(t, "dhclient (Debian isc-dhcp-client) is not installed")
	}
	dir := t.TempDir()
	dscript := filepath.Join(dir, "dhclient-script")
	if err := os.WriteFile(dscript, []byte("#!/bin/sh\necho \"$reason $new_ip_address\" >> "+filepath.Join(dir, "events")+"\nexit 0\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	// -d keeps it in the foreground (it would stay running to renew), so
	// it is stopped once bound.
	dhclient := r.cli.Command(ctx, "dhclient", "-1", "-d", "-sf", dscript, "-lf", filepath.Join(dir, "leases"),
		"-pf", filepath.Join(dir, "pid"), "eth0")
	var dout syncbuf.Buffer
	dhclient.Stdout, dhclient.Stderr = &dout, &dout
	if err := dhclient.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = dhclient.Process.Kill(); _ = dhclient.Wait() }()
	var events []byte
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		if events, _ = os.ReadFile(filepath.Join(dir, "events")); strings.Contains(string(events), "BOUND 10.77.0.10") {
			break
		}
	}
	if !strings.Contains(string(events), "BOUND 10.77.0.10") {
		t.Errorf("dhclient not bound after 20s\nevents: %s\n%s\n%s", events, dout.String(), r.stderr)
	}
}

// TestFullModeLeasesSurviveKill9 grants leases, kills the server with
// SIGKILL, restarts it on the same state and checks that no granted
// address goes to anyone else and their owners keep them.
func TestFullModeLeasesSurviveKill9(t *testing.T) {
	r := newRig(t)
	first := r.start(t, fullModeArgs...)

	granted := map[string]string{}
	for _, m := range []net.HardwareAddr{mac(1), mac(2)} {
		l, err := r.lease(t, m)
		if err != nil {
			t.Fatalf("lease for %s: %v\n%s", m, err, r.stderr)
		}
		granted[m.String()] = l.ACK.YourIPAddr.String()
	}
	first.kill9()
	r.start(t, fullModeArgs...)

	// A newcomer gets the one address left, never a granted one.
	l, err := r.lease(t, mac(3))
	if err != nil {
		t.Fatalf("newcomer after restart: %v\n%s", err, r.stderr)
	}
	for owner, ip := range granted {
		if l.ACK.YourIPAddr.String() == ip {
			t.Fatalf("after kill -9, %s (granted to %s) went to %s", ip, owner, mac(3))
		}
	}
	// The pool is full now: a fourth client gets nothing.
	if l, err := r.lease(t, mac(4)); err == nil {
		t.Fatalf("fourth client got %s from a full pool", l.ACK.YourIPAddr)
	}
	r.httpFrom = r.srv
	if m := r.metrics(t); !strings.Contains(m, "cozy_pxe_dhcp_leases 3\n") {
		t.Errorf("/metrics: want 3 leases:\n%s", m)
	}
	// An owner coming back (INIT-REBOOT) keeps its address...
	ip1 := net.ParseIP(granted[mac(1).String()])
	if l, err := r.lease(t, mac(1), dhcpv4.WithOption(dhcpv4.OptRequestedIPAddress(ip1))); err != nil || !l.ACK.YourIPAddr.Equal(ip1) {
		t.Errorf("owner did not get its address back: %v %v", l, err)
	}
}
