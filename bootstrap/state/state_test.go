package state

import (
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestRoundTrip(t *testing.T) {
	dir := t.TempDir()
	st, err := Open(dir, "lab")
	if err != nil {
		t.Fatal(err)
	}
	err = st.Update(func(s *State) {
		s.Nodes["cp1"] = &Node{Hostname: "cp1", Role: "controlplane", IP: netip.MustParseAddr("10.0.0.11"), Phase: Applied}
		s.EtcdBootstrapped = "cp1"
	})
	if err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(filepath.Join(dir, File))
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("state file: %v, mode %v", err, fi.Mode().Perm())
	}
	again, err := Open(dir, "lab")
	if err != nil {
		t.Fatal(err)
	}
	n := again.Node("cp1")
	if n.Phase != Applied || n.IP.String() != "10.0.0.11" || again.Snapshot().EtcdBootstrapped != "cp1" {
		t.Errorf("reloaded %+v", again.Snapshot())
	}
	if _, err := Open(dir, "other"); err == nil || !strings.Contains(err.Error(), `belongs to cluster "lab"`) {
		t.Errorf("other cluster: %v", err)
	}
	if err := os.WriteFile(filepath.Join(dir, File), []byte("{"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Open(dir, "lab"); err == nil || !strings.Contains(err.Error(), "damaged") {
		t.Errorf("damaged file: %v", err)
	}
}

func TestPhaseOrder(t *testing.T) {
	tests := []struct {
		p, q Phase
		want bool
	}{
		{Configured, Applied, true},
		{Applied, Configured, false},
		{Ready, Pending, true},
		{"", Discovered, false},
		{Bootstrap, Configured, true},
	}
	for _, tt := range tests {
		if got := tt.p.AtLeast(tt.q); got != tt.want {
			t.Errorf("%q.AtLeast(%q) = %v", tt.p, tt.q, got)
		}
	}
}

// TestRead: what lab status reads: nothing yet, the saved nodes, or an
// error that names the damaged file (not an empty state).
func TestRead(t *testing.T) {
	dir := t.TempDir()
	if s, err := Read(dir); err != nil || len(s.Nodes) != 0 || s.Cluster != "" {
		t.Errorf("no state yet: %+v, %v", s, err)
	}
	st, err := Open(dir, "lab")
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Update(func(s *State) { s.Nodes["cp1"] = &Node{Hostname: "cp1", Phase: Ready} }); err != nil {
		t.Fatal(err)
	}
	if s, err := Read(dir); err != nil || s.Cluster != "lab" || s.Nodes["cp1"].Phase != Ready {
		t.Errorf("saved state: %+v, %v", s, err)
	}
	if err := os.WriteFile(filepath.Join(dir, File), []byte("{"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Read(dir); err == nil || !strings.Contains(err.Error(), filepath.Join(dir, File)+" is damaged") {
		t.Errorf("damaged file: %v", err)
	}
}
