package lease

import (
	"fmt"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// BenchmarkCompactUnderLoad compacts a journal of 20 000 leases while four
// clients renew theirs without pause, and prices what a compaction costs
// them next to what they pay anyway: how long grants were stopped and
// ACKs held per compaction, against the spread of every renewal's own
// sync (one write and fdatasync shared by whoever waits, on the disk of
// the test's temporary directory).
//
//	go test -run '^$' -bench CompactUnderLoad ./pxe/lease/
func BenchmarkCompactUnderLoad(b *testing.B) {
	s, err := Open(b.TempDir(), []Network{{Pool: mustPool(b, "10.8.0.1-10.8.255.254")}}, nil)
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	const leases, workers = 20000, 4
	macs := make([]string, leases)
	addrs := make([]netip.Addr, leases)
	var last Seq
	for i := range leases {
		macs[i] = fmt.Sprintf("52:54:00:%02x:%02x:%02x", byte(i>>16), byte(i>>8), byte(i))
		if addrs[i], err = s.Network(0).Offer(macs[i], netip.Addr{}); err != nil {
			b.Fatal(err)
		}
		if _, last, err = s.Network(0).GrantBuffered(macs[i], addrs[i], time.Hour); err != nil {
			b.Fatal(err)
		}
	}
	if err := s.Sync(last); err != nil {
		b.Fatal(err)
	}

	var stop atomic.Bool
	var mu sync.Mutex
	var syncs []time.Duration
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			var mine []time.Duration
			for i := w; !stop.Load(); i = (i + workers) % leases {
				_, seq, err := s.Network(0).GrantBuffered(macs[i], addrs[i], time.Hour)
				if err != nil {
					b.Error(err)
					return
				}
				start := time.Now()
				if err := s.Sync(seq); err != nil {
					b.Error(err)
					return
				}
				mine = append(mine, time.Since(start))
			}
			mu.Lock()
			syncs = append(syncs, mine...)
			mu.Unlock()
		})
	}
	var stopped, held time.Duration
	b.ResetTimer()
	for range b.N {
		c, err := s.Compact()
		if err != nil {
			b.Fatal(err)
		}
		stopped += c.Stopped
		held += c.Held
	}
	b.StopTimer()
	stop.Store(true)
	wg.Wait()
	slices.Sort(syncs)
	ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
	at := func(q float64) float64 { return ms(syncs[int(q*float64(len(syncs)-1))]) }
	b.ReportMetric(ms(stopped)/float64(b.N), "grants-stopped-ms/op")
	b.ReportMetric(ms(held)/float64(b.N), "acks-held-ms/op")
	b.ReportMetric(at(0.5), "sync-p50-ms")
	b.ReportMetric(at(0.99), "sync-p99-ms")
	b.ReportMetric(at(1), "sync-max-ms")
}
