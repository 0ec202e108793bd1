package images

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/remote/transport"

	"cozy.dev/cozy/internal/httpguard"
	"cozy.dev/cozy/internal/imageref"
)

// A Source holds images by their upstream reference.
type Source interface {
	// Get finds ref. An image the source does not have is an error
	// wrapping ErrNotFound.
	Get(ctx context.Context, ref imageref.Ref) (*Artifact, error)
	String() string
}

// ErrNotFound is an image a Source does not hold.
var ErrNotFound = errors.New("not found")

// Artifact is an image or an image index (several platforms) to copy.
type Artifact struct {
	Digest v1.Hash
	// One of the two.
	Image v1.Image
	Index v1.ImageIndex
}

// The annotations naming an image in an OCI layout's index.json:
// containerd's export writes the full reference in the first; Cozy's
// layouts (hack/lab-images.sh) write it in both.
const (
	AnnotationContainerdName = "io.containerd.image.name"
	AnnotationRefName        = "org.opencontainers.image.ref.name"
)

// Layout is an OCI image layout directory (index.json and blobs/) whose
// index.json names each image by its full upstream reference.
type Layout struct {
	dir  string
	refs map[string]v1.Descriptor // canonical reference -> manifest
	path layout.Path
	// Set by OpenArchive: the archive and the directory it unpacked it
	// into (dir).
	archive, unpacked string
}

// OpenLayout reads the index of the layout at dir.
func OpenLayout(dir string) (*Layout, error) {
	data, err := os.ReadFile(filepath.Join(dir, "index.json"))
	if err != nil {
		return nil, fmt.Errorf("OCI layout %s: %w", dir, err)
	}
	refs, err := LayoutRefs(data)
	if err != nil {
		return nil, fmt.Errorf("OCI layout %s: index.json: %w", dir, err)
	}
	p, err := layout.FromPath(dir)
	if err != nil {
		return nil, fmt.Errorf("OCI layout %s: %w", dir, err)
	}
	return &Layout{dir: dir, refs: refs, path: p}, nil
}

func (l *Layout) String() string {
	if l.archive != "" {
		return "OCI archive " + l.archive
	}
	return "OCI layout " + l.dir
}

// Refs are the references the layout names, sorted.
func (l *Layout) Refs() []string {
	out := make([]string, 0, len(l.refs))
	for r := range l.refs {
		out = append(out, r)
	}
	slices.Sort(out)
	return out
}

// Get finds ref by its canonical reference; a reference by digest also
// matches a manifest of the same repository with that digest.
func (l *Layout) Get(_ context.Context, ref imageref.Ref) (*Artifact, error) {
	desc, ok := l.refs[ref.String()]
	if !ok && ref.Digest != "" {
		for s, d := range l.refs {
			if r, _ := imageref.Parse(s); r.Name() == ref.Name() && d.Digest.String() == ref.Digest {
				desc, ok = d, true
				break
			}
		}
	}
	if !ok {
		return nil, fmt.Errorf("%w in %s: no manifest in index.json has %s = %s", ErrNotFound, l, AnnotationRefName, ref)
	}
	a := &Artifact{Digest: desc.Digest}
	var err error
	switch {
	case desc.MediaType.IsIndex():
		a.Index, err = l.path.ImageIndex()
		if err == nil {
			a.Index, err = a.Index.ImageIndex(desc.Digest)
		}
	case desc.MediaType.IsImage():
		a.Image, err = l.path.Image(desc.Digest)
	default:
		err = fmt.Errorf("media type %q is neither an image nor an index", desc.MediaType)
	}
	if err != nil {
		return nil, fmt.Errorf("%s in %s: %w", ref, l, err)
	}
	return a, nil
}

// LayoutRefs reads an OCI layout's index.json: each manifest named by a
// full image reference in the io.containerd.image.name or
// org.opencontainers.image.ref.name annotation (a ref.name without a
// repository, the plain tag some tools write, names nothing). Manifests
// without a name are left out; two names that disagree, or one name for
// two different manifests, are errors.
func LayoutRefs(indexJSON []byte) (map[string]v1.Descriptor, error) {
	idx, err := v1.ParseIndexManifest(strings.NewReader(string(indexJSON)))
	if err != nil {
		return nil, err
	}
	refs := map[string]v1.Descriptor{}
	for i, d := range idx.Manifests {
		var names []string
		if s := d.Annotations[AnnotationContainerdName]; s != "" {
			names = append(names, s)
		}
		if s := d.Annotations[AnnotationRefName]; strings.Contains(s, "/") {
			names = append(names, s)
		}
		if len(names) == 0 {
			continue
		}
		var canonical string
		for _, n := range names {
			r, err := imageref.Parse(n)
			if err != nil {
				return nil, fmt.Errorf("manifests[%d]: %w", i, err)
			}
			if r.Digest != "" && r.Digest != d.Digest.String() {
				return nil, fmt.Errorf("manifests[%d]: %s names digest %s, the manifest is %s", i, n, r.Digest, d.Digest)
			}
			switch {
			case canonical == "":
				canonical = r.String()
			case canonical != r.String():
				return nil, fmt.Errorf("manifests[%d]: %s says %s, %s says %s", i, AnnotationContainerdName, names[0], AnnotationRefName, n)
			}
		}
		if prev, ok := refs[canonical]; ok && prev.Digest != d.Digest {
			return nil, fmt.Errorf("manifests[%d]: %s names both %s and %s", i, canonical, prev.Digest, d.Digest)
		}
		refs[canonical] = d
	}
	return refs, nil
}

// Upstream is the images' own registries, over HTTPS, anonymously.
type Upstream struct {
	// Transport carries the requests (nil: http.DefaultTransport); plain
	// HTTP is refused whatever it is.
	Transport http.RoundTripper
}

func (u *Upstream) String() string { return "the upstream registries" }

// Get asks the image's registry for it.
func (u *Upstream) Get(ctx context.Context, ref imageref.Ref) (*Artifact, error) {
	r, err := name.ParseReference(ref.String())
	if err != nil {
		return nil, err
	}
	desc, err := remote.Get(r, remote.WithContext(ctx), remote.WithTransport(httpguard.Transport{Base: u.Transport}), remote.WithUserAgent(userAgent))
	if err != nil {
		var te *transport.Error
		if errors.As(err, &te) && te.StatusCode == http.StatusNotFound {
			return nil, fmt.Errorf("%w at %s: %s", ErrNotFound, ref.Host, answer(te))
		}
		return nil, fmt.Errorf("from %s: %w", ref.Host, err)
	}
	a := &Artifact{Digest: desc.Digest}
	if desc.MediaType.IsIndex() {
		a.Index, err = desc.ImageIndex()
	} else {
		a.Image, err = desc.Image()
	}
	if err != nil {
		return nil, err
	}
	return a, nil
}
