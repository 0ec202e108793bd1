// Package ociimage builds OCI images (image-spec v1.1) from files on
// disk, with no Dockerfile, base image or container engine: an image is
// a list of layers, each a list of files, directories and symlinks, and a
// config (entrypoint, user, env...). It writes them either as an OCI
// archive holding one image (an OCI image layout in a tar file, which
// `skopeo copy oci-archive:FILE:REF docker://...` pushes), or as an OCI
// image layout directory holding many images, each named by its full
// reference, which the lab's registry mirror is filled from.
//
// The same inputs give the same bytes: every file is owned by 0:0 and
// dated Image.Created, entries are sorted by path, and layers are plain
// tar (application/vnd.oci.image.layer.v1.tar), which also spares the
// lab's emulated VMs a gunzip of every layer they pull.
package ociimage

import (
	"archive/tar"
	_ "crypto/sha256" // go-digest's sha256 digester
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/opencontainers/go-digest"
	"github.com/opencontainers/image-spec/specs-go"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

// AnnotationContainerdImageName is the index annotation containerd's
// `ctr images import` names an image by; with
// org.opencontainers.image.ref.name set to the same full reference, both
// containerd and go-containerregistry's layout readers find the image
// under its upstream name.
const AnnotationContainerdImageName = "io.containerd.image.name"

// Image is one image: its layers, bottom first, and how it runs.
type Image struct {
	// Ref names the image in the index: a full reference such as
	// registry.k8s.io/pause:3.10.1 (always, in a layout), or in an
	// archive a bare tag such as 0.1.0.
	Ref string
	// Arch is the GOARCH its programs are built for (amd64, arm64).
	Arch string
	// Created is the image's date and every file's mtime; a fixed value
	// keeps the image reproducible.
	Created time.Time
	// Layers are applied bottom first; each must hold at least one file.
	Layers []Layer
	// DataOnly marks an image that no runtime starts, only reads (a
	// KubeVirt containerDisk): it needs no entrypoint.
	DataOnly bool
	// Config is how a runtime starts the container: Entrypoint and Cmd,
	// Env, WorkingDir, Labels, ExposedPorts. User is empty (root) or a
	// numeric UID:GID, so it needs no /etc/passwd.
	Config ocispec.ImageConfig
}

// Layer is one layer of an image.
type Layer struct {
	// Files are its entries. Directories above a file that are not
	// listed are added, mode 0755.
	Files []File
	// CreatedBy says what made the layer, in the image's history.
	CreatedBy string
}

// File is one entry of a layer: a regular file, a directory or a
// symlink, owned by root.
type File struct {
	// Path is where it lands in the image: absolute and clean.
	Path string
	// Mode is its type (0 for a regular file, fs.ModeDir, fs.ModeSymlink)
	// and permissions, with fs.ModeSetuid, fs.ModeSetgid and
	// fs.ModeSticky.
	Mode fs.FileMode
	// Source is the file on disk a regular file's content is read from,
	// when it is read; otherwise the content is Data.
	Source string
	Data   []byte
	// Target is a symlink's target, as readlink returns it.
	Target string
	// Xattrs are extended attributes, such as security.capability for a
	// binary that binds a low port as a non-root user.
	Xattrs map[string]string
}

// DirLayer makes a layer of the tree under root (for example a root
// file system extracted from Debian packages), root becoming / in the
// image. It keeps file modes and symlinks; owners and dates are the
// image's. Contents are read when the image is written.
func DirLayer(root, createdBy string) (Layer, error) {
	layer := Layer{CreatedBy: createdBy}
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if p == root {
			return nil
		}
		rel, err := filepath.Rel(root, p)
		if err != nil {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		f := File{Path: "/" + filepath.ToSlash(rel), Mode: info.Mode() & (fs.ModeType | fs.ModePerm | fs.ModeSetuid | fs.ModeSetgid | fs.ModeSticky)}
		switch info.Mode().Type() {
		case 0:
			f.Source = p
		case fs.ModeDir:
		case fs.ModeSymlink:
			if f.Target, err = os.Readlink(p); err != nil {
				return err
			}
		default:
			return fmt.Errorf("%s: a %s, want a regular file, a directory or a symlink", p, info.Mode().Type())
		}
		layer.Files = append(layer.Files, f)
		return nil
	})
	if err != nil {
		return Layer{}, fmt.Errorf("layer of %s: %w", root, err)
	}
	if len(layer.Files) == 0 {
		return Layer{}, fmt.Errorf("layer of %s: the directory is empty", root)
	}
	return layer, nil
}

// Write writes the image to w as an OCI archive: an OCI image layout, in
// a tar file, whose index names the image Ref.
func Write(w io.Writer, im Image) error {
	if err := im.check(false); err != nil {
		return err
	}
	// The archive's tar headers need each layer's size before its bytes,
	// so layers are made twice: once to measure and digest them, once
	// into the archive, where the digest is checked again.
	p, err := pack(im, func(l Layer, t time.Time) (ocispec.Descriptor, error) {
		return writeLayer(io.Discard, l, t)
	})
	if err != nil {
		return err
	}
	index, err := indexJSON([]packed{p})
	if err != nil {
		return err
	}
	created := im.Created.UTC().Truncate(time.Second)
	tw := tar.NewWriter(w)
	small := func(name string, data []byte) error {
		return writeEntry(tw, entry{name: name, mode: 0o644, data: data}, created)
	}
	if err := small(ocispec.ImageLayoutFile, layoutJSON); err != nil {
		return err
	}
	if err := small(ocispec.ImageIndexFile, index); err != nil {
		return err
	}
	for _, d := range []string{"blobs/", "blobs/sha256/"} {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: d, Mode: 0o755, ModTime: created, Format: tar.FormatPAX}); err != nil {
			return err
		}
	}
	written := map[digest.Digest]bool{}
	for _, b := range []struct {
		desc ocispec.Descriptor
		data []byte
	}{{p.config, p.configJSON}, {p.top, p.manifestJSON}} {
		if err := small(blobPath(b.desc.Digest), b.data); err != nil {
			return err
		}
		written[b.desc.Digest] = true
	}
	for i, l := range im.Layers {
		desc := p.layers[i]
		if written[desc.Digest] {
			continue
		}
		written[desc.Digest] = true
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: blobPath(desc.Digest), Mode: 0o644, Size: desc.Size, ModTime: created, Format: tar.FormatPAX}); err != nil {
			return err
		}
		again, err := writeLayer(tw, l, created)
		if err != nil {
			return err
		}
		if again.Digest != desc.Digest {
			return fmt.Errorf("layer %d (%s) changed while the archive was written", i, l.CreatedBy)
		}
	}
	return tw.Close()
}

// WriteLayout writes the images into dir, which must be empty or not
// exist yet, as one OCI image layout: blobs shared between images are
// stored once, and each image's entry in index.json carries its full
// reference in both org.opencontainers.image.ref.name and
// io.containerd.image.name. index.json is written last, so a layout
// that has one is whole.
func WriteLayout(dir string, images ...Image) error {
	if len(images) == 0 {
		return errors.New("no images to write")
	}
	refs := map[string]bool{}
	for _, im := range images {
		if err := im.check(true); err != nil {
			return fmt.Errorf("image %s: %w", im.Ref, err)
		}
		if refs[im.Ref] {
			return fmt.Errorf("image %s is listed twice", im.Ref)
		}
		refs[im.Ref] = true
	}
	if entries, err := os.ReadDir(dir); err == nil && len(entries) > 0 {
		return fmt.Errorf("%s is not empty: write a layout into a new directory", dir)
	}
	blobs := filepath.Join(dir, "blobs", "sha256")
	if err := os.MkdirAll(blobs, 0o755); err != nil {
		return err
	}
	writeBlob := func(d digest.Digest, data []byte) error {
		return os.WriteFile(filepath.Join(dir, filepath.FromSlash(blobPath(d))), data, 0o644)
	}
	var all []packed
	for _, im := range images {
		p, err := pack(im, func(l Layer, t time.Time) (ocispec.Descriptor, error) {
			return writeLayerBlob(blobs, l, t)
		})
		if err != nil {
			return fmt.Errorf("image %s: %w", im.Ref, err)
		}
		if err := writeBlob(p.config.Digest, p.configJSON); err != nil {
			return err
		}
		if err := writeBlob(p.top.Digest, p.manifestJSON); err != nil {
			return err
		}
		all = append(all, p)
	}
	index, err := indexJSON(all)
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, ocispec.ImageLayoutFile), layoutJSON, 0o644); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, ocispec.ImageIndexFile), index, 0o644)
}

// writeLayerBlob streams the layer into a temporary file among the
// blobs, then renames it to its digest (or drops it, when another image
// already stored the same layer).
func writeLayerBlob(blobs string, l Layer, t time.Time) (ocispec.Descriptor, error) {
	f, err := os.CreateTemp(blobs, ".layer-*")
	if err != nil {
		return ocispec.Descriptor{}, err
	}
	defer os.Remove(f.Name())
	desc, err := writeLayer(f, l, t)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return ocispec.Descriptor{}, err
	}
	if err := os.Chmod(f.Name(), 0o644); err != nil {
		return ocispec.Descriptor{}, err
	}
	return desc, os.Rename(f.Name(), filepath.Join(blobs, desc.Digest.Encoded()))
}

var layoutJSON = []byte(`{"imageLayoutVersion":"` + ocispec.ImageLayoutVersion + `"}`)

func blobPath(d digest.Digest) string { return "blobs/" + d.Algorithm().String() + "/" + d.Encoded() }

// packed is an image made into blobs, all but its layers' bytes.
type packed struct {
	top                      ocispec.Descriptor // the manifest, as index.json lists it
	config                   ocispec.Descriptor
	configJSON, manifestJSON []byte
	layers                   []ocispec.Descriptor
}

// pack makes the image's config and manifest; layer writes each layer
// somewhere and returns its descriptor.
func pack(im Image, layer func(Layer, time.Time) (ocispec.Descriptor, error)) (packed, error) {
	created := im.Created.UTC()
	var p packed
	var diffIDs []digest.Digest
	var history []ocispec.History
	for i, l := range im.Layers {
		desc, err := layer(l, created)
		if err != nil {
			return packed{}, fmt.Errorf("layer %d (%s): %w", i, l.CreatedBy, err)
		}
		p.layers = append(p.layers, desc)
		diffIDs = append(diffIDs, desc.Digest) // uncompressed: the diff ID is the digest
		history = append(history, ocispec.History{Created: &created, CreatedBy: l.CreatedBy})
	}
	platform := ocispec.Platform{Architecture: im.Arch, OS: "linux"}
	var err error
	p.configJSON, err = json.Marshal(ocispec.Image{
		Created:  &created,
		Platform: platform,
		Config:   im.Config,
		RootFS:   ocispec.RootFS{Type: "layers", DiffIDs: diffIDs},
		History:  history,
	})
	if err != nil {
		return packed{}, err
	}
	p.config = descriptor(ocispec.MediaTypeImageConfig, p.configJSON)
	p.manifestJSON, err = json.Marshal(ocispec.Manifest{
		Versioned: specs.Versioned{SchemaVersion: 2},
		MediaType: ocispec.MediaTypeImageManifest,
		Config:    p.config,
		Layers:    p.layers,
	})
	if err != nil {
		return packed{}, err
	}
	p.top = descriptor(ocispec.MediaTypeImageManifest, p.manifestJSON)
	p.top.Platform = &platform
	p.top.Annotations = map[string]string{ocispec.AnnotationRefName: im.Ref}
	if fullRef.MatchString(im.Ref) {
		p.top.Annotations[AnnotationContainerdImageName] = im.Ref
	}
	return p, nil
}

func indexJSON(images []packed) ([]byte, error) {
	index := ocispec.Index{Versioned: specs.Versioned{SchemaVersion: 2}, MediaType: ocispec.MediaTypeImageIndex}
	for _, p := range images {
		index.Manifests = append(index.Manifests, p.top)
	}
	return json.Marshal(index)
}

func descriptor(mediaType string, data []byte) ocispec.Descriptor {
	return ocispec.Descriptor{MediaType: mediaType, Digest: digest.FromBytes(data), Size: int64(len(data))}
}

// Image references as the distribution spec writes them: a tag, and a
// full reference whose first component is a registry host (it holds a
// dot or a port, or is localhost), so that the mirror needs no default
// registry to push it.
var (
	tagRe   = `[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}`
	hostRe  = `(?:(?:localhost|[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)+)(?::[0-9]+)?|[A-Za-z0-9-]+:[0-9]+)`
	pathRe  = `[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*`
	bareTag = regexp.MustCompile(`^` + tagRe + `$`)
	fullRef = regexp.MustCompile(`^` + hostRe + `/` + pathRe + `:` + tagRe + `$`)
)

func (im Image) check(inLayout bool) error {
	var errs []error
	switch {
	case fullRef.MatchString(im.Ref):
	case !inLayout && bareTag.MatchString(im.Ref):
	case inLayout:
		errs = append(errs, fmt.Errorf("ref %q: want a full reference such as registry.k8s.io/pause:3.10.1", im.Ref))
	default:
		errs = append(errs, fmt.Errorf("ref %q: want a tag such as 0.1.0 or a full reference such as registry.k8s.io/pause:3.10.1", im.Ref))
	}
	if im.Arch == "" {
		errs = append(errs, errors.New("no architecture"))
	}
	if c := im.Config; c.User != "" {
		if uid, gid, ok := strings.Cut(c.User, ":"); !ok || !numeric(uid) || !numeric(gid) {
			errs = append(errs, fmt.Errorf("user %q: want numeric UID:GID such as 65532:65532, or none for root", c.User))
		}
	}
	if len(im.Config.Entrypoint) == 0 && len(im.Config.Cmd) == 0 && !im.DataOnly {
		errs = append(errs, errors.New("no entrypoint and no cmd: nothing to run"))
	}
	if wd := im.Config.WorkingDir; wd != "" && !path.IsAbs(wd) {
		errs = append(errs, fmt.Errorf("working dir %q: want an absolute path", wd))
	}
	if len(im.Layers) == 0 {
		errs = append(errs, errors.New("no layers"))
	}
	for i, l := range im.Layers {
		if _, err := l.entries(); err != nil {
			errs = append(errs, fmt.Errorf("layer %d (%s): %w", i, l.CreatedBy, err))
		}
	}
	return errors.Join(errs...)
}

// numeric is a UID or GID: a decimal number of at most 32 bits.
func numeric(s string) bool {
	_, err := strconv.ParseUint(s, 10, 32)
	return err == nil
}

// entry is one tar entry: name relative to the root, directories ending
// in a slash.
type entry struct {
	name   string
	mode   fs.FileMode
	source string
	data   []byte
	target string
	xattrs map[string]string
}

// entries checks the layer's files and returns them with the
// directories above them, sorted by path.
func (l Layer) entries() ([]entry, error) {
	if len(l.Files) == 0 {
		return nil, errors.New("no files")
	}
	byPath := map[string]File{}
	for _, f := range l.Files {
		if !path.IsAbs(f.Path) || path.Clean(f.Path) != f.Path || f.Path == "/" {
			return nil, fmt.Errorf("path %q: want a clean absolute path such as /usr/bin/cp", f.Path)
		}
		if _, dup := byPath[f.Path]; dup {
			return nil, fmt.Errorf("%s is listed twice", f.Path)
		}
		switch f.Mode.Type() {
		case 0:
			if f.Source != "" && f.Data != nil {
				return nil, fmt.Errorf("%s: both a source file and data", f.Path)
			}
		case fs.ModeDir:
			if f.Source != "" || f.Data != nil || f.Target != "" {
				return nil, fmt.Errorf("%s: a directory with content", f.Path)
			}
		case fs.ModeSymlink:
			if f.Target == "" || f.Source != "" || f.Data != nil {
				return nil, fmt.Errorf("%s: a symlink wants a target and nothing else", f.Path)
			}
		default:
			return nil, fmt.Errorf("%s: mode %s, want a regular file, a directory or a symlink", f.Path, f.Mode)
		}
		byPath[f.Path] = f
	}
	for _, f := range l.Files {
		for d := path.Dir(f.Path); d != "/"; d = path.Dir(d) {
			parent, ok := byPath[d]
			if !ok {
				byPath[d] = File{Path: d, Mode: fs.ModeDir | 0o755}
				continue
			}
			if !parent.Mode.IsDir() {
				return nil, fmt.Errorf("%s: its parent %s is not a directory", f.Path, d)
			}
		}
	}
	out := make([]entry, 0, len(byPath))
	for _, f := range byPath {
		e := entry{name: strings.TrimPrefix(f.Path, "/"), mode: f.Mode, source: f.Source, data: f.Data, target: f.Target, xattrs: f.Xattrs}
		if f.Mode.IsDir() {
			e.name += "/"
		}
		out = append(out, e)
	}
	slices.SortFunc(out, func(a, b entry) int { return strings.Compare(a.name, b.name) })
	return out, nil
}

// writeLayer writes the layer's tar to w and returns its descriptor.
func writeLayer(w io.Writer, l Layer, t time.Time) (ocispec.Descriptor, error) {
	entries, err := l.entries()
	if err != nil {
		return ocispec.Descriptor{}, err
	}
	digester := digest.Canonical.Digester()
	count := &counter{}
	tw := tar.NewWriter(io.MultiWriter(w, digester.Hash(), count))
	for _, e := range entries {
		if err := writeEntry(tw, e, t); err != nil {
			return ocispec.Descriptor{}, err
		}
	}
	if err := tw.Close(); err != nil {
		return ocispec.Descriptor{}, err
	}
	return ocispec.Descriptor{MediaType: ocispec.MediaTypeImageLayer, Digest: digester.Digest(), Size: count.n}, nil
}

type counter struct{ n int64 }

func (c *counter) Write(p []byte) (int, error) { c.n += int64(len(p)); return len(p), nil }

func writeEntry(tw *tar.Writer, e entry, t time.Time) error {
	h := &tar.Header{Name: e.name, Mode: tarMode(e.mode), ModTime: t.Truncate(time.Second), Format: tar.FormatPAX}
	for k, v := range e.xattrs {
		if h.PAXRecords == nil {
			h.PAXRecords = map[string]string{}
		}
		h.PAXRecords["SCHILY.xattr."+k] = v
	}
	switch e.mode.Type() {
	case fs.ModeDir:
		h.Typeflag = tar.TypeDir
		return tw.WriteHeader(h)
	case fs.ModeSymlink:
		h.Typeflag, h.Linkname = tar.TypeSymlink, e.target
		return tw.WriteHeader(h)
	}
	h.Typeflag = tar.TypeReg
	if e.source == "" {
		h.Size = int64(len(e.data))
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		_, err := tw.Write(e.data)
		return err
	}
	f, err := os.Open(e.source)
	if err != nil {
		return err
	}
	defer f.Close()
	info, err := f.Stat()
	if err != nil {
		return err
	}
	if !info.Mode().IsRegular() {
		return fmt.Errorf("%s (for /%s) is not a regular file", e.source, e.name)
	}
	h.Size = info.Size()
	if err := tw.WriteHeader(h); err != nil {
		return err
	}
	if _, err := io.CopyN(tw, f, h.Size); err != nil {
		return fmt.Errorf("read %s: %w", e.source, err)
	}
	return nil
}

// tarMode is the tar header's mode: permissions and the setuid, setgid
// and sticky bits.
func tarMode(m fs.FileMode) int64 {
	mode := int64(m.Perm())
	if m&fs.ModeSetuid != 0 {
		mode |= 0o4000
	}
	if m&fs.ModeSetgid != 0 {
		mode |= 0o2000
	}
	if m&fs.ModeSticky != 0 {
		mode |= 0o1000
	}
	return mode
}
