//go:build integration

package powercut_test

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"cozy.dev/cozy/internal/testing/powercut"
)

// TestCutLosesWhatWasNotFlushed: the disk keeps what was fsynced and loses
// what was only written, so the tests built on it can fail.
func TestCutLosesWhatWasNotFlushed(t *testing.T) {
	d := powercut.New(t)
	synced := bytes.Repeat([]byte("synced "), 3000)
	written := bytes.Repeat([]byte("written "), 3000)

	f, err := os.Create(filepath.Join(d.Dir, "synced"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Write(synced); err != nil {
		t.Fatal(err)
	}
	flushes := d.Flushes()
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	f.Close()
	if d.Flushes() == flushes {
		t.Fatalf("fsync reached the disk without a flush: the loop device does not pass flushes on")
	}
	if err := syncDir(d.Dir); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(d.Dir, "written"), written, 0o644); err != nil {
		t.Fatal(err)
	}
	before := d.Cut(t)

	// The same, after the file system is synced as a whole.
	if err := syncFS(d.Dir); err != nil {
		t.Fatal(err)
	}
	after := d.Cut(t)

	before.Mount(t, func(dir string) {
		if got, err := os.ReadFile(filepath.Join(dir, "synced")); err != nil || !bytes.Equal(got, synced) {
			t.Errorf("the fsynced file did not survive the cut: %d bytes, %v", len(got), err)
		}
		if got, err := os.ReadFile(filepath.Join(dir, "written")); err == nil && bytes.Equal(got, written) {
			t.Errorf("a file written but never synced survived the cut whole: the disk keeps what a power loss would lose")
		}
	})
	after.Mount(t, func(dir string) {
		if got, err := os.ReadFile(filepath.Join(dir, "written")); err != nil || !bytes.Equal(got, written) {
			t.Errorf("after syncfs the file did not survive the cut: %d bytes, %v", len(got), err)
		}
	})
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

func syncFS(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return unix.Syncfs(int(d.Fd()))
}
