//go:build integration && bench

package bootstrap_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"cozy.dev/cozy/bootstrap/state"
	"cozy.dev/cozy/internal/testing/cozyctl"
	"cozy.dev/cozy/internal/testing/verdict"
)

// TestBenchBootstrap times `cozyctl bootstrap` from start to a working
// kubeconfig for 3 and 9 emulated machines (one control plane, the rest
// workers), per phase: when the last machine was discovered, applied and
// configured, etcd, and the API answering. The peer is the same run with
// --parallel 1, one machine at a time as the talos-bootstrap script does.
// The 9-machine run should take at most 1.3x the 3-machine one. Run with
// `make bench`. "ready" is bootstrap's own clock (from its start to the
// API answering); "total" adds the test's process start and netboot.
func TestBenchBootstrap(t *testing.T) {
	type result struct {
		name   string
		phases map[state.Phase]time.Duration
		total  time.Duration
	}
	cozyctl.Path(t) // built (or found up to date) before any run's clock starts
	measure := func(name string, workers int, extra ...string) result {
		r := newRackRig(t, 1, workers)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		start := time.Now()
		p := r.bootstrap(extra...)
		defer r.failLogs(p)
		go r.boot(ctx)
		res := result{name: name, phases: map[state.Phase]time.Duration{}}
		for e := range p.events {
			if e.Node != "" && e.Phase != state.Pending {
				res.phases[e.Phase] = max(res.phases[e.Phase], e.Elapsed)
			}
		}
		if err := <-p.done; err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		res.total = time.Since(start)
		return res
	}
	runs := []result{
		measure("3 machines", 2),
		measure("9 machines", 8),
		measure("9 machines, --parallel 1", 8, "--parallel", "1"),
	}
	var b strings.Builder
	fmt.Fprintf(&b, "\n%-26s %11s %9s %11s %6s %7s %8s\n", "run", "discovered", "applied", "configured", "etcd", "ready", "total")
	for _, r := range runs {
		fmt.Fprintf(&b, "%-26s %11s %9s %11s %6s %7s %8s\n", r.name,
			r.phases[state.Discovered].Round(10*time.Millisecond), r.phases[state.Applied].Round(10*time.Millisecond),
			r.phases[state.Configured].Round(10*time.Millisecond), r.phases[state.Bootstrap].Round(10*time.Millisecond),
			r.phases[state.Ready].Round(10*time.Millisecond), r.total.Round(10*time.Millisecond))
	}
	ready := func(i int) float64 { return float64(runs[i].phases[state.Ready]) }
	fmt.Fprintf(&b, "--parallel 1 vs parallel, 9 machines: %.2fx (the peer's way; no goal)\n", ready(2)/ready(1))
	t.Log(b.String())
	verdict.AtMost("bootstrap to a working kubeconfig, 9 vs 3 emulated machines", ready(1)/ready(0), 1.3, "%.2fx")
}
