//go:build integration

package state_test

import (
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"cozy.dev/cozy/bootstrap/state"
	"cozy.dev/cozy/bootstrap/talosconfig"
	"cozy.dev/cozy/internal/powercut"
)

// TestStateDirSurvivesPowerLoss keeps a bootstrap state dir on a disk that
// loses what was not flushed (internal/powercut): the secrets bundle is
// made once, then the state file is saved over and over as nodes move on.
// At each of 24 random power cuts the dir comes back whole: the same
// secrets bundle, and a state file that loads, with every node whose
// Update had returned.
func TestStateDirSurvivesPowerLoss(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	disk := powercut.New(t, seed)
	rng := rand.New(rand.NewPCG(seed, 5))
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

	var started, saved atomic.Int64
	stop := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		for n := int64(1); ; n++ {
			select {
			case <-stop:
				done <- nil
				return
			default:
			}
			started.Store(n)
			name := fmt.Sprintf("node%04d", n)
			if err := st.Update(func(s *state.State) {
				s.Nodes[name] = &state.Node{Hostname: name, Role: "worker", Phase: state.Discovered, Since: time.Now()}
			}); err != nil {
				done <- err
				return
			}
			saved.Store(n)
		}
	}()
	type cut struct {
		img        powercut.Image
		saved, max int64
	}
	var cuts []cut
	for range 24 {
		time.Sleep(time.Duration(5+rng.IntN(45)) * time.Millisecond)
		n := saved.Load() // read first: saved before the cut starts
		cuts = append(cuts, cut{disk.Cut(t), n, started.Load()})
	}
	close(stop)
	if err := <-done; err != nil {
		t.Fatal(err)
	}

	for i, c := range cuts {
		c.img.Mount(t, func(root string) {
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
			if n := int64(len(st.Snapshot().Nodes)); n < c.saved || n > c.max {
				t.Errorf("cut %d: the state has %d nodes; Update had returned for %d and started %d", i, n, c.saved, c.max)
			}
		})
	}
	t.Logf("%d cuts, last after %d saves", len(cuts), saved.Load())
}
