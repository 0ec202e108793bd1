package bootstrap

import (
	"testing"
	"time"
)

func TestEtcdGate(t *testing.T) {
	machines, cps := []string{"cp1", "cp2", "w1", "w2"}, []string{"cp1", "cp2"}
	for _, tc := range []struct {
		name  string
		steps func(g *etcdGate)
		open  bool // wait returns true
		stuck bool // wait must still block
	}{
		{"nothing yet", func(g *etcdGate) {}, false, true},
		{"control planes installed, a worker has not taken its config", func(g *etcdGate) {
			g.installed("cp1")
			g.installed("cp2")
			g.appliedConfig("w1")
		}, false, true},
		{"every config taken, a control plane still installing", func(g *etcdGate) {
			g.installed("cp1")
			for _, m := range []string{"cp2", "w1", "w2"} {
				g.appliedConfig(m)
			}
		}, false, true},
		{"every config taken, control planes installed, workers installing", func(g *etcdGate) {
			g.installed("cp1")
			g.installed("cp2")
			g.appliedConfig("w1")
			g.appliedConfig("w2")
		}, true, false},
		{"marks repeated are counted once", func(g *etcdGate) {
			g.installed("cp1")
			g.installed("cp1")
			g.appliedConfig("cp1")
			g.appliedConfig("w1")
			g.appliedConfig("w1")
			g.appliedConfig("w2")
		}, false, true},
		{"a worker failed before its config", func(g *etcdGate) {
			g.installed("cp1")
			g.installed("cp2")
			g.appliedConfig("w1")
			g.failed("w2")
		}, false, false},
		{"a failure after the rest completed", func(g *etcdGate) {
			g.installed("cp1")
			g.installed("cp2")
			g.appliedConfig("w1")
			g.installed("w2")
			g.failed("w1")
		}, false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := newEtcdGate(machines, cps)
			tc.steps(g)
			got := make(chan bool, 1)
			go func() { got <- g.wait() }()
			if tc.stuck {
				select {
				case v := <-got:
					t.Fatalf("wait returned %v; want it to block", v)
				case <-time.After(50 * time.Millisecond):
				}
				return
			}
			if v := <-got; v != tc.open {
				t.Errorf("wait = %v, want %v", v, tc.open)
			}
		})
	}
}
