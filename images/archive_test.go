package images

import (
	"archive/tar"
	"bytes"
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote"
)

// tarDir packs the tree under dir into a tar file, as an OCI archive
// holds its layout.
func tarDir(t *testing.T, dir string) string {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	if err := tw.AddFS(os.DirFS(dir)); err != nil {
		t.Fatal(err)
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "images.tar")
	if err := os.WriteFile(file, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	return file
}

// TestOpenArchive: an OCI archive is read as the layout it holds, mirrored
// with its digests, and Close leaves nothing behind; Open tells an
// archive from a layout directory.
func TestOpenArchive(t *testing.T) {
	tmp := t.TempDir()
	t.Setenv("TMPDIR", tmp)
	arts := map[string]*Artifact{
		"ghcr.io/cozy-dev/cozy-operator:0.1.0": artifact(t, false),
		"registry.k8s.io/pause:3.10.1":         artifact(t, true),
	}
	dir := writeLayout(t, arts)
	file := tarDir(t, dir)

	src, err := Open(file)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := src.Refs(), []string{"ghcr.io/cozy-dev/cozy-operator:0.1.0", "registry.k8s.io/pause:3.10.1"}; !slices.Equal(got, want) {
		t.Errorf("refs %v, want %v", got, want)
	}
	if s := src.String(); s != "OCI archive "+file {
		t.Errorf("String() = %q", s)
	}
	reg := startRegistry(t)
	if _, err := Mirror(context.Background(), MirrorOptions{Registry: reg, Insecure: true, Source: src, Refs: src.Refs()}); err != nil {
		t.Fatal(err)
	}
	for ref, a := range arts {
		r, err := name.ParseReference(reg+"/"+ref, name.Insecure)
		if err != nil {
			t.Fatal(err)
		}
		desc, err := remote.Head(r)
		if err != nil {
			t.Fatalf("%s: %v", ref, err)
		}
		if desc.Digest != a.Digest {
			t.Errorf("%s: digest %s in the registry, %s in the archive", ref, desc.Digest, a.Digest)
		}
	}
	if err := src.Close(); err != nil {
		t.Fatal(err)
	}
	if left, _ := os.ReadDir(tmp); len(left) != 0 {
		t.Errorf("Close left %v in the temporary directory", left)
	}

	l, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	if s := l.String(); s != "OCI layout "+dir {
		t.Errorf("String() = %q", s)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "index.json")); err != nil {
		t.Errorf("Close of a layout directory touched it: %v", err)
	}
}

// TestOpenArchiveBroken: an archive that is not one, or that would write
// outside its directory, is refused with the reason, and nothing is left
// behind.
func TestOpenArchiveBroken(t *testing.T) {
	type entry struct {
		name, link string
		typ        byte
		data       string
	}
	archive := func(entries ...entry) []byte {
		var buf bytes.Buffer
		tw := tar.NewWriter(&buf)
		for _, e := range entries {
			h := &tar.Header{Name: e.name, Typeflag: e.typ, Linkname: e.link, Mode: 0o644, Size: int64(len(e.data))}
			if e.typ != tar.TypeReg {
				h.Size = 0
			}
			if err := tw.WriteHeader(h); err != nil {
				t.Fatal(err)
			}
			if _, err := tw.Write([]byte(e.data)); err != nil && e.typ == tar.TypeReg {
				t.Fatal(err)
			}
		}
		if err := tw.Close(); err != nil {
			t.Fatal(err)
		}
		return buf.Bytes()
	}
	layout := entry{name: "oci-layout", typ: tar.TypeReg, data: `{"imageLayoutVersion":"1.0.0"}`}
	for _, tc := range []struct {
		name string
		data []byte
		want string
	}{
		{"not a tar file", []byte(strings.Repeat("not a tar file ", 100)), "not a tar file"},
		{"a name leaving the archive", archive(entry{name: "../index.json", typ: tar.TypeReg, data: "{}"}), `entry "../index.json": a name outside the archive`},
		{"an absolute name", archive(entry{name: "/etc/index.json", typ: tar.TypeReg, data: "{}"}), "a name outside the archive"},
		{"a symlink", archive(layout, entry{name: "index.json", typ: tar.TypeSymlink, link: "/etc/passwd"}), `entry "index.json": type '2', want a directory or a regular file`},
		{"an entry twice", archive(layout, layout), "oci-layout: file exists"},
		{"no index.json", archive(layout), "index.json: no such file"},
		{"index.json not JSON", archive(layout, entry{name: "index.json", typ: tar.TypeReg, data: "nope"}), "index.json"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tmp := t.TempDir()
			t.Setenv("TMPDIR", tmp)
			file := filepath.Join(t.TempDir(), "broken.tar")
			if err := os.WriteFile(file, tc.data, 0o644); err != nil {
				t.Fatal(err)
			}
			_, err := Open(file)
			if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.HasPrefix(err.Error(), "OCI archive "+file+": ") {
				t.Errorf("Open: %v, want an error naming the archive and %q", err, tc.want)
			}
			if left, _ := os.ReadDir(tmp); len(left) != 0 {
				t.Errorf("a refused archive left %v", left)
			}
		})
	}
}

// FuzzOpenArchive: whatever the file holds, OpenArchive returns a layout
// or an error, writes nothing outside its temporary directory, and leaves
// nothing once refused or closed.
func FuzzOpenArchive(f *testing.F) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for name, data := range map[string]string{"oci-layout": `{"imageLayoutVersion":"1.0.0"}`, "index.json": `{"schemaVersion":2,"manifests":[]}`} {
		_ = tw.WriteHeader(&tar.Header{Name: name, Typeflag: tar.TypeReg, Mode: 0o644, Size: int64(len(data))})
		_, _ = tw.Write([]byte(data))
	}
	_ = tw.Close()
	f.Add(buf.Bytes())
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, data []byte) {
		tmp := t.TempDir()
		file := filepath.Join(t.TempDir(), "fuzz.tar")
		if err := os.WriteFile(file, data, 0o644); err != nil {
			t.Fatal(err)
		}
		if l, err := openArchive(file, tmp); err == nil {
			if err := l.Close(); err != nil {
				t.Fatal(err)
			}
		}
		if left, _ := os.ReadDir(tmp); len(left) != 0 {
			t.Errorf("left %v", left)
		}
	})
}
