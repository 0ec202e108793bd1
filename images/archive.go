package images

import (
	"archive/tar"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
)

// Open reads the images at path: an OCI image layout directory
// (OpenLayout) or an OCI archive file (OpenArchive). Close the result.
func Open(path string) (*Layout, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("OCI layout or archive %s: %w", path, err)
	}
	if fi.Mode().IsRegular() {
		return OpenArchive(path)
	}
	return OpenLayout(path)
}

// OpenArchive reads an OCI archive: an OCI image layout in a tar file, as
// `make image` writes cozy-operator's (and skopeo's oci-archive:
// transport). It unpacks the archive into a temporary directory, which
// Close removes. Only directories and regular files with local names are
// accepted: a link, a device or a name leaving the archive is an error.
func OpenArchive(file string) (*Layout, error) { return openArchive(file, "") }

// openArchive is OpenArchive unpacking under tmp (empty: os.TempDir()).
func openArchive(file, tmp string) (*Layout, error) {
	dir, err := os.MkdirTemp(tmp, "cozy-oci-archive-")
	if err != nil {
		return nil, err
	}
	if err := unpackArchive(file, dir); err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("OCI archive %s: %w", file, err)
	}
	l, err := OpenLayout(dir)
	if err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("OCI archive %s: %w", file, err)
	}
	l.unpacked, l.archive = dir, file
	return l, nil
}

// Close removes what OpenArchive unpacked; for a layout directory it does
// nothing.
func (l *Layout) Close() error {
	if l.unpacked == "" {
		return nil
	}
	return os.RemoveAll(l.unpacked)
}

func unpackArchive(file, dir string) error {
	f, err := os.Open(file)
	if err != nil {
		return err
	}
	defer f.Close()
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("not a tar file: %w", err)
		}
		if !filepath.IsLocal(h.Name) {
			return fmt.Errorf("entry %q: a name outside the archive", h.Name)
		}
		path := filepath.Join(dir, h.Name)
		switch h.Typeflag {
		case tar.TypeDir:
			err = os.MkdirAll(path, 0o755)
		case tar.TypeReg:
			err = writeEntry(path, tr)
		default:
			err = fmt.Errorf("entry %q: type %q, want a directory or a regular file", h.Name, h.Typeflag)
		}
		if err != nil {
			return err
		}
	}
}

func writeEntry(path string, r io.Reader) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, r); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
