//go:build integration && lab && bench

package lab_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/insomniacslk/dhcp/dhcpv4"

	"cozy.dev/cozy/internal/netns"
	"cozy.dev/cozy/lab"
)

// TestBenchLabBMC is the BMCs' part of `make bench`: a lab of 20 VMs
// standing powered off (lab up --no-bootstrap), driven through their
// Redfish BMCs with `cozyctl machine` as a user would, inside the lab's
// namespace. No DHCP server answers, so each VM's firmware keeps
// broadcasting DISCOVERs, which the bench listens for on the bridge.
//
//   - One VM at a time (cp1 BIOS, w1 UEFI): the BMC commands (one-time
//     network boot, power on: until QEMU runs), then QEMU running → the
//     first DHCP DISCOVER. Goal: the BMC's part ≤ 10 % of power-on →
//     DISCOVER.
//   - All 20 at once: the same two commands with --all. Goal (issue 21):
//     ≤ 1.5× the time for one. The time until all 20 DISCOVERs is
//     reported: under TCG it is the firmware's CPU on this host's cores,
//     not the BMCs'.
func TestBenchLabBMC(t *testing.T) {
	requireLab(t)
	c := lab.Config{Name: fmt.Sprintf("lp%d", os.Getpid()%10000), Nodes: 20, ControlPlanes: 1,
		Firmware: lab.FirmwareMixed, Accel: benchAccel(), MemoryMiB: 512, Dir: t.TempDir()}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	res, _, err := tryUpLab(ctx, t, &c, upOptions{noBootstrap: true})
	if err != nil {
		t.Fatal(err)
	}
	seen := listenDiscovers(t, lab.Namespace(c.Name))
	self, _ := os.Executable()
	machine := func(args ...string) time.Duration {
		t.Helper()
		start := time.Now()
		cmd := exec.CommandContext(ctx, "ip", append([]string{"netns", "exec", lab.Namespace(c.Name), self, "machine"},
			append(args, "--rack", filepath.Join(c.Dir, lab.RackFile))...)...)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("cozyctl machine %v: %v\n%s", args, err, out)
		}
		return time.Since(start)
	}
	powerOn := func(names ...string) time.Duration {
		return machine(append([]string{"boot", "pxe", "--once"}, names...)...) + machine(append([]string{"power", "on"}, names...)...)
	}

	var b strings.Builder
	fmt.Fprintf(&b, "BMCs, lab of %d VMs, %s, %d cores, each VM %d MiB:\n", c.Nodes, res.Accel, runtime.NumCPU(), c.MemoryMiB)
	fmt.Fprintf(&b, "  %-4s %-5s %28s %24s %8s\n", "VM", "fw", "BMC: boot once + power on", "QEMU running → DISCOVER", "BMC part")
	machines := c.Machines()
	var one time.Duration
	worst := 0.0
	for _, m := range machines[:2] {
		started := time.Now()
		bmcTime := powerOn(m.Name)
		running := time.Now()
		at, err := seen.wait(ctx, m.MACText, 5*time.Minute)
		if err != nil {
			t.Fatalf("%s: %v", m.Name, err)
		}
		share := bmcTime.Seconds() / at.Sub(started).Seconds()
		worst = max(worst, share)
		fmt.Fprintf(&b, "  %-4s %-5s %28s %24s %7.1f%%\n", m.Name, m.Firmware, bmcTime.Round(time.Millisecond), at.Sub(running).Round(10*time.Millisecond), 100*share)
		one = max(one, bmcTime)
		machine("power", "off", m.Name)
	}
	seen.reset()
	started := time.Now()
	all := powerOn("--all")
	var last time.Time
	for _, m := range machines {
		at, err := seen.wait(ctx, m.MACText, 10*time.Minute)
		if err != nil {
			t.Fatalf("%s: %v", m.Name, err)
		}
		if at.After(last) {
			last = at
		}
	}
	off := machine("power", "off", "--all")
	fmt.Fprintf(&b, "  all %d at once: BMC commands %s (%.2fx one), last DISCOVER %s after, power off %s\n",
		c.Nodes, all.Round(time.Millisecond), all.Seconds()/one.Seconds(), last.Sub(started).Round(100*time.Millisecond), off.Round(time.Millisecond))
	verdict := func(goal string, ok bool, measured string) {
		v := "PASS"
		if !ok {
			v = "MISS: " + measured
		}
		fmt.Fprintf(&b, "  goal %s: %s\n", goal, v)
	}
	verdict("the BMC's part ≤ 10 % of power-on → DISCOVER", worst <= 0.10, fmt.Sprintf("%.1f %%", 100*worst))
	verdict(fmt.Sprintf("%d BMCs at once ≤ 1.5× one", c.Nodes), all.Seconds() <= 1.5*one.Seconds(), fmt.Sprintf("%.2fx", all.Seconds()/one.Seconds()))
	t.Log("\n" + b.String())
}

// discovers records when each MAC first broadcast a DHCP DISCOVER.
type discovers struct {
	mu    sync.Mutex
	first map[string]time.Time
}

func (d *discovers) reset() {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.first = map[string]time.Time{}
}

func (d *discovers) wait(ctx context.Context, mac string, timeout time.Duration) (time.Time, error) {
	deadline := time.Now().Add(timeout)
	for {
		d.mu.Lock()
		at, ok := d.first[mac]
		d.mu.Unlock()
		if ok {
			return at, nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return time.Time{}, fmt.Errorf("no DHCP DISCOVER from %s within %s", mac, timeout)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// listenDiscovers listens on the DHCP server port inside the lab's
// namespace (where no DHCP server runs: the lab stands unbootstrapped).
func listenDiscovers(t *testing.T, ns string) *discovers {
	t.Helper()
	var conn net.PacketConn
	if err := netns.Do(ns, func() (err error) { conn, err = net.ListenPacket("udp4", "0.0.0.0:67"); return err }); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	d := &discovers{first: map[string]time.Time{}}
	go func() {
		buf := make([]byte, 1500)
		for {
			n, _, err := conn.ReadFrom(buf)
			if errors.Is(err, net.ErrClosed) {
				return
			}
			if err != nil {
				continue
			}
			now := time.Now()
			p, err := dhcpv4.FromBytes(buf[:n])
			if err != nil || p.MessageType() != dhcpv4.MessageTypeDiscover {
				continue
			}
			d.mu.Lock()
			if _, ok := d.first[p.ClientHWAddr.String()]; !ok {
				d.first[p.ClientHWAddr.String()] = now
			}
			d.mu.Unlock()
		}
	}()
	return d
}
