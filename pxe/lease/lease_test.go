package lease

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

type clock struct{ t time.Time }

func (c *clock) now() time.Time { return c.t }

func mustPool(t testing.TB, s string) Pool {
	t.Helper()
	p, err := ParsePool(s)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func ip(s string) netip.Addr { return netip.MustParseAddr(s) }

const (
	macA = "52:54:00:00:00:0a"
	macB = "52:54:00:00:00:0b"
	macC = "52:54:00:00:00:0c"
	macR = "52:54:00:00:00:ee"
)

func open(t *testing.T, dir string, c *clock) *Store {
	t.Helper()
	s, err := Open(dir, []Network{{Pool: mustPool(t, "10.8.0.10-10.8.0.12"), Reservations: map[string]netip.Addr{macR: ip("10.8.0.200")}}}, c.now)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func TestStore(t *testing.T) {
	type step struct {
		do      string // offer, grant, release, decline, reopen, wait
		mac     string
		ip      string        // requested or granted address
		d       time.Duration // lease time or time to wait
		want    string        // address expected from offer/grant
		wantErr error
	}
	tests := []struct {
		name  string
		steps []step
	}{
		{"first free address, then the next", []step{
			{do: "offer", mac: macA, want: "10.8.0.10"},
			{do: "offer", mac: macB, want: "10.8.0.11"}, // A's offer is held
			{do: "grant", mac: macA, ip: "10.8.0.10", d: time.Hour, want: "10.8.0.10"},
			{do: "offer", mac: macA, want: "10.8.0.10"}, // same address on renewal
		}},
		{"requested address honoured when free", []step{
			{do: "offer", mac: macA, ip: "10.8.0.12", want: "10.8.0.12"},
			{do: "grant", mac: macA, ip: "10.8.0.12", d: time.Hour, want: "10.8.0.12"},
			{do: "offer", mac: macB, ip: "10.8.0.12", want: "10.8.0.10"},
			{do: "grant", mac: macB, ip: "10.8.0.12", d: time.Hour, wantErr: ErrTaken},
			{do: "grant", mac: macB, ip: "10.9.9.9", d: time.Hour, wantErr: ErrOutOfPool},
		}},
		{"grants survive a restart", []step{
			{do: "grant", mac: macA, ip: "10.8.0.11", d: time.Hour, want: "10.8.0.11"},
			{do: "reopen"},
			{do: "grant", mac: macB, ip: "10.8.0.11", d: time.Hour, wantErr: ErrTaken},
			{do: "offer", mac: macA, want: "10.8.0.11"},
		}},
		{"pool exhaustion, then reuse after expiry", []step{
			{do: "grant", mac: macA, ip: "10.8.0.10", d: time.Hour, want: "10.8.0.10"},
			{do: "grant", mac: macB, ip: "10.8.0.11", d: time.Hour, want: "10.8.0.11"},
			{do: "grant", mac: macC, ip: "10.8.0.12", d: time.Hour, want: "10.8.0.12"},
			{do: "offer", mac: "52:54:00:00:00:0d", wantErr: ErrPoolExhausted},
			{do: "wait", d: 2 * time.Hour},
			{do: "offer", mac: "52:54:00:00:00:0d", want: "10.8.0.10"},
		}},
		{"release frees the address but remembers it", []step{
			{do: "grant", mac: macA, ip: "10.8.0.10", d: time.Hour, want: "10.8.0.10"},
			{do: "release", mac: macA, ip: "10.8.0.10"},
			{do: "reopen"},
			{do: "offer", mac: macA, want: "10.8.0.10"},                                // its old address
			{do: "wait", d: time.Minute},                                               // A lets the offer lapse
			{do: "grant", mac: macB, ip: "10.8.0.10", d: time.Hour, want: "10.8.0.10"}, // anyone may take it
		}},
		{"a release by someone else does nothing", []step{
			{do: "grant", mac: macA, ip: "10.8.0.10", d: time.Hour, want: "10.8.0.10"},
			{do: "release", mac: macB, ip: "10.8.0.10"},
			{do: "grant", mac: macB, ip: "10.8.0.10", d: time.Hour, wantErr: ErrTaken},
		}},
		{"declined address rests ten minutes", []step{
			{do: "offer", mac: macA, want: "10.8.0.10"},
			{do: "decline", mac: macA, ip: "10.8.0.10"},
			{do: "reopen"},
			{do: "offer", mac: macA, want: "10.8.0.11"},
			{do: "wait", d: 11 * time.Minute},
			{do: "offer", mac: macB, want: "10.8.0.12"}, // the search goes on from the last offer
			{do: "offer", mac: macC, want: "10.8.0.10"}, // and wraps around to the rested address
		}},
		{"reservations", []step{
			{do: "offer", mac: macR, want: "10.8.0.200"},
			{do: "grant", mac: macR, ip: "10.8.0.200", d: time.Hour, want: "10.8.0.200"},
			{do: "grant", mac: macR, ip: "10.8.0.10", d: time.Hour, wantErr: ErrTaken},
			{do: "grant", mac: macA, ip: "10.8.0.200", d: time.Hour, wantErr: ErrTaken},
		}},
		{"offer hold ends", []step{
			{do: "offer", mac: macA, ip: "10.8.0.12", want: "10.8.0.12"},
			{do: "grant", mac: macB, ip: "10.8.0.12", d: time.Hour, wantErr: ErrTaken},
			{do: "wait", d: time.Minute},
			{do: "grant", mac: macB, ip: "10.8.0.12", d: time.Hour, want: "10.8.0.12"},
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			c := &clock{t: time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)}
			s := open(t, dir, c)
			for i, st := range tc.steps {
				var got netip.Addr
				var err error
				switch st.do {
				case "offer":
					var req netip.Addr
					if st.ip != "" {
						req = ip(st.ip)
					}
					got, err = s.Network(0).Offer(st.mac, req)
				case "grant":
					var l Lease
					l, err = s.Network(0).Grant(st.mac, ip(st.ip), st.d)
					got = l.IP
				case "release":
					err = s.Network(0).Release(st.mac, ip(st.ip))
				case "decline":
					err = s.Network(0).Decline(st.mac, ip(st.ip))
				case "reopen":
					s.Close()
					s = open(t, dir, c)
				case "wait":
					c.t = c.t.Add(st.d)
				}
				if st.wantErr != nil {
					if err == nil || !strings.Contains(err.Error(), st.wantErr.Error()) {
						t.Fatalf("step %d %s %s: error %v, want %v", i, st.do, st.mac, err, st.wantErr)
					}
					continue
				}
				if err != nil {
					t.Fatalf("step %d %s %s: %v", i, st.do, st.mac, err)
				}
				if st.want != "" && got.String() != st.want {
					t.Fatalf("step %d %s %s: got %s, want %s", i, st.do, st.mac, got, st.want)
				}
			}
		})
	}
}

func TestJournalDamage(t *testing.T) {
	good := `{"op":"grant","mac":"52:54:00:00:00:0a","ip":"10.8.0.10","expires":"2030-01-01T00:00:00Z"}` + "\n"
	tests := []struct {
		name    string
		journal string
		wantIP  bool
		wantErr string
	}{
		{"torn last line is a write that never finished", good + `{"op":"grant","mac":"52:54:00:00:0`, true, ""},
		{"damage in the middle is refused", good + "garbage\n" + good, false, "line 2"},
		{"empty file", "", false, ""},
		{"zero-filled tail", good + strings.Repeat("\x00", 4096), true, ""},
		// A crash can leave a record torn before the tail, and even
		// later writes persisted beyond a gap of zeros; none of them was
		// synced, so none was acknowledged.
		{"torn record before the tail", good + `{"op":"gra` + "\x00\x00" + good, true, ""},
		{"records beyond zeros are unsynced writes", "\x00\x00\n" + good, false, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			if err := os.WriteFile(filepath.Join(dir, "leases.jsonl"), []byte(tc.journal), 0o600); err != nil {
				t.Fatal(err)
			}
			s, err := Open(dir, []Network{{Pool: mustPool(t, "10.8.0.10-10.8.0.12")}}, nil)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			if _, ok := s.Lookup(macA); ok != tc.wantIP {
				t.Errorf("lease of %s present = %v, want %v", macA, ok, tc.wantIP)
			}
		})
	}
}

func TestParsePool(t *testing.T) {
	for _, bad := range []string{"", "10.0.0.1", "10.0.0.5-10.0.0.1", "a-b", "fd00::1-fd00::9"} {
		if _, err := ParsePool(bad); err == nil {
			t.Errorf("ParsePool(%q) accepted", bad)
		}
	}
	p := mustPool(t, "10.0.0.1-10.0.0.3")
	if !p.Contains(ip("10.0.0.3")) || p.Contains(ip("10.0.0.4")) {
		t.Errorf("Contains wrong for %s", p)
	}
}

// TestCrashSafety kills a process that is granting leases (kill -9, at
// random moments) and checks that every lease it had reported as granted
// is still there after a restart, with no address given twice.
func TestCrashSafety(t *testing.T) {
	dir := t.TempDir()
	self, _ := os.Executable()
	granted := map[string]string{} // mac -> ip, as reported by the child
	next := 0
	for round := range 8 {
		cmd, lines := startLeaseChild(t, self, dir, next)
		// Let it grant a few, then kill it without warning.
		want := 5 + rand.IntN(40)
		for n := 0; n < want; n++ {
			line, ok := <-lines
			if !ok {
				break
			}
			mac, addr, _ := strings.Cut(line, " ")
			granted[mac] = addr
		}
		_ = cmd.Process.Signal(syscall.SIGKILL)
		for line := range lines { // reported before it died: granted too
			mac, addr, _ := strings.Cut(line, " ")
			granted[mac] = addr
		}
		_ = cmd.Wait()
		next += 1000

		s := reopenChecked(t, fmt.Sprintf("round %d after kill -9", round), dir, granted)
		s.Close()
	}
	t.Logf("%d leases survived 8 kill -9s", len(granted))
}

// TestMain runs the test binary as the lease child when
// COZY_LEASE_CHILD_DIR says so, and never as a test: no test skips for it.
func TestMain(m *testing.M) {
	if dir := os.Getenv("COZY_LEASE_CHILD_DIR"); dir != "" {
		leaseChild(dir)
	}
	os.Exit(m.Run())
}

// leaseChild is the process TestCrashSafety kills: it grants leases to
// new MACs as fast as it can and reports each one only after Grant returns.
func leaseChild(dir string) {
	start, _ := strconv.Atoi(os.Getenv("COZY_LEASE_CHILD_START"))
	pool, err := ParsePool("10.8.0.1-10.8.255.254")
	if err != nil {
		fmt.Println("pool:", err)
		os.Exit(1)
	}
	s, err := Open(dir, []Network{{Pool: pool}}, nil)
	if err != nil {
		fmt.Println("open:", err)
		os.Exit(1)
	}
	// Four granting at once: two one lease at a time, two in batches as
	// the server's DHCP loop does (grants appended, one Sync, then the
	// ACKs). Grants share writes and fdatasyncs (group commit), and each
	// is reported only once durable.
	var out sync.Mutex
	var next atomic.Int64
	next.Store(int64(start))
	if os.Getenv("COZY_LEASE_CHILD_COMPACT") != "" {
		// Compact over and over, so kills land in every step of it.
		go func() {
			for n := 1; ; n++ {
				if _, err := s.Compact(); err != nil {
					fmt.Println("compact:", err)
					os.Exit(1)
				}
				out.Lock()
				fmt.Println("compacted", n)
				out.Unlock()
			}
		}()
	}
	for w := range 4 {
		go func() {
			for {
				batch, err := grantBatch(s, w, &next)
				if err != nil {
					fmt.Println("grant:", err)
					os.Exit(1)
				}
				out.Lock()
				for _, line := range batch {
					fmt.Println(line)
				}
				out.Unlock()
			}
		}()
	}
	select {}
}

// grantBatch grants leases to new MACs, numbered from next: one at a time
// for granters 0 and 1, in batches of up to 16 for 2 and 3 as the server's
// DHCP loop does (grants appended, one Sync, then the ACKs). It returns
// them as "MAC ADDRESS" lines once they are durable.
func grantBatch(s *Store, w int, next *atomic.Int64) ([]string, error) {
	var batch []string
	var seq Seq
	for range 1 + w/2*rand.IntN(16) {
		i := next.Add(1)
		mac := fmt.Sprintf("52:54:%02x:%02x:%02x:%02x", byte(i>>24), byte(i>>16), byte(i>>8), byte(i))
		addr, err := s.Network(0).Offer(mac, netip.Addr{})
		if err != nil {
			return nil, err
		}
		if _, seq, err = s.Network(0).GrantBuffered(mac, addr, time.Hour); err != nil {
			return nil, err
		}
		batch = append(batch, mac+" "+addr.String())
	}
	return batch, s.Sync(seq)
}

// The journal's hand-written encoder writes what encoding/json would, so
// the file stays plain JSON lines.
func TestAppendRecordIsJSON(t *testing.T) {
	exp := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	for _, r := range []record{
		{Op: opGrant, MAC: macA, IP: ip("10.8.0.10"), Expires: exp},
		{Op: opRelease, MAC: macB, IP: ip("10.8.0.255"), Expires: exp.Add(time.Nanosecond)},
		{Op: opDecline, IP: ip("10.8.0.11"), Expires: exp},
		{Op: opGrant, MAC: `odd"<mac>\`, IP: ip("10.8.0.12"), Expires: exp},
		{Op: opGrant, MAC: "ünïcode\x01", Expires: time.Date(2030, 1, 2, 3, 4, 5, 0, time.FixedZone("x", 3600))},
	} {
		want, err := json.Marshal(r)
		if err != nil {
			t.Fatal(err)
		}
		if got := string(appendRecord(nil, r)); got != string(want)+"\n" {
			t.Errorf("appendRecord:\n got %s\nwant %s", got, want)
		}
	}
}

// Grants that outgrow the zero-filled tail extend it, and all of them
// load again; buffered grants become durable together with one Sync.
func TestJournalGrowsPastItsTail(t *testing.T) {
	dir := t.TempDir()
	pool := mustPool(t, "10.8.0.1-10.8.255.254")
	s, err := Open(dir, []Network{{Pool: pool}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	fi, _ := os.Stat(filepath.Join(dir, "leases.jsonl"))
	if fi.Size() < preallocate {
		t.Errorf("new journal is %d bytes, want a zero-filled tail of %d", fi.Size(), preallocate)
	}
	const n = 25000 // about 2.5 MiB of records: two extensions
	granted := map[string]netip.Addr{}
	for i := range n {
		mac := fmt.Sprintf("52:54:00:%02x:%02x:%02x", byte(i>>16), byte(i>>8), byte(i))
		addr, err := s.Network(0).Offer(mac, netip.Addr{})
		if err != nil {
			t.Fatal(err)
		}
		_, seq, err := s.Network(0).GrantBuffered(mac, addr, time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		if i%5000 == 4999 || i == n-1 {
			if err := s.Sync(seq); err != nil {
				t.Fatal(err)
			}
		}
		granted[mac] = addr
	}
	s.Close()
	s, err = Open(dir, []Network{{Pool: pool}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if got := len(s.Leases()); got != n {
		t.Fatalf("%d leases after reopening, want %d", got, n)
	}
	for mac, addr := range granted {
		if l, ok := s.Lookup(mac); !ok || l.IP != addr {
			t.Fatalf("lease %s -> %s lost", mac, addr)
		}
	}
}

// Once a journal write fails, nothing is acknowledged again: the kernel
// may have dropped what it had not written.
func TestJournalFailureSticks(t *testing.T) {
	s := open(t, t.TempDir(), &clock{t: time.Now()})
	if _, err := s.Network(0).Grant(macA, ip("10.8.0.10"), time.Hour); err != nil {
		t.Fatal(err)
	}
	s.journal.f.Close() // the next write fails
	if _, err := s.Network(0).Grant(macB, ip("10.8.0.11"), time.Hour); err == nil {
		t.Fatal("grant acknowledged without a journal")
	}
	if _, err := s.Network(0).Grant(macC, ip("10.8.0.12"), time.Hour); err == nil {
		t.Fatal("grant acknowledged after a failed journal write")
	}
}

func TestNormMAC(t *testing.T) {
	for in, want := range map[string]string{
		"52:54:00:0a:bc:de": "52:54:00:0a:bc:de",
		"52:54:00:0A:BC:DE": "52:54:00:0a:bc:de",
		"52-54-00-0a-bc-de": "52:54:00:0a:bc:de",
		"5254.000a.bcde":    "52:54:00:0a:bc:de",
		"not a mac":         "not a mac",
		"52:54:00:0a:bc:dg": "52:54:00:0a:bc:dg",
	} {
		if got := normMAC(in); got != want {
			t.Errorf("normMAC(%q) = %q, want %q", in, got, want)
		}
	}
}

// Compaction runs while grants go on: every grant acknowledged before,
// during or after it is in the journal that replaces the old one, and the
// journal shrinks to what is live.
func TestCompactWhileGranting(t *testing.T) {
	dir := t.TempDir()
	pool := mustPool(t, "10.8.0.1-10.8.255.254")
	s, err := Open(dir, []Network{{Pool: pool}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	s.compactMin = 500
	const workers, perWorker, renewals = 4, 200, 8
	var mu sync.Mutex
	granted := map[string]netip.Addr{}
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i := range perWorker {
				// Each client renews its lease, so the journal holds
				// more records than leases.
				mac := fmt.Sprintf("52:54:00:%02x:%02x:%02x", w, byte(i>>8), byte(i))
				addr, err := s.Network(0).Offer(mac, netip.Addr{})
				if err != nil {
					t.Error(err)
					return
				}
				for range renewals {
					if _, err := s.Network(0).Grant(mac, addr, time.Hour); err != nil {
						t.Error(err)
						return
					}
				}
				mu.Lock()
				granted[mac] = addr
				mu.Unlock()
			}
		})
	}
	compactions := 0
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	for running := true; running; {
		select {
		case <-s.CompactionDue():
			if _, err := s.Compact(); err != nil {
				t.Fatal(err)
			}
			compactions++
		case <-done:
			running = false
		}
	}
	if compactions == 0 {
		t.Fatal("no compaction came due")
	}
	if _, err := s.Compact(); err != nil {
		t.Fatal(err)
	}
	fi, _ := os.Stat(filepath.Join(dir, "leases.jsonl"))
	s.Close()
	if max := int64(workers*perWorker*120 + 2*preallocate); fi.Size() > max {
		t.Errorf("journal is %d bytes after compaction, want at most %d", fi.Size(), max)
	}

	s, err = Open(dir, []Network{{Pool: pool}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if got := len(s.Leases()); got != len(granted) {
		t.Errorf("%d leases, want %d", got, len(granted))
	}
	for mac, addr := range granted {
		if l, ok := s.Lookup(mac); !ok || l.IP != addr {
			t.Fatalf("lease %s -> %s lost in %d compactions", mac, addr, compactions)
		}
	}
	t.Logf("%d compactions while granting %d leases %d times", compactions, len(granted), renewals)
}

// A compacted journal keeps expired leases (the client gets its address
// back) but not declines that have rested long enough.
func TestCompactKeepsBindings(t *testing.T) {
	dir := t.TempDir()
	c := &clock{t: time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)}
	s := open(t, dir, c)
	if _, err := s.Network(0).Grant(macA, ip("10.8.0.10"), time.Minute); err != nil {
		t.Fatal(err)
	}
	if err := s.Network(0).Decline(macB, ip("10.8.0.11")); err != nil {
		t.Fatal(err)
	}
	c.t = c.t.Add(time.Hour)
	if _, err := s.Compact(); err != nil {
		t.Fatal(err)
	}
	s.Close()
	data, _ := os.ReadFile(filepath.Join(dir, "leases.jsonl"))
	records, _ := readJournal(filepath.Join(dir, "leases.jsonl"))
	if len(records) != 1 || records[0].Op != opGrant || records[0].MAC != macA {
		t.Errorf("compacted journal:\n%s", bytes.TrimRight(data, "\x00"))
	}
	s = open(t, dir, c)
	if got, err := s.Network(0).Offer(macA, netip.Addr{}); err != nil || got != ip("10.8.0.10") {
		t.Errorf("expired lease's client offered %v %v, want its old address", got, err)
	}
}

// TestCompactionCrashSafety kills, at random moments, a process that
// grants leases while compacting its journal over and over, and checks
// after each kill that every lease it reported as granted is there, that
// no address is leased twice, and that no temporary file stays behind.
func TestCompactionCrashSafety(t *testing.T) {
	dir := t.TempDir()
	self, _ := os.Executable()
	granted := map[string]string{}
	next, compactions := 0, 0
	for round := range 12 {
		cmd, lines := startLeaseChild(t, self, dir, next, "COZY_LEASE_CHILD_COMPACT=1")
		record := func(line string) {
			if n, ok := strings.CutPrefix(line, "compacted "); ok {
				c, _ := strconv.Atoi(n)
				compactions = max(compactions, c)
				return
			}
			mac, addr, _ := strings.Cut(line, " ")
			granted[mac] = addr
		}
		// Kill it after some grants and compactions, mid-whatever.
		want := 50 + rand.IntN(400)
		for n := 0; n < want; n++ {
			line, ok := <-lines
			if !ok {
				break
			}
			record(line)
		}
		_ = cmd.Process.Signal(syscall.SIGKILL)
		for line := range lines {
			record(line)
		}
		_ = cmd.Wait()
		next += 10000

		s := reopenChecked(t, fmt.Sprintf("round %d after kill -9", round), dir, granted)
		s.Close()
		entries, _ := os.ReadDir(dir)
		if len(entries) != 1 {
			t.Fatalf("round %d: files left in the state dir: %v", round, entries)
		}
	}
	if compactions == 0 {
		t.Fatal("the child never compacted")
	}
	t.Logf("%d leases survived 12 kill -9s amid compactions", len(granted))
}

// Several networks share one journal; each hands out its own pool, keeps
// its reservations, and a client may hold a lease on each.
func TestNetworks(t *testing.T) {
	dir := t.TempDir()
	nets := []Network{
		{Subnet: netip.MustParsePrefix("10.8.0.0/24"), Pool: mustPool(t, "10.8.0.10-10.8.0.12")},
		{Subnet: netip.MustParsePrefix("10.9.0.0/24"), Pool: mustPool(t, "10.9.0.10-10.9.0.11"),
			Reservations: map[string]netip.Addr{macR: ip("10.9.0.50")}},
	}
	s, err := Open(dir, nets, nil)
	if err != nil {
		t.Fatal(err)
	}
	a, b := s.Network(0), s.Network(1)
	grant := func(v *Net, mac string) netip.Addr {
		t.Helper()
		addr, err := v.Offer(mac, netip.Addr{})
		if err == nil {
			_, err = v.Grant(mac, addr, time.Hour)
		}
		if err != nil {
			t.Fatal(err)
		}
		return addr
	}
	if got := grant(a, macA); got != ip("10.8.0.10") {
		t.Errorf("first network gave %s", got)
	}
	if got := grant(b, macA); got != ip("10.9.0.10") {
		t.Errorf("second network gave %s to the same client", got)
	}
	if got := grant(a, macR); got != ip("10.8.0.11") {
		t.Errorf("a reservation on the second network counts on the first: %s", got)
	}
	if got := grant(b, macR); got != ip("10.9.0.50") {
		t.Errorf("reservation: %s", got)
	}
	if _, err := b.Grant(macB, ip("10.8.0.12"), time.Hour); err == nil || !strings.Contains(err.Error(), ErrOutOfPool.Error()) {
		t.Errorf("an address of the other network: %v, want %v", err, ErrOutOfPool)
	}
	s.Close()

	s, err = Open(dir, nets, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for i, want := range map[int]string{0: "10.8.0.10", 1: "10.9.0.10"} {
		if l, ok := s.Network(i).Lookup(macA); !ok || l.IP.String() != want {
			t.Errorf("network %d after reopening: %s has %v, want %s", i, macA, l.IP, want)
		}
	}
	if got := len(s.Leases()); got != 4 {
		t.Errorf("%d leases after reopening, want 4", got)
	}
}

func TestNetworksRefused(t *testing.T) {
	p := func(s string) netip.Prefix { return netip.MustParsePrefix(s) }
	for name, nets := range map[string][]Network{
		"overlap":             {{Subnet: p("10.8.0.0/16"), Pool: mustPool(t, "10.8.0.10-10.8.0.20")}, {Subnet: p("10.8.1.0/24"), Pool: mustPool(t, "10.8.1.10-10.8.1.20")}},
		"pool outside":        {{Subnet: p("10.8.0.0/24"), Pool: mustPool(t, "10.8.1.10-10.8.1.20")}},
		"reservation outside": {{Subnet: p("10.8.0.0/24"), Pool: mustPool(t, "10.8.0.10-10.8.0.20"), Reservations: map[string]netip.Addr{macA: ip("10.9.0.1")}}},
		"second without net":  {{Subnet: p("10.8.0.0/24"), Pool: mustPool(t, "10.8.0.10-10.8.0.20")}, {Pool: mustPool(t, "10.9.0.10-10.9.0.20")}},
		"none":                nil,
	} {
		if s, err := Open(t.TempDir(), nets, nil); err == nil {
			s.Close()
			t.Errorf("%s: accepted", name)
		}
	}
}

// A lease on an address no configured network claims any more (its
// network was dropped from the configuration) is kept, not forgotten.
func TestLeasesOutsideEveryNetworkKept(t *testing.T) {
	dir := t.TempDir()
	journal := `{"op":"grant","mac":"52:54:00:00:00:0a","ip":"10.7.0.5","expires":"2030-01-01T00:00:00Z"}` + "\n"
	if err := os.WriteFile(filepath.Join(dir, "leases.jsonl"), []byte(journal), 0o600); err != nil {
		t.Fatal(err)
	}
	nets := []Network{{Subnet: netip.MustParsePrefix("10.8.0.0/24"), Pool: mustPool(t, "10.8.0.10-10.8.0.12")}}
	for range 2 { // the second time, from the journal the first compacted
		s, err := Open(dir, nets, nil)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.Compact(); err != nil {
			t.Fatal(err)
		}
		if l, ok := s.Lookup(macA); !ok || l.IP != ip("10.7.0.5") {
			t.Errorf("lease outside every network: %v %v", l, ok)
		}
		if _, ok := s.Network(0).Lookup(macA); ok {
			t.Error("the lease counts on a network it is not on")
		}
		s.Close()
	}
}

// reopenChecked opens the store a kill -9 or a power cut left and fails
// the test if an address is leased twice or a granted lease is gone.
func reopenChecked(t *testing.T, label string, dir string, granted map[string]string) *Store {
	t.Helper()
	s, problems := reopen(dir, "10.8.0.1-10.8.255.254", granted)
	if len(problems) > 0 {
		t.Fatalf("%s: %s", label, strings.Join(problems, "; "))
	}
	return s
}

// reopen opens the store in dir, with pool, and says what is wrong with
// it: an address leased twice, a granted lease (MAC -> address) gone.
func reopen(dir, pool string, granted map[string]string) (*Store, []string) {
	p, err := ParsePool(pool)
	if err != nil {
		return nil, []string{err.Error()}
	}
	s, err := Open(dir, []Network{{Pool: p}}, nil)
	if err != nil {
		return nil, []string{fmt.Sprintf("reopen: %v", err)}
	}
	var problems []string
	seen := map[netip.Addr]string{}
	has := map[string]string{}
	for _, l := range s.Leases() {
		if other, dup := seen[l.IP]; dup {
			problems = append(problems, fmt.Sprintf("%s leased to %s and %s", l.IP, other, l.MAC))
		}
		seen[l.IP] = l.MAC
		has[l.MAC] = l.IP.String()
	}
	lost := 0
	for mac, addr := range granted {
		if got, ok := has[mac]; !ok || got != addr {
			if lost++; lost <= 5 { // the first few say enough
				problems = append(problems, fmt.Sprintf("granted lease %s -> %s lost (found %q)", mac, addr, got))
			}
		}
	}
	if lost > 5 {
		problems = append(problems, fmt.Sprintf("and %d more granted leases lost", lost-5))
	}
	return s, problems
}

// startLeaseChild runs leaseChild in a child process granting leases
// in dir from MAC number next, and returns it with the lines it prints
// (one per durable grant), closed when its output ends.
func startLeaseChild(t *testing.T, self, dir string, next int, env ...string) (*exec.Cmd, <-chan string) {
	t.Helper()
	cmd := exec.Command(self)
	cmd.Env = append(append(os.Environ(), "COZY_LEASE_CHILD_DIR="+dir, "COZY_LEASE_CHILD_START="+strconv.Itoa(next)), env...)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	lines := make(chan string)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	return cmd, lines
}

// TestCompactSwitchWritesBoth: a grant synced while the new journal is
// being put in place is in both files, so it survives a crash before the
// rename, after it, or before the directory is synced.
func TestCompactSwitchWritesBoth(t *testing.T) {
	dir := t.TempDir()
	pool := mustPool(t, "10.8.0.1-10.8.0.250")
	s, err := Open(dir, []Network{{Pool: pool}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	grant := func(mac string) netip.Addr {
		ip, err := s.Network(0).Offer(mac, netip.Addr{})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.Network(0).Grant(mac, ip, time.Hour); err != nil {
			t.Fatal(err)
		}
		return ip
	}
	before := grant("52:54:00:00:00:01")
	var during netip.Addr
	var inOld, inNew []byte
	beforeCommit = func(newJournal string) {
		during = grant("52:54:00:00:00:02") // Sync must not wait for the switch
		inOld, _ = os.ReadFile(filepath.Join(dir, "leases.jsonl"))
		inNew, _ = os.ReadFile(newJournal)
	}
	t.Cleanup(func() { beforeCommit = nil })
	c, err := s.Compact()
	if err != nil {
		t.Fatal(err)
	}
	for name, content := range map[string][]byte{"old journal": inOld, "new journal": inNew} {
		for _, rec := range []string{`"mac":"52:54:00:00:00:01","ip":"` + before.String(), `"mac":"52:54:00:00:00:02","ip":"` + during.String()} {
			if !bytes.Contains(content, []byte(rec)) {
				t.Errorf("%s during the switch lacks %s", name, rec)
			}
		}
	}
	if c.Live != 1 {
		t.Errorf("compaction started with %d live records, want 1", c.Live)
	}
	after := grant("52:54:00:00:00:03")
	s.Close()
	s, err = Open(dir, []Network{{Pool: pool}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for mac, ip := range map[string]netip.Addr{"52:54:00:00:00:01": before, "52:54:00:00:00:02": during, "52:54:00:00:00:03": after} {
		if l, ok := s.Lookup(mac); !ok || l.IP != ip {
			t.Errorf("after the switch and a restart, %s has %v, want %s", mac, l.IP, ip)
		}
	}
}

// TestJournalReadableByLineReaders: a journal with its zero-filled tail,
// cut after its last newline, is plain JSON lines, which is how builds
// from before the tail read it. So going back to such a build after a
// clean stop (or a crash between batches) keeps every lease; only a batch
// torn across blocks leaves bytes it refuses (with the line number, and
// changing nothing), where this build stops at the first zero byte.
func TestJournalReadableByLineReaders(t *testing.T) {
	dir := t.TempDir()
	s, err := Open(dir, []Network{{Pool: mustPool(t, "10.8.0.1-10.8.0.250")}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	const n = 40
	for i := range n {
		mac := fmt.Sprintf("52:54:00:00:01:%02x", i)
		ip, err := s.Network(0).Offer(mac, netip.Addr{})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.Network(0).Grant(mac, ip, time.Hour); err != nil {
			t.Fatal(err)
		}
	}
	data, err := os.ReadFile(filepath.Join(dir, "leases.jsonl"))
	s.Close()
	if err != nil {
		t.Fatal(err)
	}
	if len(data) < preallocate || data[len(data)-1] != 0 {
		t.Fatalf("journal of %d bytes has no zero-filled tail", len(data))
	}
	data = data[:bytes.LastIndexByte(data, '\n')+1]
	lines := strings.Split(strings.TrimSuffix(string(data), "\n"), "\n")
	if len(lines) != n {
		t.Fatalf("%d lines before the tail, want %d", len(lines), n)
	}
	for i, line := range lines {
		var r record
		if err := json.Unmarshal([]byte(line), &r); err != nil || r.Op != opGrant {
			t.Errorf("line %d %q: %v", i+1, line, err)
		}
	}
}
