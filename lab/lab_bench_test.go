//go:build integration && lab && bench

package lab_test

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"strings"
	"testing"
	"time"

	"cozy.dev/cozy/lab"
)

// TestBenchLab is the lab's part of `make bench`: `cozyctl lab up` of 3
// and then 6 nodes (mixed firmware, one control plane), each torn down
// before the next, printing the wall time of each step and bootstrap
// milestone side by side and the 6/3 ratio. Goals (issue 5): under TCG 3
// nodes in ≤ 180 s and 6 in ≤ 1.5× that; with KVM 3 nodes in ≤ 60 s.
// COZY_BENCH_ACCEL=kvm|tcg|auto picks the accelerator (default auto).
func TestBenchLab(t *testing.T) {
	requireLab(t)
	accel := os.Getenv("COZY_BENCH_ACCEL")
	if accel == "" {
		accel = "auto"
	}
	var results []*lab.Result
	for i, nodes := range []int{3, 6} {
		c := lab.Config{Name: fmt.Sprintf("lb%d%d", os.Getpid()%10000, i), Nodes: nodes, ControlPlanes: 1,
			Firmware: lab.FirmwareMixed, Accel: accel, Dir: t.TempDir()}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
		res, down := upLab(ctx, t, &c)
		cancel()
		down()
		results = append(results, res)
	}
	small, big := results[0], results[1]
	var b strings.Builder
	fmt.Fprintf(&b, "lab up, %s, wall time (milestones: when the last machine got there):\n", small.Accel)
	fmt.Fprintf(&b, "  %-34s %10s %10s %7s\n", "", "3 nodes", "6 nodes", "6/3")
	row := func(name string, a, c time.Duration) {
		fmt.Fprintf(&b, "  %-34s %10s %10s %6.2fx\n", name, a.Round(100*time.Millisecond), c.Round(100*time.Millisecond), c.Seconds()/a.Seconds())
	}
	for i, p := range small.Phases {
		if i < len(big.Phases) && big.Phases[i].Phase == p.Phase && p.Took > time.Second {
			row(p.Phase, p.Took, big.Phases[i].Took)
		}
	}
	for _, m := range small.Milestones {
		for _, n := range big.Milestones {
			if n.Name == m.Name {
				row("  "+m.Name, m.At, n.At)
			}
		}
	}
	row("total", small.Total, big.Total)
	// What the VMs cost: under TCG the lab is CPU-bound, so this, not
	// waiting, is what grows with the node count.
	cpu := func(r *lab.Result) (all, per time.Duration) {
		for _, v := range r.VMCPU {
			all += v.CPU
		}
		if len(r.VMCPU) > 0 {
			per = all / time.Duration(len(r.VMCPU))
		}
		return all, per
	}
	smallAll, smallPer := cpu(small)
	bigAll, bigPer := cpu(big)
	row("CPU of all VMs", smallAll, bigAll)
	row("CPU per VM", smallPer, bigPer)
	for _, r := range results {
		for _, v := range r.VMCPU {
			fmt.Fprintf(&b, "  %d nodes: %-4s %-12s %-5s CPU %s\n", r.Nodes, v.Machine, v.Role, v.Firmware, v.CPU.Round(100*time.Millisecond))
		}
	}
	goal := 180 * time.Second
	if small.Accel == "kvm" {
		goal = 60 * time.Second
	}
	fmt.Fprintf(&b, "goals: 3 nodes ≤ %s (%s: %s), 6 nodes ≤ 1.5× 3 nodes (%.2fx)\n",
		goal, small.Accel, small.Total.Round(time.Second), big.Total.Seconds()/small.Total.Seconds())
	t.Log("\n" + b.String())
}

// TestBenchLabNodes is the real-node part of `make bench`: `cozyctl lab
// up` with the node services on, of 2 and then 3 VMs (mixed firmware, one
// control plane), each to every Node Ready and CoreDNS available, printing
// when each got there and each VM's CPU time. Goal (issue 17): 3 nodes in
// ≤ 300 s under TCG on 2 cores, and the time beyond the VMs' own CPU time
// divided by the cores ≤ 20 % of the wall time. Peer: Talos's documented
// boot-to-Ready of its own local clusters, quoted in docs/lab.md#measured
// (talosctl is not built here, and its QEMU provisioner needs KVM). Two
// VMs pass `make e2e` here, so their failure fails the benchmark; three
// are expected to miss under TCG, which the verdict says.
func TestBenchLabNodes(t *testing.T) {
	requireLab(t)
	accel := os.Getenv("COZY_BENCH_ACCEL")
	if accel == "" {
		accel = "auto"
	}
	const wait = 15 * time.Minute // for Ready Nodes and CoreDNS, after the bootstrap
	type run struct {
		nodes int
		res   *lab.Result
		err   error
	}
	var runs []run
	for i, nodes := range []int{2, 3} {
		c := lab.Config{Name: fmt.Sprintf("lr%d%d", os.Getpid()%10000, i), Nodes: nodes, ControlPlanes: 1,
			Firmware: lab.FirmwareMixed, Accel: accel, NodeServices: lab.NodeServicesOn, Dir: t.TempDir()}
		ctx, cancel := context.WithTimeout(context.Background(), 40*time.Minute)
		res, down, err := tryUpLab(ctx, t, &c, wait)
		cancel()
		down()
		if res == nil {
			t.Fatalf("%d nodes: %v", nodes, err)
		}
		if err != nil && nodes == 2 {
			t.Errorf("2 nodes: %v", err) // make e2e shows these pass
		}
		runs = append(runs, run{nodes, res, err})
	}
	cores := runtime.NumCPU()
	var b strings.Builder
	fmt.Fprintf(&b, "lab up with the node services on, %s, %d cores (times from lab up's start):\n", runs[0].res.Accel, cores)
	fmt.Fprintf(&b, "  %-40s %12s %12s\n", "", "2 nodes", "3 nodes")
	at := func(r run, name string) (time.Duration, bool) {
		for _, m := range r.res.Milestones {
			if m.Name == name {
				return m.At, true
			}
		}
		return 0, false
	}
	cell := func(d time.Duration, ok bool) string {
		if !ok {
			return fmt.Sprintf("not in %s", wait)
		}
		return d.Round(time.Second).String()
	}
	for _, name := range []string{"the API answers", "all nodes Ready", "CoreDNS available"} {
		a, aok := at(runs[0], name)
		c, cok := at(runs[1], name)
		fmt.Fprintf(&b, "  %-40s %12s %12s\n", name, cell(a, aok), cell(c, cok))
	}
	// Under TCG the VMs are CPU-bound: the wall time is their CPU time
	// spread over the host's cores, and what is left over is waiting
	// (the lab's own steps, timers, a core left idle).
	beyond := make([]float64, len(runs))
	row := func(name string, f func(i int, r run) string) {
		fmt.Fprintf(&b, "  %-40s %12s %12s\n", name, f(0, runs[0]), f(1, runs[1]))
	}
	row("lab up in all", func(_ int, r run) string { return r.res.Total.Round(time.Second).String() })
	row("CPU of all VMs", func(i int, r run) string {
		var all time.Duration
		for _, v := range r.res.VMCPU {
			all += v.CPU
		}
		spread := all / time.Duration(cores)
		beyond[i] = (r.res.Total - spread).Seconds() / r.res.Total.Seconds()
		return all.Round(time.Second).String()
	})
	row("time beyond the VMs' CPU / cores", func(i int, _ run) string { return fmt.Sprintf("%.0f %%", 100*beyond[i]) })
	for _, r := range runs {
		for _, v := range r.res.VMCPU {
			fmt.Fprintf(&b, "  %d nodes: %-4s %-12s %-5s CPU %s\n", r.nodes, v.Machine, v.Role, v.Firmware, v.CPU.Round(time.Second))
		}
	}
	three := runs[1]
	dns, ok := at(three, "CoreDNS available")
	verdict := "PASS"
	switch {
	case !ok:
		verdict = fmt.Sprintf("MISS (CoreDNS not available within %s of the bootstrap: %v)", wait, three.err)
	case dns > 300*time.Second || beyond[1] > 0.2:
		verdict = fmt.Sprintf("MISS (%s, %.0f %% beyond the VMs' CPU)", dns.Round(time.Second), 100*beyond[1])
	}
	fmt.Fprintf(&b, "goal: 3 nodes to every Node Ready and CoreDNS available ≤ 300 s, time beyond the VMs' CPU / cores ≤ 20 %%\n")
	fmt.Fprintf(&b, "peer: Talos's own local clusters, from its docs (docs/lab.md#measured); its QEMU provisioner needs KVM\n")
	fmt.Fprintf(&b, "verdict: %s\n", verdict)
	t.Log("\n" + b.String())
}
