//go:build integration

package pxe_test

import (
	"context"
	"fmt"
	"maps"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/insomniacslk/dhcp/dhcpv4"
	"github.com/insomniacslk/dhcp/dhcpv4/nclient4"

	"cozy.dev/cozy/internal/testing/powercut"
	"cozy.dev/cozy/internal/testing/prereq"
	"cozy.dev/cozy/internal/testing/syncbuf"
	"cozy.dev/cozy/pxe/lease"
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
	m := r.metrics(t)
	if !strings.Contains(m, "cozy_pxe_dhcp_leases 3\n") {
		t.Errorf("/metrics: want 3 leases:\n%s", m)
	}
	// The newcomer's ACK waited for one journal sync since the restart.
	if !strings.Contains(m, "cozy_pxe_lease_journal_sync_seconds_count 1\n") {
		t.Errorf("/metrics: want the newcomer's journal sync counted:\n%s", m)
	}
	// An owner coming back (INIT-REBOOT) keeps its address...
	ip1 := net.ParseIP(granted[mac(1).String()])
	if l, err := r.lease(t, mac(1), dhcpv4.WithOption(dhcpv4.OptRequestedIPAddress(ip1))); err != nil || !l.ACK.YourIPAddr.Equal(ip1) {
		t.Errorf("owner did not get its address back: %v %v", l, err)
	}
}

// TestFullModeAckedLeasesSurviveKill9UnderLoad runs many DORAs at once
// (so the server answers them in batches, one journal sync per batch),
// kills the server with SIGKILL at a random moment, and checks that every
// lease whose ACK reached a client is in the journal. Three rounds, each
// on the journal the last one left.
func TestFullModeAckedLeasesSurviveKill9UnderLoad(t *testing.T) {
	r := newRig(t)
	relay := r.loadRelay(t)
	acked := map[string]string{} // mac -> ip, from the ACKs received
	for round := range 3 {
		srv := r.start(t, append(loadArgs, "--log-level", "error")...)
		acks, stop := relay.load(round * 10)
		for n := range 10 + rand.IntN(50) {
			select {
			case a := <-acks:
				acked[a[0]] = a[1]
			case <-time.After(20 * time.Second):
				t.Fatalf("round %d: only %d ACKs in 20 s\n%s", round, n, r.stderr)
			}
		}
		srv.kill9()
		for a := range stop() { // sent before the server died: granted too
			acked[a[0]] = a[1]
		}
		store := openAckedLeases(t, fmt.Sprintf("round %d", round), r.state, acked)
		store.Close()
	}
	t.Logf("%d ACKed leases survived 3 kill -9s", len(acked))
}

// TestFullModeAckedLeasesSurvivePowerLoss runs the server with its state
// dir on a disk that loses what was not flushed (internal/powercut), cuts
// the power at 24 random moments under load, and checks each disk a cut
// leaves: every lease whose ACK had reached a client is there, no address
// is held twice, and the store, reopened there, offers newcomers none of
// the ACKed addresses. kill -9 cannot show this: the page cache survives a
// killed process.
func TestFullModeAckedLeasesSurvivePowerLoss(t *testing.T) {
	disk := powercut.New(t)
	rng := disk.Rand()
	r := newRig(t)
	r.state = filepath.Join(disk.Dir, "state")
	relay := r.loadRelay(t)
	r.start(t, append(loadArgs, "--log-level", "error")...)

	// 24 cuts at random points of the first 200 ACKs (of 241 addresses).
	points := rng.Perm(200)[:24]
	slices.Sort(points)
	type cut struct {
		img   powercut.Image
		acked map[string]string
	}
	var cuts []cut
	acked := map[string]string{}
	acks, stop := relay.load(0)
	for n := 0; len(cuts) < len(points); n++ {
		select {
		case a := <-acks:
			acked[a[0]] = a[1]
		case <-time.After(20 * time.Second):
			t.Fatalf("only %d ACKs in 20 s\n%s", n, r.stderr)
		}
		for len(cuts) < len(points) && points[len(cuts)] <= n {
			// Somewhere in the next few milliseconds' writes.
			time.Sleep(time.Duration(rng.IntN(3000)) * time.Microsecond)
			cuts = append(cuts, cut{disk.Cut(t), maps.Clone(acked)})
		}
	}
	for range stop() {
	}

	unflushed := 0
	for i, c := range cuts {
		unflushed += c.img.Unflushed
		c.img.Mount(t, func(dir string) {
			store := openAckedLeases(t, fmt.Sprintf("cut %d", i), filepath.Join(dir, "state"), c.acked)
			defer store.Close()
			taken := map[string]bool{}
			for _, ip := range c.acked {
				taken[ip] = true
			}
			for j := range 10 {
				ip, err := store.Network(0).Offer(fmt.Sprintf("52:54:00:bb:00:%02x", j), netip.Addr{})
				if err == nil && taken[ip.String()] {
					t.Errorf("cut %d: after the power came back, %s (ACKed before the cut) is offered to a newcomer", i, ip)
				}
			}
		})
	}
	// The server syncs each batch as soon as it is written, so few cuts
	// find unflushed blocks; without the fdatasync this test fails.
	t.Logf("%d cuts after 1 to %d ACKs: every ACKed lease survived; %d unflushed blocks at the cuts, half of them kept", len(cuts), len(cuts[len(cuts)-1].acked), unflushed)
}

// loadArgs is the full-mode server of the load tests: a pool of 241.
var loadArgs = []string{"--mode", "full", "--range", "10.77.0.10-10.77.0.250", "--allow-unknown", "--lease-time", "10m"}

// loadRelay gives the client namespace a relay agent's address on the
// server's link, so replies come back by unicast to one UDP socket.
func (r *rig) loadRelay(t *testing.T) *loadRelay {
	r.cli.IP(t, "addr", "add", clientAddr+"/24", "dev", "eth0")
	var conn *net.UDPConn
	if err := r.cli.Do(func() error {
		var err error
		conn, err = net.ListenUDP("udp4", &net.UDPAddr{IP: net.ParseIP(clientAddr), Port: dhcpv4.ServerPort})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return newLoadRelay(conn)
}

// load runs DORAs for new MACs from 8 clients at once until stop, and
// reports each ACK (MAC, address). stop returns the ACKs still unread.
// seq keeps the MACs of successive loads apart.
func (l *loadRelay) load(seq int) (acks <-chan [2]string, stop func() <-chan [2]string) {
	ch := make(chan [2]string, 1000)
	done := make(chan struct{})
	var clients sync.WaitGroup
	for c := range 8 {
		base := (seq + c + 1) * 1000
		clients.Go(func() {
			for i := base; ; i++ {
				select {
				case <-done:
					return
				default:
				}
				hw := net.HardwareAddr{0x52, 0x54, 0x00, 0xaa, byte(i >> 8), byte(i)}
				if ip, ok := l.dora(hw); ok {
					ch <- [2]string{hw.String(), ip}
				}
			}
		})
	}
	return ch, func() <-chan [2]string {
		close(done)
		clients.Wait()
		close(ch)
		return ch
	}
}

// openAckedLeases opens the lease journal in state and checks that no
// address is held twice and that every ACKed lease (MAC -> address) is
// there.
func openAckedLeases(t *testing.T, label, state string, acked map[string]string) *lease.Store {
	t.Helper()
	pool, _ := lease.ParsePool("10.77.0.10-10.77.0.250")
	store, err := lease.Open(state, []lease.Network{{Pool: pool}}, nil)
	if err != nil {
		t.Fatalf("%s: journal: %v", label, err)
	}
	owner := map[netip.Addr]string{}
	for _, l := range store.Leases() {
		if other, dup := owner[l.IP]; dup {
			t.Errorf("%s: %s leased to %s and %s", label, l.IP, other, l.MAC)
		}
		owner[l.IP] = l.MAC
	}
	for mac, ip := range acked {
		if l, ok := store.Lookup(mac); !ok {
			t.Errorf("%s: %s was ACKed %s, the journal has no lease for it", label, mac, ip)
		} else if l.IP.String() != ip {
			t.Errorf("%s: %s was ACKed %s, the journal has %s", label, mac, ip, l.IP)
		}
	}
	return store
}

// loadRelay runs DORAs as a relay agent would (giaddr set), many at once
// over one socket, matching replies by transaction ID.
type loadRelay struct {
	conn    *net.UDPConn
	mu      sync.Mutex
	waiting map[dhcpv4.TransactionID]chan *dhcpv4.DHCPv4
}

func newLoadRelay(conn *net.UDPConn) *loadRelay {
	l := &loadRelay{conn: conn, waiting: map[dhcpv4.TransactionID]chan *dhcpv4.DHCPv4{}}
	go func() {
		buf := make([]byte, 4096)
		for {
			n, _, err := conn.ReadFromUDP(buf)
			if err != nil {
				return
			}
			m, err := dhcpv4.FromBytes(buf[:n])
			if err != nil {
				continue
			}
			l.mu.Lock()
			if ch := l.waiting[m.TransactionID]; ch != nil {
				select {
				case ch <- m:
				default:
				}
			}
			l.mu.Unlock()
		}
	}()
	return l
}

// dora returns the address ACKed to hw, or false if any answer did not
// come within two seconds.
func (l *loadRelay) dora(hw net.HardwareAddr) (string, bool) {
	giaddr := dhcpv4.WithRelay(net.ParseIP(clientAddr))
	disc, err := dhcpv4.NewDiscovery(hw, giaddr)
	if err != nil {
		return "", false
	}
	offer := l.exchange(disc)
	if offer == nil || offer.MessageType() != dhcpv4.MessageTypeOffer {
		return "", false
	}
	req, err := dhcpv4.NewRequestFromOffer(offer, giaddr)
	if err != nil {
		return "", false
	}
	ack := l.exchange(req)
	if ack == nil || ack.MessageType() != dhcpv4.MessageTypeAck {
		return "", false
	}
	return ack.YourIPAddr.String(), true
}

func (l *loadRelay) exchange(m *dhcpv4.DHCPv4) *dhcpv4.DHCPv4 {
	ch := make(chan *dhcpv4.DHCPv4, 1)
	l.mu.Lock()
	l.waiting[m.TransactionID] = ch
	l.mu.Unlock()
	defer func() {
		l.mu.Lock()
		delete(l.waiting, m.TransactionID)
		l.mu.Unlock()
	}()
	if _, err := l.conn.WriteToUDP(m.ToBytes(), &net.UDPAddr{IP: net.ParseIP(serverAddr), Port: dhcpv4.ServerPort}); err != nil {
		return nil
	}
	select {
	case reply := <-ch:
		return reply
	case <-time.After(2 * time.Second):
		return nil
	}
}
