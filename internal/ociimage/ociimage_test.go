package ociimage

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

// fakeBinary is enough of an ELF file for Write, which only checks the
// magic number.
func fakeBinary(t *testing.T) string {
	t.Helper()
	f := filepath.Join(t.TempDir(), "bin")
	if err := os.WriteFile(f, []byte("\x7fELF fake static binary"), 0o755); err != nil {
		t.Fatal(err)
	}
	return f
}

func valid(t *testing.T) Image {
	return Image{
		Binary: fakeBinary(t), Path: "/cozy-operator", User: "65532:65532", Arch: "amd64", Tag: "0.1.0",
		Created: time.Date(2026, 11, 30, 0, 0, 0, 0, time.UTC),
		Labels:  map[string]string{"org.opencontainers.image.version": "0.1.0"},
	}
}

// untar reads an archive into a map of file name to content.
func untar(t *testing.T, data []byte) map[string][]byte {
	t.Helper()
	out := map[string][]byte{}
	tr := tar.NewReader(bytes.NewReader(data))
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		out[h.Name] = b
		if h.Typeflag == tar.TypeReg && strings.HasSuffix(h.Name, "cozy-operator") && h.Mode != 0o755 {
			t.Errorf("%s: mode %o, want 755", h.Name, h.Mode)
		}
	}
}

// blob reads a descriptor's blob and checks its digest and size.
func blob(t *testing.T, files map[string][]byte, d ocispec.Descriptor) []byte {
	t.Helper()
	b, ok := files["blobs/sha256/"+d.Digest.Encoded()]
	if !ok {
		t.Fatalf("no blob for %s %s", d.MediaType, d.Digest)
	}
	if digest.FromBytes(b) != d.Digest || int64(len(b)) != d.Size {
		t.Fatalf("blob %s: digest %s size %d, descriptor says %s %d", d.MediaType, digest.FromBytes(b), len(b), d.Digest, d.Size)
	}
	return b
}

// TestWrite follows the archive as a registry client would: index,
// manifest, config, layer, each blob checked against its digest.
func TestWrite(t *testing.T) {
	im := valid(t)
	var buf bytes.Buffer
	if err := Write(&buf, im); err != nil {
		t.Fatal(err)
	}
	files := untar(t, buf.Bytes())

	var layout ocispec.ImageLayout
	if err := json.Unmarshal(files[ocispec.ImageLayoutFile], &layout); err != nil || layout.Version != ocispec.ImageLayoutVersion {
		t.Fatalf("oci-layout %s (%v)", files[ocispec.ImageLayoutFile], err)
	}
	var index ocispec.Index
	if err := json.Unmarshal(files[ocispec.ImageIndexFile], &index); err != nil || len(index.Manifests) != 1 {
		t.Fatalf("index.json %s (%v)", files[ocispec.ImageIndexFile], err)
	}
	top := index.Manifests[0]
	if top.Annotations[ocispec.AnnotationRefName] != "0.1.0" || top.Platform == nil || top.Platform.Architecture != "amd64" {
		t.Errorf("index entry %+v", top)
	}
	var manifest ocispec.Manifest
	if err := json.Unmarshal(blob(t, files, top), &manifest); err != nil || len(manifest.Layers) != 1 {
		t.Fatalf("manifest: %v", err)
	}
	var config ocispec.Image
	if err := json.Unmarshal(blob(t, files, manifest.Config), &config); err != nil {
		t.Fatal(err)
	}
	if c := config.Config; c.User != "65532:65532" || len(c.Entrypoint) != 1 || c.Entrypoint[0] != "/cozy-operator" || c.Labels["org.opencontainers.image.version"] != "0.1.0" {
		t.Errorf("image config %+v", c)
	}
	if config.OS != "linux" || config.Architecture != "amd64" || !config.Created.Equal(im.Created) {
		t.Errorf("image platform %s/%s created %v", config.OS, config.Architecture, config.Created)
	}
	zr, err := gzip.NewReader(bytes.NewReader(blob(t, files, manifest.Layers[0])))
	if err != nil {
		t.Fatal(err)
	}
	layer, err := io.ReadAll(zr)
	if err != nil {
		t.Fatal(err)
	}
	if len(config.RootFS.DiffIDs) != 1 || config.RootFS.DiffIDs[0] != digest.FromBytes(layer) {
		t.Errorf("diff_ids %v, the layer is %s", config.RootFS.DiffIDs, digest.FromBytes(layer))
	}
	want, _ := os.ReadFile(im.Binary)
	if got := untar(t, layer); len(got) != 1 || !bytes.Equal(got["cozy-operator"], want) {
		t.Errorf("layer holds %d files, want just cozy-operator with the binary", len(got))
	}

	var again bytes.Buffer
	if err := Write(&again, im); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(buf.Bytes(), again.Bytes()) {
		t.Error("two archives of the same image differ")
	}
}

func TestWriteRejects(t *testing.T) {
	for name, tc := range map[string]struct {
		mutate func(*Image)
		want   string
	}{
		"relative path":   {func(im *Image) { im.Path = "cozy-operator" }, "clean absolute"},
		"root path":       {func(im *Image) { im.Path = "/" }, "clean absolute"},
		"unclean path":    {func(im *Image) { im.Path = "/a/../cozy-operator" }, "clean absolute"},
		"named user":      {func(im *Image) { im.User = "nobody" }, "numeric UID:GID"},
		"user no group":   {func(im *Image) { im.User = "65532" }, "numeric UID:GID"},
		"no arch":         {func(im *Image) { im.Arch = "" }, "no architecture"},
		"tag with colon":  {func(im *Image) { im.Tag = "cozy:0.1" }, "want a tag"},
		"no tag":          {func(im *Image) { im.Tag = "" }, "want a tag"},
		"missing binary":  {func(im *Image) { im.Binary = "/nonexistent" }, "no such file"},
		"not an ELF file": {func(im *Image) { _ = os.WriteFile(im.Binary, []byte("#!/bin/sh\n"), 0o755) }, "not an ELF binary"},
	} {
		t.Run(name, func(t *testing.T) {
			im := valid(t)
			tc.mutate(&im)
			err := Write(io.Discard, im)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %v, want one containing %q", err, tc.want)
			}
		})
	}
}
