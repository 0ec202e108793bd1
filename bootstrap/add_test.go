package bootstrap

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"cozy.dev/cozy/bootstrap/rack"
	"cozy.dev/cozy/bootstrap/state"
)

func TestNewMachines(t *testing.T) {
	r := &rack.Rack{Metadata: rack.Metadata{Name: "itest"}, Machines: []rack.Machine{{Hostname: "cp1"}, {Hostname: "w1"}, {Hostname: "w2"}, {Hostname: "w3"}}}
	dir := t.TempDir()
	if _, err := NewMachines(r, dir); err == nil || !strings.Contains(err.Error(), "holds no bootstrapped cluster") {
		t.Fatalf("no state: %v", err)
	}
	st, err := state.Open(dir, "itest")
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Update(func(s *state.State) {
		s.EtcdBootstrapped = "cp1"
		s.Nodes["cp1"] = &state.Node{Hostname: "cp1", Phase: state.Ready}
		s.Nodes["w1"] = &state.Node{Hostname: "w1", Phase: state.Ready}
		s.Nodes["w2"] = &state.Node{Hostname: "w2", Phase: state.Removed}
	}); err != nil {
		t.Fatal(err)
	}
	if got, err := NewMachines(r, dir); err != nil || !slices.Equal(got, []string{"w2", "w3"}) {
		t.Errorf("got %v, %v; want w2 (removed before) and w3 (new)", got, err)
	}
	r.Machines = r.Machines[:2]
	if _, err := NewMachines(r, dir); !errors.Is(err, ErrNothingToAdd) {
		t.Errorf("all in: %v, want ErrNothingToAdd", err)
	}
	other := *r
	other.Metadata.Name = "other"
	if _, err := NewMachines(&other, dir); err == nil || !strings.Contains(err.Error(), `belongs to cluster "itest"`) {
		t.Errorf("another cluster's state dir: %v", err)
	}
}
