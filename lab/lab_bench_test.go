//go:build integration && lab && bench

package lab_test

import (
	"context"
	"fmt"
	"os"
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
