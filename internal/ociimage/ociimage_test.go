package ociimage

import (
	"archive/tar"
	"bytes"
	"encoding/json"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"cozy.dev/cozy/internal/testing/prereq"
)

var created = time.Date(2026, 11, 30, 0, 0, 0, 0, time.UTC)

// tarEntry is what a test checks of one tar entry.
type tarEntry struct {
	typ    byte
	mode   int64
	data   string
	link   string
	uid    int
	mtime  time.Time
	xattrs map[string]string
}

// untar reads a tar into its entries by name, in order.
func untar(t *testing.T, data []byte) (map[string]tarEntry, []string) {
	t.Helper()
	out := map[string]tarEntry{}
	var names []string
	tr := tar.NewReader(bytes.NewReader(data))
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return out, names
		}
		if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		e := tarEntry{typ: h.Typeflag, mode: h.Mode, data: string(b), link: h.Linkname, uid: h.Uid + h.Gid, mtime: h.ModTime}
		for k, v := range h.PAXRecords {
			if name, ok := strings.CutPrefix(k, "SCHILY.xattr."); ok {
				if e.xattrs == nil {
					e.xattrs = map[string]string{}
				}
				e.xattrs[name] = v
			}
		}
		out[h.Name] = e
		names = append(names, h.Name)
	}
}

// layoutFiles reads a layout directory into a map of path to content.
func layoutFiles(t *testing.T, dir string) map[string][]byte {
	t.Helper()
	out := map[string][]byte{}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		out[filepath.ToSlash(rel)], err = os.ReadFile(p)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
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

// image follows an index entry to its config and layers, checking every
// digest, the layers' media type and the diff IDs.
func image(t *testing.T, files map[string][]byte, top ocispec.Descriptor) (ocispec.Image, [][]byte) {
	t.Helper()
	var manifest ocispec.Manifest
	if err := json.Unmarshal(blob(t, files, top), &manifest); err != nil {
		t.Fatal(err)
	}
	var config ocispec.Image
	if err := json.Unmarshal(blob(t, files, manifest.Config), &config); err != nil {
		t.Fatal(err)
	}
	if len(config.RootFS.DiffIDs) != len(manifest.Layers) || len(config.History) != len(manifest.Layers) {
		t.Fatalf("%d layers, %d diff IDs, %d history entries", len(manifest.Layers), len(config.RootFS.DiffIDs), len(config.History))
	}
	var layers [][]byte
	for i, l := range manifest.Layers {
		if l.MediaType != ocispec.MediaTypeImageLayer {
			t.Errorf("layer %d: media type %s, want uncompressed %s", i, l.MediaType, ocispec.MediaTypeImageLayer)
		}
		if config.RootFS.DiffIDs[i] != l.Digest {
			t.Errorf("layer %d: diff ID %s, digest %s", i, config.RootFS.DiffIDs[i], l.Digest)
		}
		layers = append(layers, blob(t, files, l))
	}
	return config, layers
}

func binaryImage(t *testing.T) Image {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "cozy-operator")
	if err := os.WriteFile(bin, []byte("\x7fELF fake static binary"), 0o600); err != nil {
		t.Fatal(err)
	}
	return Image{
		Ref: "0.1.0", Arch: "amd64", Created: created,
		Layers: []Layer{{Files: []File{{Path: "/cozy-operator", Mode: 0o755, Source: bin}}, CreatedBy: "test: /cozy-operator"}},
		Config: ocispec.ImageConfig{
			User: "65532:65532", Entrypoint: []string{"/cozy-operator"},
			Labels: map[string]string{"org.opencontainers.image.version": "0.1.0"},
		},
	}
}

// TestWrite follows the archive as a registry client would: index,
// manifest, config, layer, each blob checked against its digest.
func TestWrite(t *testing.T) {
	im := binaryImage(t)
	var buf bytes.Buffer
	if err := Write(&buf, im); err != nil {
		t.Fatal(err)
	}
	archive, _ := untar(t, buf.Bytes())
	files := map[string][]byte{}
	for name, e := range archive {
		files[name] = []byte(e.data)
	}

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
	if _, ok := top.Annotations[AnnotationContainerdImageName]; ok {
		t.Errorf("a bare tag is no image name for containerd: %v", top.Annotations)
	}
	config, layers := image(t, files, top)
	if c := config.Config; c.User != "65532:65532" || len(c.Entrypoint) != 1 || c.Entrypoint[0] != "/cozy-operator" || c.Labels["org.opencontainers.image.version"] != "0.1.0" {
		t.Errorf("image config %+v", c)
	}
	if config.OS != "linux" || config.Architecture != "amd64" || !config.Created.Equal(im.Created) {
		t.Errorf("image platform %s/%s created %v", config.OS, config.Architecture, config.Created)
	}
	want, _ := os.ReadFile(im.Layers[0].Files[0].Source)
	if got, _ := untar(t, layers[0]); len(got) != 1 || got["cozy-operator"].data != string(want) || got["cozy-operator"].mode != 0o755 {
		t.Errorf("layer holds %+v, want just cozy-operator with the binary, mode 755", got)
	}

	var again bytes.Buffer
	if err := Write(&again, im); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(buf.Bytes(), again.Bytes()) {
		t.Error("two archives of the same image differ")
	}
}

// rootfs makes a small tree such as dpkg-deb -x leaves: nested
// directories, executables, a private directory, relative and absolute
// symlinks, a setuid file.
func rootfs(t *testing.T) string {
	t.Helper()
	root := t.TempDir()
	for _, d := range []struct {
		path string
		mode fs.FileMode
	}{{"usr/sbin", 0o755}, {"usr/lib/x86_64-linux-gnu", 0o755}, {"etc", 0o755}, {"var/private", 0o700}} {
		if err := os.MkdirAll(filepath.Join(root, d.path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(filepath.Join(root, d.path), d.mode); err != nil {
			t.Fatal(err)
		}
	}
	for _, f := range []struct {
		path, data string
		mode       fs.FileMode
	}{
		{"usr/sbin/xtables-nft-multi", "\x7fELF multi", 0o755},
		{"usr/lib/x86_64-linux-gnu/libxtables.so.12.7.0", "\x7fELF lib", 0o644},
		{"etc/protocols", "tcp 6 TCP\n", 0o644},
		{"usr/sbin/suid", "\x7fELF suid", fs.ModeSetuid | 0o755},
	} {
		p := filepath.Join(root, f.path)
		if err := os.WriteFile(p, []byte(f.data), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, f.mode); err != nil {
			t.Fatal(err)
		}
	}
	for link, target := range map[string]string{
		"usr/sbin/iptables":                         "xtables-nft-multi",
		"usr/lib/x86_64-linux-gnu/libxtables.so.12": "libxtables.so.12.7.0",
		"usr/sbin/iptables-save":                    "/usr/sbin/xtables-nft-multi",
		"bin":                                       "usr/bin",
	} {
		if err := os.Symlink(target, filepath.Join(root, link)); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

// layoutImages are two images sharing a base layer made from a
// directory, each with a layer of files on top, as the lab's flannel and
// kube-proxy images are.
func layoutImages(t *testing.T, root string) []Image {
	t.Helper()
	base, err := DirLayer(root, "test: base")
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(t.TempDir(), "flanneld")
	if err := os.WriteFile(bin, []byte("\x7fELF flanneld"), 0o600); err != nil {
		t.Fatal(err)
	}
	capNetBind := "\x01\x00\x00\x02\x00\x04\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00"
	env := []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
	return []Image{
		{
			Ref: "ghcr.io/siderolabs/flannel:v0.28.4", Arch: "amd64", Created: created,
			Layers: []Layer{base, {CreatedBy: "test: flanneld", Files: []File{
				{Path: "/opt/bin/flanneld", Mode: 0o755, Source: bin, Xattrs: map[string]string{"security.capability": capNetBind}},
				{Path: "/tmp", Mode: fs.ModeDir | fs.ModeSticky | 0o777},
				{Path: "/etc/kube-flannel/README", Data: []byte("mounted from a ConfigMap\n"), Mode: 0o600},
				{Path: "/opt/bin/flannel", Mode: fs.ModeSymlink | 0o777, Target: "flanneld"},
			}}},
			Config: ocispec.ImageConfig{Entrypoint: []string{"/opt/bin/flanneld"}, Env: env, WorkingDir: "/"},
		},
		{
			Ref: "registry.k8s.io/kube-proxy:v1.36.3", Arch: "amd64", Created: created,
			Layers: []Layer{base, {CreatedBy: "test: kube-proxy", Files: []File{
				{Path: "/usr/local/bin/kube-proxy", Mode: 0o755, Data: []byte("\x7fELF kube-proxy")},
			}}},
			Config: ocispec.ImageConfig{Entrypoint: []string{"/usr/local/bin/kube-proxy"}, Cmd: []string{"--help"}, Env: env, User: "0:0"},
		},
	}
}

// TestWriteLayout checks a layout of two images: names, shared blobs,
// the config, and every entry's type, mode, owner, date and content.
func TestWriteLayout(t *testing.T) {
	root := rootfs(t)
	images := layoutImages(t, root)
	dir := filepath.Join(t.TempDir(), "layout")
	if err := WriteLayout(dir, images...); err != nil {
		t.Fatal(err)
	}
	files := layoutFiles(t, dir)
	var index ocispec.Index
	if err := json.Unmarshal(files[ocispec.ImageIndexFile], &index); err != nil || len(index.Manifests) != 2 {
		t.Fatalf("index.json %s (%v)", files[ocispec.ImageIndexFile], err)
	}
	if string(files[ocispec.ImageLayoutFile]) != `{"imageLayoutVersion":"1.0.0"}` {
		t.Errorf("oci-layout %s", files[ocispec.ImageLayoutFile])
	}

	wantEntries := []map[string]tarEntry{
		{ // the base, from the directory
			"bin":                       {typ: tar.TypeSymlink, mode: 0o777, link: "usr/bin"},
			"etc/":                      {typ: tar.TypeDir, mode: 0o755},
			"etc/protocols":             {typ: tar.TypeReg, mode: 0o644, data: "tcp 6 TCP\n"},
			"usr/":                      {typ: tar.TypeDir, mode: 0o755},
			"usr/lib/":                  {typ: tar.TypeDir, mode: 0o755},
			"usr/lib/x86_64-linux-gnu/": {typ: tar.TypeDir, mode: 0o755},
			"usr/lib/x86_64-linux-gnu/libxtables.so.12":     {typ: tar.TypeSymlink, mode: 0o777, link: "libxtables.so.12.7.0"},
			"usr/lib/x86_64-linux-gnu/libxtables.so.12.7.0": {typ: tar.TypeReg, mode: 0o644, data: "\x7fELF lib"},
			"usr/sbin/":                  {typ: tar.TypeDir, mode: 0o755},
			"usr/sbin/iptables":          {typ: tar.TypeSymlink, mode: 0o777, link: "xtables-nft-multi"},
			"usr/sbin/iptables-save":     {typ: tar.TypeSymlink, mode: 0o777, link: "/usr/sbin/xtables-nft-multi"},
			"usr/sbin/suid":              {typ: tar.TypeReg, mode: 0o4755, data: "\x7fELF suid"},
			"usr/sbin/xtables-nft-multi": {typ: tar.TypeReg, mode: 0o755, data: "\x7fELF multi"},
			"var/":                       {typ: tar.TypeDir, mode: 0o755},
			"var/private/":               {typ: tar.TypeDir, mode: 0o700},
		},
		{ // flannel's own layer: directories above files are implied
			"etc/":                    {typ: tar.TypeDir, mode: 0o755},
			"etc/kube-flannel/":       {typ: tar.TypeDir, mode: 0o755},
			"etc/kube-flannel/README": {typ: tar.TypeReg, mode: 0o600, data: "mounted from a ConfigMap\n"},
			"opt/":                    {typ: tar.TypeDir, mode: 0o755},
			"opt/bin/":                {typ: tar.TypeDir, mode: 0o755},
			"opt/bin/flannel":         {typ: tar.TypeSymlink, mode: 0o777, link: "flanneld"},
			"opt/bin/flanneld": {typ: tar.TypeReg, mode: 0o755, data: "\x7fELF flanneld",
				xattrs: map[string]string{"security.capability": images[0].Layers[1].Files[0].Xattrs["security.capability"]}},
			"tmp/": {typ: tar.TypeDir, mode: 0o1777},
		},
	}
	var baseDigest digest.Digest
	for i, top := range index.Manifests {
		ref := images[i].Ref
		if top.Annotations[ocispec.AnnotationRefName] != ref || top.Annotations[AnnotationContainerdImageName] != ref {
			t.Errorf("index entry %d annotations %v, want both names %s", i, top.Annotations, ref)
		}
		if top.Platform == nil || top.Platform.OS != "linux" || top.Platform.Architecture != "amd64" {
			t.Errorf("%s: platform %+v", ref, top.Platform)
		}
		config, layers := image(t, files, top)
		if c := config.Config; strings.Join(c.Entrypoint, " ") != strings.Join(images[i].Config.Entrypoint, " ") ||
			strings.Join(c.Cmd, " ") != strings.Join(images[i].Config.Cmd, " ") || c.User != images[i].Config.User ||
			c.WorkingDir != images[i].Config.WorkingDir || len(c.Env) != 1 {
			t.Errorf("%s: config %+v", ref, c)
		}
		if config.History[1].CreatedBy != images[i].Layers[1].CreatedBy {
			t.Errorf("%s: history %+v", ref, config.History)
		}
		var manifest ocispec.Manifest
		_ = json.Unmarshal(blob(t, files, top), &manifest)
		if i == 0 {
			baseDigest = manifest.Layers[0].Digest
		} else if manifest.Layers[0].Digest != baseDigest {
			t.Errorf("the images' base layers differ: %s, %s", baseDigest, manifest.Layers[0].Digest)
		}
		for l, want := range wantEntries {
			if i == 1 && l == 1 {
				break
			}
			got, names := untar(t, layers[l])
			for name, e := range got {
				if e.uid != 0 || !e.mtime.Equal(created) {
					t.Errorf("%s layer %d: %s owned by %d, dated %v", ref, l, name, e.uid, e.mtime)
				}
				e.uid, e.mtime = 0, time.Time{}
				if w, ok := want[name]; !ok {
					t.Errorf("%s layer %d: unexpected %s", ref, l, name)
				} else if w.typ != e.typ || w.mode != e.mode || w.data != e.data || w.link != e.link || len(w.xattrs) != len(e.xattrs) || w.xattrs["security.capability"] != e.xattrs["security.capability"] {
					t.Errorf("%s layer %d: %s is %+v, want %+v", ref, l, name, e, w)
				}
			}
			for name := range want {
				if _, ok := got[name]; !ok {
					t.Errorf("%s layer %d: no %s", ref, l, name)
				}
			}
			for j := 1; j < len(names); j++ {
				if names[j-1] >= names[j] {
					t.Errorf("%s layer %d: %s before %s", ref, l, names[j-1], names[j])
				}
			}
		}
	}
	// 2 manifests, 2 configs, 3 layers: the base is stored once.
	if n := len(files) - 2; n != 7 {
		t.Errorf("%d blobs, want 7", n)
	}
}

// TestLayoutReproducible writes the same images twice, the second time
// after the source files' dates and the umask changed: same bytes.
func TestLayoutReproducible(t *testing.T) {
	root := rootfs(t)
	first := filepath.Join(t.TempDir(), "layout")
	if err := WriteLayout(first, layoutImages(t, root)...); err != nil {
		t.Fatal(err)
	}
	later := time.Now().Add(time.Hour)
	_ = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err == nil && d.Type()&fs.ModeSymlink == 0 {
			err = os.Chtimes(p, later, later)
		}
		return err
	})
	second := filepath.Join(t.TempDir(), "layout")
	if err := WriteLayout(second, layoutImages(t, root)...); err != nil {
		t.Fatal(err)
	}
	a, b := layoutFiles(t, first), layoutFiles(t, second)
	if len(a) != len(b) {
		t.Fatalf("%d files, then %d", len(a), len(b))
	}
	for name, data := range a {
		if !bytes.Equal(data, b[name]) {
			t.Errorf("%s differs between two layouts of the same images", name)
		}
	}
}

func TestRejects(t *testing.T) {
	for name, tc := range map[string]struct {
		mutate   func(*Image)
		inLayout bool
		want     string
	}{
		"bare tag in a layout": {func(im *Image) {}, true, "want a full reference"},
		"no registry host":     {func(im *Image) { im.Ref = "coredns/coredns:v1.14.2" }, true, "want a full reference"},
		"no tag":               {func(im *Image) { im.Ref = "registry.k8s.io/pause" }, false, "want a tag"},
		"upper-case path":      {func(im *Image) { im.Ref = "registry.k8s.io/Pause:3.10.1" }, false, "want a tag"},
		"relative path":        {func(im *Image) { im.Layers[0].Files[0].Path = "cozy-operator" }, false, "clean absolute"},
		"root path":            {func(im *Image) { im.Layers[0].Files[0].Path = "/" }, false, "clean absolute"},
		"unclean path":         {func(im *Image) { im.Layers[0].Files[0].Path = "/a/../cozy-operator" }, false, "clean absolute"},
		"named user":           {func(im *Image) { im.Config.User = "nobody" }, false, "numeric UID:GID"},
		"user no group":        {func(im *Image) { im.Config.User = "65532" }, false, "numeric UID:GID"},
		"no arch":              {func(im *Image) { im.Arch = "" }, false, "no architecture"},
		"nothing to run":       {func(im *Image) { im.Config.Entrypoint = nil }, false, "nothing to run"},
		"relative working dir": {func(im *Image) { im.Config.WorkingDir = "work" }, false, "absolute path"},
		"no layers":            {func(im *Image) { im.Layers = nil }, false, "no layers"},
		"empty layer":          {func(im *Image) { im.Layers[0].Files = nil }, false, "no files"},
		"twice the same path": {func(im *Image) {
			im.Layers[0].Files = append(im.Layers[0].Files, File{Path: "/cozy-operator", Mode: 0o644})
		}, false, "listed twice"},
		"parent not a directory": {func(im *Image) {
			im.Layers[0].Files = append(im.Layers[0].Files, File{Path: "/cozy-operator/x", Mode: 0o644})
		}, false, "is not a directory"},
		"symlink without target": {func(im *Image) {
			im.Layers[0].Files = append(im.Layers[0].Files, File{Path: "/l", Mode: fs.ModeSymlink | 0o777})
		}, false, "wants a target"},
		"directory with content": {func(im *Image) {
			im.Layers[0].Files = append(im.Layers[0].Files, File{Path: "/d", Mode: fs.ModeDir | 0o755, Data: []byte("x")})
		}, false, "directory with content"},
		"device": {func(im *Image) {
			im.Layers[0].Files = append(im.Layers[0].Files, File{Path: "/dev/null", Mode: fs.ModeDevice | fs.ModeCharDevice | 0o666})
		}, false, "want a regular file"},
		"missing source": {func(im *Image) { im.Layers[0].Files[0].Source = "/nonexistent" }, false, "no such file"},
	} {
		t.Run(name, func(t *testing.T) {
			im := binaryImage(t)
			tc.mutate(&im)
			var err error
			if tc.inLayout {
				err = WriteLayout(filepath.Join(t.TempDir(), "layout"), im)
			} else {
				err = Write(io.Discard, im)
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %v, want one containing %q", err, tc.want)
			}
		})
	}
}

func TestWriteLayoutRejects(t *testing.T) {
	im := binaryImage(t)
	im.Ref = "registry.example.com/cozy/cozy-operator:0.1.0"
	full := t.TempDir()
	if err := os.WriteFile(filepath.Join(full, "x"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	for name, tc := range map[string]struct {
		dir    string
		images []Image
		want   string
	}{
		"no images":      {filepath.Join(t.TempDir(), "l"), nil, "no images"},
		"same ref twice": {filepath.Join(t.TempDir(), "l"), []Image{im, im}, "listed twice"},
		"not empty":      {full, []Image{im}, "not empty"},
	} {
		t.Run(name, func(t *testing.T) {
			if err := WriteLayout(tc.dir, tc.images...); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %v, want one containing %q", err, tc.want)
			}
		})
	}
}

func TestDirLayerRejects(t *testing.T) {
	empty := t.TempDir()
	fifo := t.TempDir()
	if err := exec.Command("mkfifo", filepath.Join(fifo, "pipe")).Run(); err != nil {
		prereq.Missing(t, "mkfifo: %v", err)
	}
	for name, tc := range map[string]struct{ root, want string }{
		"empty":   {empty, "is empty"},
		"missing": {filepath.Join(empty, "nothing"), "no such file"},
		"fifo":    {fifo, "want a regular file"},
	} {
		t.Run(name, func(t *testing.T) {
			if _, err := DirLayer(tc.root, "test"); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %v, want one containing %q", err, tc.want)
			}
		})
	}
}

// TestLayoutWithRealTools hands the layout to the tools a user reads it
// with: skopeo finds each image by its full reference and copies it
// (checking every digest), umoci unpacks it with modes and symlinks as
// written.
func TestLayoutWithRealTools(t *testing.T) {
	for _, bin := range []string{"skopeo", "umoci"} {
		if _, err := exec.LookPath(bin); err != nil {
			prereq.Missing(t, "%s is not installed (see hack/install-deps.sh)", bin)
		}
	}
	root := rootfs(t)
	images := layoutImages(t, root)
	for i := range images { // unprivileged umoci cannot set security.* attributes
		for j := range images[i].Layers {
			for k := range images[i].Layers[j].Files {
				images[i].Layers[j].Files[k].Xattrs = nil
			}
		}
	}
	dir := filepath.Join(t.TempDir(), "layout")
	if err := WriteLayout(dir, images...); err != nil {
		t.Fatal(err)
	}
	run := func(name string, args ...string) []byte {
		t.Helper()
		out, err := exec.Command(name, args...).CombinedOutput()
		if err != nil {
			t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
		}
		return out
	}
	for _, im := range images {
		var config ocispec.Image
		if err := json.Unmarshal(run("skopeo", "inspect", "--config", "oci:"+dir+":"+im.Ref), &config); err != nil {
			t.Fatal(err)
		}
		if strings.Join(config.Config.Entrypoint, " ") != strings.Join(im.Config.Entrypoint, " ") || config.Architecture != "amd64" {
			t.Errorf("skopeo reads %s as %+v", im.Ref, config)
		}
	}
	copied := filepath.Join(t.TempDir(), "copied")
	run("skopeo", "copy", "--quiet", "oci:"+dir+":"+images[0].Ref, "oci:"+copied+":flannel")

	bundle := filepath.Join(t.TempDir(), "bundle")
	args := []string{"unpack", "--image", dir + ":" + images[0].Ref, bundle}
	if os.Geteuid() != 0 {
		args = append([]string{"unpack", "--rootless"}, args[1:]...)
	}
	run("umoci", args...)
	rootfs := filepath.Join(bundle, "rootfs")
	for p, want := range map[string]fs.FileMode{
		"usr/sbin/xtables-nft-multi": 0o755,
		"usr/sbin/suid":              fs.ModeSetuid | 0o755,
		"var/private":                fs.ModeDir | 0o700,
		"tmp":                        fs.ModeDir | fs.ModeSticky | 0o777,
		"etc/kube-flannel/README":    0o600,
		"opt/bin/flanneld":           0o755,
		"usr/sbin/iptables":          fs.ModeSymlink | 0o777,
	} {
		fi, err := os.Lstat(filepath.Join(rootfs, p))
		if err != nil {
			t.Errorf("unpacked %s: %v", p, err)
			continue
		}
		if got := fi.Mode() & (fs.ModeType | fs.ModePerm | fs.ModeSetuid | fs.ModeSticky); got != want {
			t.Errorf("unpacked %s: mode %s, want %s", p, got, want)
		}
	}
	if target, err := os.Readlink(filepath.Join(rootfs, "usr/sbin/iptables")); err != nil || target != "xtables-nft-multi" {
		t.Errorf("unpacked iptables links to %q (%v)", target, err)
	}
	if data, err := os.ReadFile(filepath.Join(rootfs, "opt/bin/flanneld")); err != nil || string(data) != "\x7fELF flanneld" {
		t.Errorf("unpacked flanneld: %q (%v)", data, err)
	}
}

// Without Debian's CA certificates the images would not trust any
// HTTPS server: StaticBase refuses.
func TestStaticBaseNeedsCertificates(t *testing.T) {
	if _, err := StaticBase(t.TempDir()); err == nil || !strings.Contains(err.Error(), "ca-certificates") {
		t.Errorf("got %v, want an error naming ca-certificates", err)
	}
}

// A packer never writes into an old layout: WriteNewLayout refuses a
// directory that exists, even empty, and writes nothing there.
func TestWriteNewLayoutRefusesExistingDir(t *testing.T) {
	dir := t.TempDir()
	im := Image{Ref: "example.org/a:1", Arch: "amd64", Config: ocispec.ImageConfig{Entrypoint: []string{"/a"}},
		Layers: []Layer{{Files: []File{{Path: "/a", Mode: 0o755, Data: []byte("a")}}}}}
	if err := WriteNewLayout(dir, io.Discard, im); err == nil || !strings.Contains(err.Error(), "exists") {
		t.Fatalf("got %v, want it refused", err)
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 0 {
		t.Errorf("wrote %v", entries)
	}
	var names strings.Builder
	if err := WriteNewLayout(filepath.Join(dir, "new"), &names, im); err != nil {
		t.Fatal(err)
	}
	if names.String() != "example.org/a:1\n" {
		t.Errorf("named %q", names.String())
	}
}
