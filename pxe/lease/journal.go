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

// journalFile is the open journal: where the next record goes and how far
// the zero-filled tail reaches. Only the holder of Store.syncMu uses it.
type journalFile struct {
	f         *os.File
	off       int64 // end of the last record
	allocated int64 // end of the zero-filled tail (the file's size)
}

// writeJournal replaces the journal at path, crash-safely, with content
// and a zero-filled tail, and opens it for appending.
func writeJournal(path string, content []byte) (*journalFile, error) {
	data := make([]byte, len(content)+preallocate)
	copy(data, content)
	if err := atomicfile.Write(path, data, 0o600); err != nil {
		return nil, fmt.Errorf("write leases: %w", err)
	}
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return nil, fmt.Errorf("open leases: %w", err)
	}
	return &journalFile{f: f, off: int64(len(content)), allocated: int64(len(data))}, nil
}

// write puts data after the last record, extending the zero-filled tail
// first if data would reach past it, then makes it durable. Only the
// extension (once per preallocate bytes) changes the file's size.
func (j *journalFile) write(data []byte) error {
	end := j.off + int64(len(data))
	if end > j.allocated {
		target := end + preallocate
		for at := j.allocated; at < target; {
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
	if err := fdatasync(j.f); err != nil {
		return fmt.Errorf("sync lease journal: %w", err)
	}
	return nil
}

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
