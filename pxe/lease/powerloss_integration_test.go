//go:build integration

package lease

import (
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"cozy.dev/cozy/internal/powercut"
)

// TestGrantsAndCompactionSurvivePowerLoss keeps the journal on a disk that
// loses what was not flushed (internal/powercut) while four granters add
// leases and a fifth compacts the journal over and over, cuts the power at
// 24 random moments, and checks each disk a cut leaves: every lease whose
// Sync had returned is there, no address is leased twice, and no
// temporary file outlives the reopen.
func TestGrantsAndCompactionSurvivePowerLoss(t *testing.T) {
	disk := powercut.New(t)
	rng := disk.Rand()
	dir := filepath.Join(disk.Dir, "state")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	s, err := Open(dir, mustPool(t, "10.8.0.1-10.8.255.254"), nil, nil)
	if err != nil {
		t.Fatal(err)
	}

	var mu sync.Mutex
	granted := map[string]string{}
	var next atomic.Int64
	var compactions atomic.Int64
	stop := make(chan struct{})
	errs := make(chan error, 5)
	var workers sync.WaitGroup
	for w := range 4 {
		workers.Go(func() {
			// Until stopped, or until most of the pool is gone (quick
			// without fdatasync: a test that must fail then).
			for next.Load() < 50000 {
				select {
				case <-stop:
					return
				default:
				}
				batch, err := grantBatch(s, w, &next)
				if err != nil {
					errs <- err
					return
				}
				mu.Lock()
				for _, line := range batch {
					mac, addr, _ := strings.Cut(line, " ")
					granted[mac] = addr
				}
				mu.Unlock()
			}
		})
	}
	workers.Go(func() {
		for {
			select {
			case <-stop:
				return
			default:
			}
			if _, err := s.Compact(); err != nil {
				errs <- err
				return
			}
			compactions.Add(1)
		}
	})

	type cut struct {
		img     powercut.Image
		granted map[string]string
	}
	var cuts []cut
	for range 24 {
		time.Sleep(time.Duration(5+rng.IntN(35)) * time.Millisecond)
		mu.Lock()
		before := maps.Clone(granted) // durable before the cut starts
		mu.Unlock()
		cuts = append(cuts, cut{disk.Cut(t), before})
	}
	close(stop)
	workers.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	s.Close()
	if compactions.Load() == 0 {
		t.Fatal("the journal was never compacted")
	}

	unflushed := 0
	for i, c := range cuts {
		unflushed += c.img.Unflushed
		c.img.Mount(t, func(root string) {
			dir := filepath.Join(root, "state")
			reopenChecked(t, fmt.Sprintf("cut %d", i), dir, c.granted).Close()
			if entries, _ := os.ReadDir(dir); len(entries) != 1 {
				t.Errorf("cut %d: files left in the state dir after reopening: %v", i, entries)
			}
		})
	}
	t.Logf("%d cuts amid %d compactions; %d leases granted, each there after every later cut; %d unflushed blocks at the cuts, half of them kept",
		len(cuts), compactions.Load(), len(granted), unflushed)
}
