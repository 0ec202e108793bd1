// Package ociimage packs one static binary into an OCI image archive: an
// OCI image layout (image-spec v1.1) in a tar file, which `skopeo copy
// oci-archive:FILE docker://REGISTRY/NAME:TAG` pushes to any registry
// and which containerd and CRI-O import as they are. Cozy's images hold
// nothing but their binary, so they need no Dockerfile, no base image and
// no container engine to build, and the same inputs give the same bytes.
package ociimage

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	_ "crypto/sha256" // go-digest's sha256 digester
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"strconv"
	"strings"
	"time"

	"github.com/opencontainers/go-digest"
	"github.com/opencontainers/image-spec/specs-go"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

// Image describes what goes into the archive.
type Image struct {
	// Binary is the file to pack; it must be statically linked, as the
	// image holds no libraries.
	Binary string
	// Path is where the binary lands in the image, and its entrypoint
	// (for example /cozy-operator).
	Path string
	// User runs the entrypoint, "UID:GID" (numeric: the image has no
	// /etc/passwd).
	User string
	// Arch is the binary's GOARCH (amd64, arm64).
	Arch string
	// Tag names the image in the archive (its ref.name), like the tag it
	// will be pushed as.
	Tag string
	// Created is the image's date and every file's mtime; a fixed value
	// keeps the archive reproducible.
	Created time.Time
	// Labels are the image config's labels (org.opencontainers.image.*).
	Labels map[string]string
}

func (im Image) check() error {
	var errs []error
	if !path.IsAbs(im.Path) || path.Clean(im.Path) != im.Path || im.Path == "/" {
		errs = append(errs, fmt.Errorf("path %q: want a clean absolute file path such as /cozy-operator", im.Path))
	}
	if uid, gid, ok := strings.Cut(im.User, ":"); !ok || !numeric(uid) || !numeric(gid) {
		errs = append(errs, fmt.Errorf("user %q: want numeric UID:GID such as 65532:65532", im.User))
	}
	if im.Arch == "" {
		errs = append(errs, errors.New("no architecture"))
	}
	if im.Tag == "" || strings.ContainsAny(im.Tag, "/: ") {
		errs = append(errs, fmt.Errorf("tag %q: want a tag such as 0.1.0", im.Tag))
	}
	return errors.Join(errs...)
}

// numeric is a UID or GID: a decimal number of at most 32 bits.
func numeric(s string) bool {
	_, err := strconv.ParseUint(s, 10, 32)
	return err == nil
}

// Write packs the image and writes the archive to w.
func Write(w io.Writer, im Image) error {
	if err := im.check(); err != nil {
		return err
	}
	bin, err := os.ReadFile(im.Binary)
	if err != nil {
		return err
	}
	if !bytes.HasPrefix(bin, []byte("\x7fELF")) {
		return fmt.Errorf("%s is not an ELF binary", im.Binary)
	}
	created := im.Created.UTC()

	layerTar, err := tarFiles(created, file{name: strings.TrimPrefix(im.Path, "/"), mode: 0o755, data: bin})
	if err != nil {
		return err
	}
	layer, err := gzipped(layerTar)
	if err != nil {
		return err
	}
	config, err := json.Marshal(ocispec.Image{
		Created:  &created,
		Platform: ocispec.Platform{Architecture: im.Arch, OS: "linux"},
		Config: ocispec.ImageConfig{
			User:       im.User,
			Entrypoint: []string{im.Path},
			Labels:     im.Labels,
		},
		RootFS:  ocispec.RootFS{Type: "layers", DiffIDs: []digest.Digest{digest.FromBytes(layerTar)}},
		History: []ocispec.History{{Created: &created, CreatedBy: "cozy ociimage: " + im.Path}},
	})
	if err != nil {
		return err
	}
	manifest, err := json.Marshal(ocispec.Manifest{
		Versioned: specs.Versioned{SchemaVersion: 2},
		MediaType: ocispec.MediaTypeImageManifest,
		Config:    descriptor(ocispec.MediaTypeImageConfig, config),
		Layers:    []ocispec.Descriptor{descriptor(ocispec.MediaTypeImageLayerGzip, layer)},
	})
	if err != nil {
		return err
	}
	top := descriptor(ocispec.MediaTypeImageManifest, manifest)
	top.Annotations = map[string]string{ocispec.AnnotationRefName: im.Tag}
	top.Platform = &ocispec.Platform{Architecture: im.Arch, OS: "linux"}
	index, err := json.Marshal(ocispec.Index{
		Versioned: specs.Versioned{SchemaVersion: 2},
		MediaType: ocispec.MediaTypeImageIndex,
		Manifests: []ocispec.Descriptor{top},
	})
	if err != nil {
		return err
	}
	layout, err := json.Marshal(ocispec.ImageLayout{Version: ocispec.ImageLayoutVersion})
	if err != nil {
		return err
	}

	files := []file{
		{name: ocispec.ImageLayoutFile, mode: 0o644, data: layout},
		{name: ocispec.ImageIndexFile, mode: 0o644, data: index},
	}
	for _, blob := range [][]byte{config, layer, manifest} {
		files = append(files, file{name: "blobs/sha256/" + digest.FromBytes(blob).Encoded(), mode: 0o644, data: blob})
	}
	archive, err := tarFiles(created, files...)
	if err != nil {
		return err
	}
	_, err = w.Write(archive)
	return err
}

func descriptor(mediaType string, data []byte) ocispec.Descriptor {
	return ocispec.Descriptor{MediaType: mediaType, Digest: digest.FromBytes(data), Size: int64(len(data))}
}

type file struct {
	name string
	mode int64
	data []byte
}

// tarFiles makes a tar of the files and the directories above them,
// owned by root, all dated t.
func tarFiles(t time.Time, files ...file) ([]byte, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	dirs := map[string]bool{}
	for _, f := range files {
		var parents []string
		for d := path.Dir(f.name); d != "." && !dirs[d]; d = path.Dir(d) {
			dirs[d] = true
			parents = append([]string{d}, parents...)
		}
		for _, d := range parents {
			if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: d + "/", Mode: 0o755, ModTime: t, Format: tar.FormatPAX}); err != nil {
				return nil, err
			}
		}
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: f.name, Mode: f.mode, Size: int64(len(f.data)), ModTime: t, Format: tar.FormatPAX}); err != nil {
			return nil, err
		}
		if _, err := tw.Write(f.data); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// gzipped compresses without a name or date in the header, so the
// layer's digest depends on its content only.
func gzipped(data []byte) ([]byte, error) {
	var buf bytes.Buffer
	zw, err := gzip.NewWriterLevel(&buf, gzip.BestCompression)
	if err != nil {
		return nil, err
	}
	if _, err := zw.Write(data); err != nil {
		return nil, err
	}
	if err := zw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}
