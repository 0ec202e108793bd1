//go:build integration && bench

package bootstrap_test

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/siderolabs/talos/pkg/machinery/gendata"

	"cozy.dev/cozy/internal/testing/cozyctl"
	"cozy.dev/cozy/internal/testing/verdict"
)

// TestBenchTalosUpgrade times `cozyctl upgrade talos` on racks of 3 and
// 6 emulated nodes (three control planes behind a VIP, and three workers
// in the second), per node, while a client reads a Namespace through the
// VIP every 100 ms, each on a new connection, with a 1 s timeout. Goal:
// no failed request with three control planes. No peer runs: talosctl, which upgrades one node per
// call, cannot be built here (its module has replace directives, which
// `go install` refuses). Run with `make bench`.
func TestBenchTalosUpgrade(t *testing.T) {
	cozyctl.Path(t)
	type result struct {
		nodes              int
		took               time.Duration
		failures, requests int
		errs               []string
	}
	measure := func(workers int) result {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
		defer cancel()
		r, rc := haRack(ctx, t, 3, workers)
		rackYAML, err := os.ReadFile(r.rackFile)
		if err != nil {
			t.Fatal(err)
		}
		to := nextPatch(t, strings.TrimSpace(gendata.VersionTag))
		if err := os.WriteFile(r.rackFile, append(slices.Clone(rackYAML), []byte("talos: {version: "+to+"}\n")...), 0o644); err != nil {
			t.Fatal(err)
		}
		api := sampleAPI(t, rc)
		time.Sleep(3 * time.Second) // a baseline before the first node goes
		start := time.Now()
		cmd := r.ns.Command(ctx, cozyctl.Path(t), "upgrade", "talos", "--rack", r.rackFile, "--state-dir", r.stateDir, "--timeout", "5m")
		out, err := cmd.CombinedOutput()
		took := time.Since(start)
		failures, requests := api.stop()
		if err != nil {
			t.Fatalf("upgrade: %v\n%s", err, tail(string(out), 30))
		}
		return result{nodes: 3 + workers, took: took, failures: failures, requests: requests, errs: api.errs}
	}
	runs := []result{measure(0), measure(3)}
	var b strings.Builder
	fmt.Fprintf(&b, "\n%-8s %10s %10s %22s\n", "nodes", "total", "per node", "API requests failed")
	for _, r := range runs {
		fmt.Fprintf(&b, "%-8d %10s %10s %14d of %5d\n", r.nodes, r.took.Round(100*time.Millisecond),
			(r.took / time.Duration(r.nodes)).Round(100*time.Millisecond), r.failures, r.requests)
		for _, e := range r.errs {
			fmt.Fprintf(&b, "    %s\n", e)
		}
	}
	t.Log(b.String())
	for _, r := range runs {
		verdict.AtMost(fmt.Sprintf("rolling Talos upgrade of %d nodes: failed API requests through the VIP (100 ms polls)", r.nodes), float64(r.failures), 0, "%.0f")
	}
}
