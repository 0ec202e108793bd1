//go:build integration

package atomicfile_test

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"testing"

	"cozy.dev/cozy/internal/atomicfile"
	"cozy.dev/cozy/internal/testing/powercut"
)

// TestWriteSurvivesPowerLoss cuts the power at 24 random moments while
// one file is replaced with atomicfile.Write over and over, and checks
// each disk a cut leaves: the file is one whole version, never torn, and
// never older than the last version whose Write had returned. A file made
// once with Create is there every time. The emulated node's machine
// config and the bootstrap's state and secrets are written this way.
func TestWriteSurvivesPowerLoss(t *testing.T) {
	d := powercut.New(t)
	path := filepath.Join(d.Dir, "config")
	if err := atomicfile.Create(filepath.Join(d.Dir, "created"), version(0), 0o600); err != nil {
		t.Fatal(err)
	}
	cuts := d.CutWhile(t, 24, func(n int64) error { return atomicfile.Write(path, version(n), 0o600) })

	unflushed := 0
	for i, c := range cuts {
		unflushed += c.Unflushed
		c.Mount(t, func(dir string) {
			if got, err := os.ReadFile(filepath.Join(dir, "created")); err != nil || !bytes.Equal(got, version(0)) {
				t.Errorf("cut %d: the file made with Create is gone or damaged (%d bytes, %v)", i, len(got), err)
			}
			data, err := os.ReadFile(filepath.Join(dir, "config"))
			if errors.Is(err, fs.ErrNotExist) && c.Done == 0 {
				return
			}
			if err != nil {
				t.Errorf("cut %d: %v", i, err)
				return
			}
			n, err := parseVersion(data)
			switch {
			case err != nil:
				t.Errorf("cut %d (Write had returned for version %d): %v", i, c.Done, err)
			case n < c.Done || n > c.Started:
				t.Errorf("cut %d: found version %d; Write had returned for %d and started %d", i, n, c.Done, c.Started)
			}
		})
	}
	if unflushed == 0 {
		t.Fatalf("no cut found an unflushed write: the test never risked losing one")
	}
	t.Logf("%d cuts, the last after %d versions; %d unflushed blocks at the cuts, half of them kept", len(cuts), cuts[len(cuts)-1].Done, unflushed)
}

// version is the content of version n: a header, a body whose length
// varies (1 to 40 KiB, so a version spans several blocks) and a checksum.
func version(n int64) []byte {
	body := bytes.Repeat([]byte{byte('a' + n%26)}, 1+int(n*7919%40960))
	sum := sha256.Sum256(body)
	return fmt.Appendf(nil, "version %d %x\n%s", n, sum, body)
}

func parseVersion(data []byte) (int64, error) {
	var n int64
	var sum []byte
	header, body, ok := bytes.Cut(data, []byte("\n"))
	if _, err := fmt.Sscanf(string(header), "version %d %x", &n, &sum); err != nil || !ok {
		return 0, fmt.Errorf("torn file (%d bytes): no header", len(data))
	}
	if got := sha256.Sum256(body); !bytes.Equal(got[:], sum) {
		return 0, fmt.Errorf("torn file: version %d's body does not match its checksum", n)
	}
	return n, nil
}
