package atomicfile

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"testing"
)

func TestWriteAndCreate(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "f")
	if err := Write(p, []byte("one"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := Write(p, []byte("two"), 0o600); err != nil {
		t.Fatal(err)
	}
	if got, _ := os.ReadFile(p); string(got) != "two" {
		t.Errorf("content %q, want two", got)
	}
	if fi, _ := os.Stat(p); fi.Mode().Perm() != 0o600 {
		t.Errorf("mode %v", fi.Mode().Perm())
	}
	if err := Create(p, []byte("three"), 0o600); !errors.Is(err, fs.ErrExist) {
		t.Errorf("Create over an existing file: %v", err)
	}
	if got, _ := os.ReadFile(p); string(got) != "two" {
		t.Errorf("Create changed an existing file: %q", got)
	}
	if err := Create(filepath.Join(dir, "g"), []byte("new"), 0o644); err != nil {
		t.Fatal(err)
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 2 {
		t.Errorf("temporary files left behind: %v", entries)
	}
}

func TestReplacement(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "journal")
	if err := Write(p, []byte("old"), 0o600); err != nil {
		t.Fatal(err)
	}

	r, err := NewReplacement(p, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.WriteAt([]byte("new, then more"), 0); err != nil {
		t.Fatal(err)
	}
	if got, _ := os.ReadFile(p); string(got) != "old" {
		t.Fatalf("path changed before Commit: %q", got)
	}
	if err := r.Commit(); err != nil {
		t.Fatal(err)
	}
	// The file stays open as path: later writes land in it.
	if _, err := r.WriteAt([]byte("NEW"), 0); err != nil {
		t.Fatal(err)
	}
	r.Abort() // after Commit: only closes
	if got, _ := os.ReadFile(p); string(got) != "NEW, then more" {
		t.Errorf("content %q", got)
	}

	r, err = NewReplacement(p, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = r.Write([]byte("abandoned"))
	r.Abort()
	if got, _ := os.ReadFile(p); string(got) != "NEW, then more" {
		t.Errorf("Abort changed the file: %q", got)
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 1 {
		t.Errorf("temporary files left behind: %v", entries)
	}
}
