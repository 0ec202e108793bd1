package lease

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"cozy.dev/cozy/internal/atomicfile"
)

// The journal is JSON lines, one record each, followed by a tail of zero
// bytes: space written ahead of time (preallocated and zero-filled), so
// that appending a record overwrites blocks the file already has and
// fdatasync writes those data blocks only, with no change of file size or
// allocation to commit to the file system's own journal. Reading stops at
// the first zero byte.

// preallocate is how far ahead of the last record the journal's
// zero-filled tail reaches after it is extended: about 9 000 grants.
const preallocate = 1 << 20

// zeroBlock is written repeatedly to fill the tail.
var zeroBlock [64 << 10]byte

// Seq is a position in the journal: the records appended up to it are
// durable once Sync(seq) has returned nil.
type Seq uint64

// Record operations.
const (
	opGrant   = "grant"
	opRelease = "release"
	opDecline = "decline"
)

// appendRecord appends r as one JSON line, as json.Marshal would write it
// (TestAppendRecordIsJSON), without reflection or allocation.
func appendRecord(b []byte, r record) []byte {
	if !plainJSON(r.Op) || !plainJSON(r.MAC) {
		j, _ := json.Marshal(r)
		return append(append(b, j...), '\n')
	}
	b = append(b, `{"op":"`...)
	b = append(b, r.Op...)
	b = append(b, '"')
	if r.MAC != "" {
		b = append(b, `,"mac":"`...)
		b = append(b, r.MAC...)
		b = append(b, '"')
	}
	b = append(b, `,"ip":"`...)
	b = r.IP.AppendTo(b)
	b = append(b, `","expires":"`...)
	b = r.Expires.AppendFormat(b, time.RFC3339Nano)
	return append(b, "\"}\n"...)
}

// plainJSON reports whether s needs no escaping in a JSON string (nor
// HTML escaping, which encoding/json also applies).
func plainJSON(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c < 0x20 || c > 0x7e || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' {
			return false
		}
	}
	return true
}

// readJournal parses the journal at path into records. What follows the
// first zero byte is preallocated space, or records whose write a crash
// interrupted before they were synced (an ACK leaves only after every
// byte before its record is durable, so none of those was acknowledged).
// A last line without its newline is such a write too and is dropped. Any
// other unreadable line is an error: guessing could hand out a granted
// address.
func readJournal(path string) ([]record, error) {
	data, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read leases: %w", err)
	}
	if i := bytes.IndexByte(data, 0); i >= 0 {
		data = data[:i]
	}
	if i := bytes.LastIndexByte(data, '\n'); i < len(data)-1 {
		data = data[:i+1]
	}
	var out []record
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for line := 1; sc.Scan(); line++ {
		var r record
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			return nil, fmt.Errorf("%s line %d: %w (move the file aside to start without leases)", path, line, err)
		}
		out = append(out, r)
	}
	return out, sc.Err()
}

// journalFile is an open journal: where the next record goes and how far
// the zero-filled tail reaches. Only the holder of Store.syncMu uses the
// store's current one.
type journalFile struct {
	f         *os.File
	off       int64 // end of the last record
	allocated int64 // end of the zero-filled tail (the file's size)
}

// newJournal starts a replacement of the journal at path holding content
// and a zero-filled tail; it replaces the file on Commit.
func newJournal(path string, content []byte) (*journalFile, *atomicfile.Replacement, error) {
	r, err := atomicfile.NewReplacement(path, 0o600)
	if err != nil {
		return nil, nil, err
	}
	j := &journalFile{f: r.File}
	if err := j.append(content); err != nil {
		r.Abort()
		return nil, nil, err
	}
	return j, r, nil
}

// append writes data after the last record, extending the zero-filled
// tail first if data would fill it. Only an extension (once per
// preallocate bytes) changes the file's size.
func (j *journalFile) append(data []byte) error {
	end := j.off + int64(len(data))
	if end >= j.allocated {
		target := end + preallocate
		for at := max(j.allocated, end); at < target; {
			n := min(int64(len(zeroBlock)), target-at)
			if _, err := j.f.WriteAt(zeroBlock[:n], at); err != nil {
				return fmt.Errorf("extend lease journal: %w", err)
			}
			at += n
		}
		j.allocated = target
	}
	if _, err := j.f.WriteAt(data, j.off); err != nil {
		return fmt.Errorf("write lease journal: %w", err)
	}
	j.off = end
	return nil
}

func (j *journalFile) sync() error {
	if err := syncData(j.f); err != nil {
		return fmt.Errorf("sync lease journal: %w", err)
	}
	return nil
}

// When a running journal is compacted: once it holds this many records
// and compactRatio times as many as a compacted one would.
const (
	compactMinRecords = 10000
	compactRatio      = 4
)

// compact rewrites the journal as one record per lease and declined
// address, crash-safely; for Open, before anything else runs.
func (s *Store) compact() error {
	snap := s.snapshot()
	j, r, err := newJournal(s.path, encode(snap))
	if err == nil {
		if err = r.Commit(); err != nil {
			r.Abort()
		}
	}
	if err != nil {
		return fmt.Errorf("compact leases: %w", err)
	}
	s.journal, s.fileRecords = j, len(snap)
	return nil
}

// snapshot lists the live state as records: every lease (expired ones
// too: the binding gives a returning client its address back) and the
// declined addresses still resting. s.mu must be held, or nothing else
// may run.
func (s *Store) snapshot() []record {
	now := s.now()
	out := make([]record, 0, len(s.byIP)+len(s.declined))
	for _, l := range s.byIP {
		out = append(out, record{Op: opGrant, MAC: l.MAC, IP: l.IP, Expires: l.Expires})
	}
	for ip, until := range s.declined {
		if now.Before(until) {
			out = append(out, record{Op: opDecline, IP: ip, Expires: until})
		}
	}
	return out
}

func encode(records []record) []byte {
	var b []byte
	for _, r := range records {
		b = appendRecord(b, r)
	}
	return b
}

// append adds a record to the journal and applies it; s.mu must be held.
// The record is durable only after Sync(seq).
func (s *Store) append(r record) Seq {
	s.pending = appendRecord(s.pending, r)
	// Applied before it is durable: until then the address counts as taken
	// (the safe side) but no one has been told it is theirs.
	s.apply(r)
	s.written++
	return s.written
}

// flush writes the pending records to the journal file, not yet durable;
// s.syncMu must be held. atSwap, if not nil, runs under s.mu at the moment
// the pending records are taken: it sees the state they end at.
func (s *Store) flush(atSwap func()) (live int, err error) {
	s.mu.Lock()
	data, target := s.pending, s.written
	s.pending = s.spare[:0]
	live = len(s.byIP) + len(s.declined)
	if atSwap != nil {
		atSwap()
	}
	s.mu.Unlock()
	err = s.journal.append(data)
	if err == nil && s.shadow != nil {
		err = s.shadow.append(data)
	}
	if err == nil && s.compacting {
		if s.shadow == nil {
			s.tail = append(s.tail, data...)
		}
		s.tailRecords += int(target - s.flushed)
	}
	s.spare = data[:0]
	s.fileRecords += int(target - s.flushed)
	s.flushed = target
	return live, err
}

// Sync makes every record up to seq durable. Callers that appended while
// another write was on its way share the next one (group commit), so
// concurrent grants cost one write and one fdatasync, not one each.
func (s *Store) Sync(seq Seq) error {
	s.syncMu.Lock()
	defer s.syncMu.Unlock()
	if s.synced >= seq {
		return nil
	}
	if s.failed != nil {
		return s.failed
	}
	live, err := s.flush(nil)
	if err == nil {
		err = s.journal.sync()
	}
	if err == nil && s.shadow != nil {
		err = s.shadow.sync()
	}
	if err != nil {
		s.failed = err
		return err
	}
	s.synced = s.flushed
	if !s.compacting && s.fileRecords >= max(s.compactMin, compactRatio*live, s.retryAfter) {
		select {
		case s.due <- struct{}{}:
		default:
		}
	}
	return nil
}

// CompactionDue receives a value when the journal has grown enough that
// Compact is worth running.
func (s *Store) CompactionDue() <-chan struct{} { return s.due }

// Compact rewrites the journal as one record per lease and declined
// address, while grants go on, without ever losing one:
//
//  1. Snapshot the state; everything appended so far is written to the
//     old journal, and what is written to it from then on is also kept
//     in memory (the tail).
//  2. Write the snapshot to a new file beside the journal and sync it,
//     then the tail so far (no locks held: grants and syncs go on in the
//     old journal).
//  3. Holding up journal writes: append the rest of the tail. From then
//     on each batch is written and synced in both files.
//  4. Sync the new file, rename it over the journal and sync the
//     directory (syncs go on, in both files), then write on in the new
//     file only.
//
// Until the rename, the old journal has every durable record; from step
// 3 on, the new one has them too. A crash at any point leaves one or the
// other, plus a temporary file that Open removes.
func (s *Store) Compact() (c Compaction, err error) {
	s.compactMu.Lock()
	defer s.compactMu.Unlock()

	snap, err := s.startCompaction(&c)
	if err != nil {
		return c, err
	}
	j, r, written, err := s.writeNewJournal(snap)
	if err != nil {
		return c, err
	}
	if err := s.joinNewJournal(j, r, written, &c); err != nil {
		return c, err
	}
	if beforeCommit != nil {
		beforeCommit(r.Name())
	}
	return c, s.commitNewJournal(j, r, len(snap))
}

// startCompaction is step 1: the snapshot of the live records, taken
// while offers and grants wait (c.Stopped), with every record appended
// so far flushed to the old journal, and the tail started.
func (s *Store) startCompaction(c *Compaction) ([]record, error) {
	s.syncMu.Lock()
	defer s.syncMu.Unlock()
	if s.failed != nil {
		return nil, s.failed
	}
	// The snapshot holds every record appended so far, so they must be in
	// the old file before the tail starts: flush them, taken at the same
	// moment as the snapshot (a later Sync makes them durable, there or, as
	// part of the snapshot, in the new file). Records appended after it
	// go to the tail.
	var snap []record
	if _, err := s.flush(func() {
		start := time.Now()
		snap = s.snapshot()
		c.Stopped = time.Since(start)
	}); err != nil {
		s.failed = err
		return nil, err
	}
	c.Live = len(snap)
	s.compacting, s.tail, s.tailRecords = true, s.tail[:0], 0
	return snap, nil
}

// writeNewJournal is step 2: the snapshot, then the tail so far, in a
// new file beside the journal, synced; no locks are held while it
// writes, so grants and syncs go on in the old journal. written is how
// much of the tail it took.
func (s *Store) writeNewJournal(snap []record) (j *journalFile, r *atomicfile.Replacement, written int, err error) {
	j, r, err = newJournal(s.path, encode(snap))
	if err != nil {
		return nil, nil, 0, s.compactFailed(nil, err)
	}
	if err := j.sync(); err != nil {
		return nil, nil, 0, s.compactFailed(r, err)
	}
	s.syncMu.Lock()
	caughtUp := bytes.Clone(s.tail)
	s.syncMu.Unlock()
	if err := j.append(caughtUp); err != nil {
		return nil, nil, 0, s.compactFailed(r, err)
	}
	if err := j.sync(); err != nil {
		return nil, nil, 0, s.compactFailed(r, err)
	}
	return j, r, len(caughtUp), nil
}

// joinNewJournal is step 3: holding up journal writes (c.Held), the rest
// of the tail goes to the new file, which from then on, until it is in
// place, gets every batch too: each is synced in both files before its
// ACKs leave, so whichever file the journal's name points at after a
// crash holds it.
func (s *Store) joinNewJournal(j *journalFile, r *atomicfile.Replacement, written int, c *Compaction) error {
	s.syncMu.Lock()
	if s.failed != nil { // the old journal failed, or the store was closed
		s.compacting, s.tail = false, nil
		s.syncMu.Unlock()
		r.Abort()
		return s.failed
	}
	held := time.Now()
	if err := j.append(s.tail[written:]); err != nil {
		s.syncMu.Unlock()
		return s.compactFailed(r, err)
	}
	s.shadow, s.tail = j, nil
	c.Held = time.Since(held)
	s.syncMu.Unlock()
	return nil
}

// commitNewJournal is step 4: sync the new file, rename it over the
// journal and sync the directory (syncs go on, in both files), then
// write on in the new file only. live is how many records the snapshot
// had.
func (s *Store) commitNewJournal(j *journalFile, r *atomicfile.Replacement, live int) error {
	err := r.Commit() // fsync, rename, fsync of the directory

	s.syncMu.Lock()
	defer s.syncMu.Unlock()
	s.shadow, s.compacting = nil, false
	switch {
	case err != nil && r.Renamed():
		// The name points at the new file, but the directory may not
		// be durable: after a crash it may be either file. Both have
		// every record so far; write no more to either.
		r.Abort()
		if s.failed == nil {
			s.failed = fmt.Errorf("compact leases: %w", err)
		}
		return s.failed
	case err != nil:
		s.retryAfter = s.fileRecords + s.compactMin
		r.Abort()
		return fmt.Errorf("compact leases: %w", err)
	case s.failed != nil: // a write failed meanwhile, or the store was closed
		r.Abort()
		return s.failed
	}
	s.journal.f.Close()
	s.journal, s.fileRecords = j, live+s.tailRecords
	s.retryAfter = 0
	return nil
}

// beforeCommit, set by tests, runs in Compact while grants are written to
// both journals (the new one still at its temporary name).
var beforeCommit func(newJournal string)

// Compaction is what one Compact did, and what it cost the grants going
// on meanwhile.
type Compaction struct {
	// Live is how many records the new journal started with.
	Live int
	// Stopped is how long offers and grants waited: while the live
	// records were copied.
	Stopped time.Duration
	// Held is how long ACKs waited beyond their own sync (Sync was
	// blocked): while the rest of the tail went to the new journal. While
	// the new journal is made durable and renamed into place, each sync
	// writes to both files instead.
	Held time.Duration
}

// compactFailed ends a compaction that could not write its new journal:
// the old one stays, and the next compaction waits until the journal has
// grown again.
func (s *Store) compactFailed(r *atomicfile.Replacement, err error) error {
	if r != nil {
		r.Abort()
	}
	s.syncMu.Lock()
	defer s.syncMu.Unlock()
	s.compacting, s.tail = false, nil
	s.retryAfter = s.fileRecords + s.compactMin
	return fmt.Errorf("compact leases: %w", err)
}

// Close closes the journal. Records not yet synced are dropped, as a
// crash would drop them: none of them was acknowledged.
func (s *Store) Close() error {
	s.syncMu.Lock()
	defer s.syncMu.Unlock()
	if s.failed == nil {
		s.failed = errors.New("lease store closed")
	}
	return s.journal.f.Close()
}

// syncData makes a file's data durable; a variable so that a test can take
// it away and see the power-loss test fail.
var syncData = fdatasync

func fdatasync(f *os.File) error {
	rc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	if err := rc.Control(func(fd uintptr) {
		for {
			if serr = unix.Fdatasync(int(fd)); serr != unix.EINTR {
				return
			}
		}
	}); err != nil {
		return err
	}
	return serr
}

// leaseFileName is the journal's name in the state directory.
const leaseFileName = "leases.jsonl"

// isTemp reports whether name is a temporary file atomicfile left behind
// for the journal when a crash interrupted a rewrite.
func isTemp(name string) bool {
	return strings.HasPrefix(name, "."+leaseFileName+".tmp")
}
