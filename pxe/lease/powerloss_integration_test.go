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

	"cozy.dev/cozy/internal/testing/powercut"
)

// TestGrantsAndCompactionSurvivePowerLoss keeps the journal on a disk that
// loses what was not flushed (internal/powercut) while four granters add
// leases and a fifth compacts the journal over and over, cuts the power at
// 24 random moments, and checks each disk a cut leaves: every lease whose
// Sync had returned is there, no address is leased twice, and no
// temporary file outlives the reopen.
func TestGrantsAndCompactionSurvivePowerLoss(t *testing.T) {
	problems := grantThroughPowerCuts(t)
	for _, p := range problems {
		t.Error(p)
	}
}

// TestPowerLossTestCatchesAMissingSync: with the journal's fdatasync taken
// away, the same run must find lost leases, or it shows nothing.
func TestPowerLossTestCatchesAMissingSync(t *testing.T) {
	saved := syncData
	syncData = func(*os.File) error { return nil }
	t.Cleanup(func() { syncData = saved })
	if problems := grantThroughPowerCuts(t); len(problems) == 0 {
		t.Fatal("without fdatasync no cut lost a granted lease: the power-loss test cannot tell")
	} else {
		t.Logf("without fdatasync, as it must: %d problems, the first: %s", len(problems), problems[0])
	}
}

// grantThroughPowerCuts runs the granters and the compactor on a power-cut
// disk, cuts the power 24 times, and returns what is wrong with each disk
// a cut left.
func grantThroughPowerCuts(t *testing.T) []string {
	disk := powercut.New(t)
	rng := disk.Rand()
	dir := filepath.Join(disk.Dir, "state")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	// Room for the grants until the last cut: on this disk a flush is a
	// memory copy, and four granters reach 100 000 a second.
	const pool = "10.8.0.1-10.11.255.254"
	s, err := Open(dir, []Network{{Pool: mustPool(t, pool)}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() }) // if the test stops early; closing twice is harmless

	var mu sync.Mutex
	granted := map[string]string{}
	var next atomic.Int64
	var compactions atomic.Int64
	stop := make(chan struct{})
	errs := make(chan error, 5)
	var workers sync.WaitGroup
	for w := range 4 {
		workers.Go(func() {
			// Until stopped, or until the journal would outgrow the disk.
			for next.Load() < 150_000 {
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

	var problems []string
	unflushed := 0
	for i, c := range cuts {
		unflushed += c.img.Unflushed
		c.img.Mount(t, func(root string) {
			dir := filepath.Join(root, "state")
			s, found := reopen(dir, pool, c.granted)
			if s != nil {
				s.Close()
			}
			if entries, _ := os.ReadDir(dir); len(entries) != 1 {
				found = append(found, fmt.Sprintf("files left in the state dir after reopening: %v", entries))
			}
			for _, p := range found {
				problems = append(problems, fmt.Sprintf("cut %d: %s", i, p))
			}
		})
	}
	t.Logf("%d cuts amid %d compactions; %d leases granted; %d unflushed blocks at the cuts, half of them kept",
		len(cuts), compactions.Load(), len(granted), unflushed)
	return problems
}
