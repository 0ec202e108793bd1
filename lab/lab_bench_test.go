//go:build integration && lab && bench

package lab_test

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"cozy.dev/cozy/internal/testing/verdict"
	"cozy.dev/cozy/lab"
)

// TestBenchLab is the lab's part of `make bench`: `cozyctl lab up` of 3
// nodes three times and then of 6 (mixed firmware, one control plane,
// API-only under TCG), each torn down before the next, printing the wall
// time of each step and bootstrap milestone side by side, the spread of
// the 3-node time, and how much of each run's wall time went beyond its
// VMs' own CPU time spread over the host's cores. Goals: 3 nodes in
// ≤ 180 s under TCG (≤ 60 s with KVM, issue 5), and at 3 and 6 nodes
// ≤ 20 % of the wall time beyond the VMs' CPU time / cores (issue 23:
// on 2 cores the VMs are CPU-bound, so the time the lab itself controls
// is what it spends waiting, not how the wall time grows with nodes).
// COZY_BENCH_ACCEL=kvm|tcg|auto picks the accelerator (default auto).
func TestBenchLab(t *testing.T) {
	requireLab(t)
	accel := benchAccel()
	var results []*lab.Result
	for i, nodes := range []int{3, 3, 3, 6} {
		c := lab.Config{Name: fmt.Sprintf("lb%d%d", os.Getpid()%10000, i), Nodes: nodes, ControlPlanes: 1,
			Firmware: lab.FirmwareMixed, Accel: accel, Dir: t.TempDir()}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
		res, down := upLab(ctx, t, &c)
		cancel()
		down()
		results = append(results, res)
	}
	small, big := results[0], results[3]
	var b strings.Builder
	fmt.Fprintf(&b, "lab up, %s, %d cores, wall time (milestones: when the last machine got there):\n", small.Accel, runtime.NumCPU())
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
	row("CPU of all VMs", vmCPU(small), vmCPU(big))
	writeVMCPU(&b, 100*time.Millisecond, small, big)
	var totals []time.Duration
	worst := 0.0
	for i, r := range results {
		if r.Nodes == 3 {
			totals = append(totals, r.Total)
		}
		share := beyondCPU(r)
		worst = max(worst, share)
		fmt.Fprintf(&b, "  run %d, %d nodes: %s in all, CPU of all VMs %s, %.0f %% of the wall time beyond the VMs' CPU / cores\n",
			i+1, r.Nodes, r.Total.Round(100*time.Millisecond), vmCPU(r).Round(time.Second), 100*share)
	}
	slices.Sort(totals)
	median := totals[len(totals)/2]
	fmt.Fprintf(&b, "  3 nodes over %d runs: median %s, min %s, max %s\n", len(totals),
		median.Round(100*time.Millisecond), totals[0].Round(100*time.Millisecond), totals[len(totals)-1].Round(100*time.Millisecond))
	goal := 180 * time.Second
	if small.Accel == "kvm" {
		goal = 60 * time.Second
	}
	t.Log("\n" + b.String())
	verdict.AtMost(fmt.Sprintf("lab up, 3 API-only nodes (%s, median of 3 runs), s", small.Accel), median.Seconds(), goal.Seconds(), "%.0f")
	verdict.AtMost("lab up at 3 and 6 nodes: wall time beyond the VMs' CPU / cores, worst run, %", 100*worst, 20, "%.0f")
}

// benchAccel is the accelerator the lab benches use:
// COZY_BENCH_ACCEL=kvm|tcg|auto (default auto).
func benchAccel() string {
	if a := os.Getenv("COZY_BENCH_ACCEL"); a != "" {
		return a
	}
	return "auto"
}

// writeVMCPU writes each VM's CPU time in the labs rs, rounded.
func writeVMCPU(b *strings.Builder, round time.Duration, rs ...*lab.Result) {
	for _, r := range rs {
		for _, v := range r.VMCPU {
			fmt.Fprintf(b, "  %d nodes: %-4s %-12s %-5s CPU %s\n", r.Nodes, v.Machine, v.Role, v.Firmware, v.CPU.Round(round))
		}
	}
}

// vmCPU is the CPU time all of a lab's VMs used during lab up.
func vmCPU(r *lab.Result) time.Duration {
	var all time.Duration
	for _, v := range r.VMCPU {
		all += v.CPU
	}
	return all
}

// beyondCPU is the share of lab up's wall time beyond its VMs' CPU time
// spread over the host's cores: under TCG the VMs are CPU-bound, so this
// is the time the lab spends waiting (its own steps, timers, a core left
// idle), the part of the wall time the lab itself controls.
func beyondCPU(r *lab.Result) float64 {
	spread := vmCPU(r) / time.Duration(runtime.NumCPU())
	return (r.Total - spread).Seconds() / r.Total.Seconds()
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
	accel := benchAccel()
	const wait = 15 * time.Minute // for Ready Nodes and CoreDNS, after the bootstrap
	type run struct {
		res *lab.Result
		err error
	}
	var runs []run
	for i, nodes := range []int{2, 3} {
		c := lab.Config{Name: fmt.Sprintf("lr%d%d", os.Getpid()%10000, i), Nodes: nodes, ControlPlanes: 1,
			Firmware: lab.FirmwareMixed, Accel: accel, NodeServices: lab.NodeServicesOn, Dir: t.TempDir()}
		ctx, cancel := context.WithTimeout(context.Background(), 40*time.Minute)
		res, down, err := tryUpLab(ctx, t, &c, upOptions{nodesWait: wait})
		cancel()
		down()
		if res == nil {
			t.Fatalf("%d nodes: %v", nodes, err)
		}
		if err != nil && nodes == 2 {
			t.Errorf("2 nodes: %v", err) // make e2e shows these pass
		}
		runs = append(runs, run{res, err})
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
	row := func(name string, f func(r *lab.Result) string) {
		fmt.Fprintf(&b, "  %-40s %12s %12s\n", name, f(runs[0].res), f(runs[1].res))
	}
	row("lab up in all", func(r *lab.Result) string { return r.Total.Round(time.Second).String() })
	row("CPU of all VMs", func(r *lab.Result) string { return vmCPU(r).Round(time.Second).String() })
	row("time beyond the VMs' CPU / cores", func(r *lab.Result) string { return fmt.Sprintf("%.0f %%", 100*beyondCPU(r)) })
	writeVMCPU(&b, time.Second, runs[0].res, runs[1].res)
	three := runs[1]
	dns, ok := at(three, "CoreDNS available")
	fmt.Fprintf(&b, "peer: Talos's own local clusters, from its docs (docs/lab.md#measured); its QEMU provisioner needs KVM\n")
	t.Log("\n" + b.String())
	measured := fmt.Sprintf("not within %s (%v)", wait, three.err)
	if ok {
		measured = fmt.Sprintf("%.0f", dns.Seconds())
	}
	verdict.Report("lab up --node-services on, 3 nodes: every Node Ready and CoreDNS available, s", measured, "≤ 300", ok && dns <= 300*time.Second)
	verdict.AtMost("lab up --node-services on, 3 nodes: wall time beyond the VMs' CPU / cores, %", 100*beyondCPU(three.res), 20, "%.0f")
}
