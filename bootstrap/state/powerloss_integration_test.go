//go:build integration

package state_test

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"cozy.dev/cozy/bootstrap/state"
	"cozy.dev/cozy/bootstrap/talosconfig"
	"cozy.dev/cozy/internal/testing/powercut"
)

// TestStateDirSurvivesPowerLoss keeps a bootstrap state dir on a disk that
// loses what was not flushed (internal/powercut): the secrets bundle is
// made once, then the state file is saved over and over as nodes move on.
// At each of 24 random power cuts the dir comes back whole: the same
// secrets bundle, and a state file that loads, with every node whose
// Update had returned.
func TestStateDirSurvivesPowerLoss(t *testing.T) {
	disk := powercut.New(t)
	dir := filepath.Join(disk.Dir, "state")
	if err := os.MkdirAll(dir, 0o700); err != nil { // as bootstrap.Run makes it
		t.Fatal(err)
	}
	bundle, created, err := talosconfig.LoadOrCreateSecrets(filepath.Join(dir, talosconfig.SecretsFile), nil)
	if err != nil || !created {
		t.Fatalf("secrets: created %v, %v", created, err)
	}
	st, err := state.Open(dir, "rack")
	if err != nil {
		t.Fatal(err)
	}
	cuts := disk.CutWhile(t, 24, func(n int64) error {
		name := fmt.Sprintf("node%04d", n)
		return st.Update(func(s *state.State) {
			s.Nodes[name] = &state.Node{Hostname: name, Role: "worker", Phase: state.Discovered, Since: time.Now()}
		})
	})

	for i, c := range cuts {
		c.Mount(t, func(root string) {
			dir := filepath.Join(root, "state")
			b, created, err := talosconfig.LoadOrCreateSecrets(filepath.Join(dir, talosconfig.SecretsFile), nil)
			switch {
			case err != nil:
				t.Errorf("cut %d: secrets: %v", i, err)
			case created || b.Secrets.BootstrapToken != bundle.Secrets.BootstrapToken:
				t.Errorf("cut %d: the secrets bundle was lost: a new cluster's was made", i)
			}
			st, err := state.Open(dir, "rack")
			if err != nil {
				t.Errorf("cut %d: %v", i, err)
				return
			}
			if n := int64(len(st.Snapshot().Nodes)); n < c.Done || n > c.Started {
				t.Errorf("cut %d: the state has %d nodes; Update had returned for %d and started %d", i, n, c.Done, c.Started)
			}
		})
	}
	t.Logf("%d cuts, the last after %d saves", len(cuts), cuts[len(cuts)-1].Done)
}
