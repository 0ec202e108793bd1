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
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/insomniacslk/dhcp/dhcpv4"

	"cozy.dev/cozy/internal/netns"
	"cozy.dev/cozy/internal/testing/cozyctl"
	"cozy.dev/cozy/internal/testing/verdict"
	"cozy.dev/cozy/lab"
)

// TestBenchLabBMC is the BMCs' part of `make bench`: a lab of 20 VMs
// standing powered off (lab up --no-bootstrap), driven through their
// Redfish BMCs with `cozyctl machine` as a user would, inside the lab's
// namespace. No DHCP server answers, so each VM's firmware keeps
// broadcasting DISCOVERs, which the bench listens for on the bridge.
//
//   - One VM at a time (cp1 BIOS, w1 UEFI): the BMC commands (one-time
//     network boot, power on: until QEMU runs, its disk made on this
//     first start), then QEMU running → the first DHCP DISCOVER: the
//     firmware's time, reported without a goal.
//   - All 20 at once: the same commands with --all, and power status.
//     Goal (issue 21): driving 20 BMCs at once ≤ 1.5× one, for what is
//     the BMCs' own work (boot override, power status). Power on starts
//     20 QEMU processes, CPU-bound on this host's cores, and the time
//     until all 20 DISCOVERs is the firmware's CPU: both are reported,
//     without a goal.
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
	bin := cozyctl.Path(t)
	machine := func(args ...string) time.Duration {
		t.Helper()
		start := time.Now()
		cmd := exec.CommandContext(ctx, "ip", append([]string{"netns", "exec", lab.Namespace(c.Name), bin, "machine"},
			append(args, "--rack", filepath.Join(c.Dir, lab.RackFile))...)...)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("cozyctl machine %v: %v\n%s", args, err, out)
		}
		return time.Since(start)
	}
	machines := c.Machines()
	// Every VM is off: nothing but the BMCs and cozyctl use the CPU. The
	// median of five runs for one BMC, of three for all.
	median := func(runs int, args ...string) time.Duration {
		var ds []time.Duration
		for range runs {
			ds = append(ds, machine(args...))
		}
		slices.Sort(ds)
		return ds[len(ds)/2]
	}
	one := op{status: median(5, "power", "status", "cp1"), boot: median(5, "boot", "pxe", "--once", "cp1")}
	all := op{status: median(3, "power", "status", "--all", "--parallel", "20"), boot: median(3, "boot", "pxe", "--once", "--all", "--parallel", "20")}

	var b strings.Builder
	fmt.Fprintf(&b, "BMCs, lab of %d VMs, %s, %d cores, each VM %d MiB:\n", c.Nodes, res.Accel, runtime.NumCPU(), c.MemoryMiB)
	fmt.Fprintf(&b, "  %-4s %-5s %16s %14s %24s %22s\n", "VM", "fw", "boot pxe --once", "power on", "QEMU running → DISCOVER", "power-on → DISCOVER")
	for _, m := range machines[:2] {
		started := time.Now()
		boot, on := machine("boot", "pxe", "--once", m.Name), machine("power", "on", m.Name)
		running := time.Now()
		at, err := seen.wait(ctx, m.MACText, 5*time.Minute)
		if err != nil {
			t.Fatalf("%s: %v", m.Name, err)
		}
		fmt.Fprintf(&b, "  %-4s %-5s %16s %14s %24s %22s\n", m.Name, m.Firmware, boot.Round(time.Millisecond), on.Round(time.Millisecond),
			at.Sub(running).Round(10*time.Millisecond), at.Sub(started).Round(10*time.Millisecond))
		one.on = max(one.on, on)
		machine("power", "off", m.Name)
	}
	seen.reset()
	started := time.Now()
	machine("boot", "pxe", "--once", "--all", "--parallel", "20")
	all.on = machine("power", "on", "--all", "--parallel", "20")
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
	off := machine("power", "off", "--all", "--parallel", "20")
	ratio := func(a, o time.Duration) string {
		return fmt.Sprintf("%s (%.2fx one's %s)", a.Round(time.Millisecond), a.Seconds()/o.Seconds(), o.Round(time.Millisecond))
	}
	fmt.Fprintf(&b, "  all %d at once, VMs off (medians): power status %s, boot pxe --once %s\n", c.Nodes, ratio(all.status, one.status), ratio(all.boot, one.boot))
	fmt.Fprintf(&b, "  all %d at once: power on %s; last DISCOVER %s after the boot override; power off %s\n",
		c.Nodes, ratio(all.on, one.on), last.Sub(started).Round(100*time.Millisecond), off.Round(time.Millisecond))
	fmt.Fprintf(&b, "  (power on starts %d QEMU processes, CPU-bound on %d cores, and the DISCOVERs wait for %d firmwares: reported, not goals of the BMCs')\n",
		c.Nodes, runtime.NumCPU(), c.Nodes)
	t.Log("\n" + b.String())
	for _, g := range []struct {
		name     string
		all, one time.Duration
	}{{"boot pxe --once", all.boot, one.boot}, {"power status", all.status, one.status}} {
		verdict.AtMost(fmt.Sprintf("machine %s: %d BMCs at once / one", g.name, c.Nodes), g.all.Seconds()/g.one.Seconds(), 1.5, "%.2fx")
	}
}

// op is how long each `cozyctl machine` command took.
type op struct{ boot, on, status time.Duration }

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
