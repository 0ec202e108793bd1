// Package atomicfile writes files so that a crash at any moment leaves the
// old content or the new, never half of either: a temporary file in the
// same directory, synced, then renamed (or linked) into place, and the
// directory synced. Secrets, machine configs, state files and the
// emulated node's disk all go through it.
package atomicfile

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
)

// Write replaces path with data, mode perm.
func Write(path string, data []byte, perm fs.FileMode) error {
	tmp, err := writeTemp(path, data, perm)
	if err != nil {
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("write %s: %w", path, err)
	}
	return syncDir(filepath.Dir(path))
}

// Create writes data to path, mode perm, only if path does not exist yet;
// otherwise it fails with an error matching fs.ErrExist and leaves the
// existing file alone. Of racing callers exactly one succeeds.
func Create(path string, data []byte, perm fs.FileMode) error {
	tmp, err := writeTemp(path, data, perm)
	if err != nil {
		return err
	}
	defer os.Remove(tmp)
	if err := os.Link(tmp, path); err != nil {
		if errors.Is(err, fs.ErrExist) {
			return err
		}
		return fmt.Errorf("write %s: %w", path, err)
	}
	return syncDir(filepath.Dir(path))
}

// Replacement is a new version of a file, written under a temporary name
// beside it and put in its place by Commit, for content too large or too
// long in the making to pass to Write at once: a journal being compacted
// while records keep arriving, say. Until Commit the file at path is
// untouched; a crash leaves the temporary file (named ".BASE.tmp*"),
// which the owner may delete.
type Replacement struct {
	*os.File
	path      string
	committed bool
}

// NewReplacement starts a replacement of path, mode perm.
func NewReplacement(path string, perm fs.FileMode) (*Replacement, error) {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp*")
	if err != nil {
		return nil, fmt.Errorf("write %s: %w", path, err)
	}
	if err := f.Chmod(perm); err != nil {
		f.Close()
		os.Remove(f.Name())
		return nil, fmt.Errorf("write %s: %w", path, err)
	}
	return &Replacement{File: f, path: path}, nil
}

// Commit makes what was written durable and puts it in place of path:
// fsync, rename, fsync of the directory. When it returns nil, path is the
// new content for good. The file stays open, now as path.
func (r *Replacement) Commit() error {
	if err := r.Sync(); err != nil {
		return fmt.Errorf("write %s: %w", r.path, err)
	}
	if err := os.Rename(r.Name(), r.path); err != nil {
		return fmt.Errorf("write %s: %w", r.path, err)
	}
	r.committed = true
	return syncDir(filepath.Dir(r.path))
}

// Renamed reports whether Commit got as far as putting the file in
// place of path (even if it then failed to sync the directory).
func (r *Replacement) Renamed() bool { return r.committed }

// Abort closes the replacement and removes it, leaving path as it was.
// After Commit it only closes the file.
func (r *Replacement) Abort() {
	r.Close()
	if !r.committed {
		os.Remove(r.Name())
	}
}

func writeTemp(path string, data []byte, perm fs.FileMode) (string, error) {
	r, err := NewReplacement(path, perm)
	if err != nil {
		return "", err
	}
	if _, err = r.Write(data); err == nil {
		err = r.Sync()
	}
	if cerr := r.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(r.Name())
		return "", fmt.Errorf("write %s: %w", path, err)
	}
	return r.Name(), nil
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}
