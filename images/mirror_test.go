package images

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"cozy.dev/cozy/images/registry"
	"cozy.dev/cozy/internal/imageref"
)

// startRegistry runs Cozy's registry on a loopback port for the test and
// returns its HOST:PORT.
func startRegistry(t *testing.T) string {
	t.Helper()
	s, err := registry.Listen("127.0.0.1:0", t.TempDir(), slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Serve(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("registry stop: %v", err)
		}
	})
	return s.Addr().String()
}

// artifact is a small random image, or an index of two when index is set.
func artifact(t *testing.T, index bool) *Artifact {
	t.Helper()
	if index {
		idx, err := random.Index(512, 2, 2)
		if err != nil {
			t.Fatal(err)
		}
		d, _ := idx.Digest()
		return &Artifact{Digest: d, Index: idx}
	}
	img, err := random.Image(512, 2)
	if err != nil {
		t.Fatal(err)
	}
	d, _ := img.Digest()
	return &Artifact{Digest: d, Image: img}
}

// writeLayout writes an OCI layout holding arts, each named by its
// upstream reference as hack/lab-images.sh names them.
func writeLayout(t *testing.T, arts map[string]*Artifact) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "layout")
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		t.Fatal(err)
	}
	for ref, a := range arts {
		ann := layout.WithAnnotations(map[string]string{AnnotationRefName: ref, AnnotationContainerdName: ref})
		if a.Index != nil {
			err = p.AppendIndex(a.Index, ann)
		} else {
			err = p.AppendImage(a.Image, ann)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// pulled is the digest the registry serves for ref, and for an index it
// checks every image of it can be pulled too.
func pulled(t *testing.T, ref string) (v1.Hash, error) {
	t.Helper()
	r, err := name.ParseReference(ref, name.Insecure)
	if err != nil {
		return v1.Hash{}, err
	}
	desc, err := remote.Get(r)
	if err != nil {
		return v1.Hash{}, err
	}
	if desc.MediaType.IsIndex() {
		idx, err := desc.ImageIndex()
		if err != nil {
			return v1.Hash{}, err
		}
		im, err := idx.IndexManifest()
		if err != nil {
			return v1.Hash{}, err
		}
		for _, m := range im.Manifests {
			img, err := remote.Image(r.Context().Digest(m.Digest.String()))
			if err != nil {
				return v1.Hash{}, fmt.Errorf("%s of the index: %w", m.Digest, err)
			}
			if _, err := img.ConfigFile(); err != nil {
				return v1.Hash{}, err
			}
		}
	}
	return desc.Digest, nil
}

func statuses(rs []Result) map[string]string {
	out := map[string]string{}
	for _, r := range rs {
		out[r.Image] = r.Status
	}
	return out
}

// Images go from a layout into the registry under REGISTRY/HOST/REPO:TAG
// with their digests; a second run copies nothing; a run with one more
// image copies only that one.
func TestMirrorFromLayout(t *testing.T) {
	reg := startRegistry(t)
	arts := map[string]*Artifact{
		"registry.k8s.io/pause:3.10.1":       artifact(t, false),
		"docker.io/library/alpine:3.22":      artifact(t, false),
		"ghcr.io/siderolabs/flannel:v0.28.4": artifact(t, true),
	}
	refs := []string{"registry.k8s.io/pause:3.10.1", "alpine:3.22", "ghcr.io/siderolabs/flannel:v0.28.4"}
	src, err := OpenLayout(writeLayout(t, arts))
	if err != nil {
		t.Fatal(err)
	}
	mirror := func(refs []string) []Result {
		t.Helper()
		rs, err := Mirror(context.Background(), MirrorOptions{Registry: reg, Insecure: true, Source: src, Refs: refs})
		if err != nil {
			t.Fatal(err)
		}
		return rs
	}

	first := mirror(refs)
	for _, r := range first {
		want := arts[r.Image]
		if r.Status != StatusCopied || r.Target != reg+"/"+r.Image || r.Digest != want.Digest.String() {
			t.Errorf("first run: %+v; want copied to %s/%s with %s", r, reg, r.Image, want.Digest)
		}
		got, err := pulled(t, r.Target)
		if err != nil || got != want.Digest {
			t.Errorf("pull %s: %s, %v; want %s", r.Target, got, err, want.Digest)
		}
	}

	for img, st := range statuses(mirror(refs)) {
		if st != StatusPresent {
			t.Errorf("second run: %s %s, want present", img, st)
		}
	}

	arts["quay.io/kubevirt/kubevirt-csi-driver:v0.4.1"] = artifact(t, false)
	src, err = OpenLayout(writeLayout(t, arts))
	if err != nil {
		t.Fatal(err)
	}
	third := statuses(mirror(append(refs, "quay.io/kubevirt/kubevirt-csi-driver:v0.4.1")))
	want := map[string]string{
		"registry.k8s.io/pause:3.10.1": StatusPresent, "docker.io/library/alpine:3.22": StatusPresent,
		"ghcr.io/siderolabs/flannel:v0.28.4": StatusPresent, "quay.io/kubevirt/kubevirt-csi-driver:v0.4.1": StatusCopied,
	}
	for img, st := range want {
		if third[img] != st {
			t.Errorf("third run: %s %s, want %s", img, third[img], st)
		}
	}
}

// An image the layout lacks fails with its name, after the others are
// copied.
func TestMirrorMissingImage(t *testing.T) {
	reg := startRegistry(t)
	src, err := OpenLayout(writeLayout(t, map[string]*Artifact{"registry.k8s.io/pause:3.10.1": artifact(t, false)}))
	if err != nil {
		t.Fatal(err)
	}
	rs, err := Mirror(context.Background(), MirrorOptions{
		Registry: reg, Insecure: true, Source: src,
		Refs: []string{"registry.k8s.io/etcd:v3.6.9", "registry.k8s.io/pause:3.10.1"},
	})
	if err == nil || !strings.Contains(err.Error(), "1 of 2 not mirrored") ||
		!strings.Contains(err.Error(), "registry.k8s.io/etcd:v3.6.9: not found in OCI layout") {
		t.Fatalf("Mirror = %v; want registry.k8s.io/etcd:v3.6.9 named as not found", err)
	}
	if !errors.Is(err, ErrNotFound) && !strings.Contains(err.Error(), ErrNotFound.Error()) {
		t.Errorf("error does not say not found: %v", err)
	}
	if st := statuses(rs); st["registry.k8s.io/pause:3.10.1"] != StatusCopied || st["registry.k8s.io/etcd:v3.6.9"] != StatusFailed {
		t.Errorf("statuses %v; want pause copied despite etcd missing", st)
	}
}

// A registry that refuses pushes fails each image with the registry's
// answer: status, error code and message, or its plain body.
func TestMirrorRefusedPush(t *testing.T) {
	tests := []struct {
		name, contentType, body, want string
	}{
		{"registry error JSON", "application/json", `{"errors":[{"code":"DENIED","message":"pushes to this mirror are disabled"}]}`,
			"the registry answered 403 Forbidden: DENIED: pushes to this mirror are disabled"},
		{"plain body", "text/plain", "read-only mirror", "the registry answered 403 Forbidden: read-only mirror"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				switch {
				case r.URL.Path == "/v2/":
					w.WriteHeader(http.StatusOK)
				case r.Method == http.MethodHead || r.Method == http.MethodGet:
					w.WriteHeader(http.StatusNotFound)
				default:
					w.Header().Set("Content-Type", tt.contentType)
					w.WriteHeader(http.StatusForbidden)
					io.WriteString(w, tt.body)
				}
			}))
			defer srv.Close()
			reg := strings.TrimPrefix(srv.URL, "http://")
			src, err := OpenLayout(writeLayout(t, map[string]*Artifact{"registry.k8s.io/pause:3.10.1": artifact(t, false)}))
			if err != nil {
				t.Fatal(err)
			}
			_, err = Mirror(context.Background(), MirrorOptions{Registry: reg, Insecure: true, Source: src, Refs: []string{"registry.k8s.io/pause:3.10.1"}})
			want := "registry.k8s.io/pause:3.10.1: push to " + reg + "/registry.k8s.io/pause:3.10.1 refused: " + tt.want
			if err == nil || !strings.Contains(err.Error(), want) {
				t.Errorf("Mirror = %v\nwant an error with %q", err, want)
			}
		})
	}
}

// Without Insecure the registry is reached over HTTPS only, even on
// loopback, where go-containerregistry would fall back to HTTP.
func TestMirrorPlainHTTPNeedsInsecure(t *testing.T) {
	reg := startRegistry(t)
	src, err := OpenLayout(writeLayout(t, map[string]*Artifact{"registry.k8s.io/pause:3.10.1": artifact(t, false)}))
	if err != nil {
		t.Fatal(err)
	}
	_, err = Mirror(context.Background(), MirrorOptions{Registry: reg, Source: src, Refs: []string{"registry.k8s.io/pause:3.10.1"}})
	if err == nil || !strings.Contains(err.Error(), "plain HTTP to "+reg+" refused") {
		t.Errorf("Mirror without Insecure = %v; want plain HTTP refused", err)
	}
}

// rewrite sends requests for upstream hosts to local registries standing
// in for them, over plain HTTP.
type rewrite map[string]string

func (m rewrite) RoundTrip(req *http.Request) (*http.Response, error) {
	to, ok := m[req.URL.Host]
	if !ok {
		return nil, fmt.Errorf("test: no stand-in for %s", req.URL.Host)
	}
	r := req.Clone(req.Context())
	r.URL.Scheme, r.URL.Host, r.Host = "http", to, to
	resp, err := http.DefaultTransport.RoundTrip(r)
	if resp != nil {
		resp.Request = req // the client learns the scheme from it
	}
	return resp, err
}

// --from-upstream pulls from each image's registry (here local stand-ins
// reached through the transport); an image upstream lacks (404) fails
// with its name and the registry's answer.
func TestMirrorFromUpstream(t *testing.T) {
	k8s, quay, reg := startRegistry(t), startRegistry(t), startRegistry(t)
	seed := map[string]*Artifact{
		k8s + "/pause:3.10.1":                  artifact(t, false),
		quay + "/kubevirt/kubevirt-ccm:v0.5.1": artifact(t, true),
	}
	for ref, a := range seed {
		r, _ := name.ParseReference(ref, name.Insecure)
		if a.Index != nil {
			err := remote.WriteIndex(r, a.Index)
			if err != nil {
				t.Fatal(err)
			}
		} else if err := remote.Write(r, a.Image); err != nil {
			t.Fatal(err)
		}
	}
	src := &Upstream{Transport: rewrite{"registry.k8s.io": k8s, "quay.io": quay}}
	rs, err := Mirror(context.Background(), MirrorOptions{
		Registry: reg, Insecure: true, Source: src,
		Refs: []string{"registry.k8s.io/pause:3.10.1", "quay.io/kubevirt/kubevirt-ccm:v0.5.1", "registry.k8s.io/etcd:v3.6.9"},
	})
	want := "registry.k8s.io/etcd:v3.6.9: not found at registry.k8s.io: the registry answered 404 Not Found: MANIFEST_UNKNOWN"
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("Mirror = %v\nwant an error with %q", err, want)
	}
	upstream := map[string]v1.Hash{
		"registry.k8s.io/pause:3.10.1":         seed[k8s+"/pause:3.10.1"].Digest,
		"quay.io/kubevirt/kubevirt-ccm:v0.5.1": seed[quay+"/kubevirt/kubevirt-ccm:v0.5.1"].Digest,
	}
	for _, r := range rs {
		d, ok := upstream[r.Image]
		if !ok {
			continue
		}
		got, err := pulled(t, r.Target)
		if r.Status != StatusCopied || err != nil || got != d {
			t.Errorf("%s: %s, pulled %s (%v); want copied with %s", r.Image, r.Status, got, err, d)
		}
	}
}

func TestLayoutRefs(t *testing.T) {
	const d1 = "sha256:1111111111111111111111111111111111111111111111111111111111111111"
	const d2 = "sha256:2222222222222222222222222222222222222222222222222222222222222222"
	manifest := func(digest string, ann map[string]string) string {
		s := fmt.Sprintf(`{"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":%q,"size":10`, digest)
		if ann != nil {
			s += `,"annotations":{`
			first := true
			for k, v := range ann {
				if !first {
					s += ","
				}
				first = false
				s += fmt.Sprintf("%q:%q", k, v)
			}
			s += "}"
		}
		return s + "}"
	}
	index := func(ms ...string) []byte {
		return []byte(`{"schemaVersion":2,"manifests":[` + strings.Join(ms, ",") + `]}`)
	}
	tests := []struct {
		name  string
		index []byte
		want  map[string]string // canonical ref -> digest
		err   string
	}{
		{"both annotations", index(manifest(d1, map[string]string{AnnotationRefName: "registry.k8s.io/pause:3.10.1", AnnotationContainerdName: "registry.k8s.io/pause:3.10.1"})),
			map[string]string{"registry.k8s.io/pause:3.10.1": d1}, ""},
		{"containerd's only, short form", index(manifest(d1, map[string]string{AnnotationContainerdName: "alpine:3"})),
			map[string]string{"docker.io/library/alpine:3": d1}, ""},
		{"ref.name as a bare tag names nothing", index(manifest(d1, map[string]string{AnnotationRefName: "3.10.1"})),
			map[string]string{}, ""},
		{"unnamed manifests are left out", index(manifest(d1, nil), manifest(d2, map[string]string{AnnotationRefName: "quay.io/a/b:1"})),
			map[string]string{"quay.io/a/b:1": d2}, ""},
		{"same image twice, same digest", index(manifest(d1, map[string]string{AnnotationRefName: "quay.io/a/b:1"}), manifest(d1, map[string]string{AnnotationContainerdName: "quay.io/a/b:1"})),
			map[string]string{"quay.io/a/b:1": d1}, ""},
		{"annotations disagree", index(manifest(d1, map[string]string{AnnotationRefName: "quay.io/a/b:1", AnnotationContainerdName: "quay.io/a/b:2"})),
			nil, "manifests[0]: io.containerd.image.name says quay.io/a/b:2, org.opencontainers.image.ref.name says quay.io/a/b:1"},
		{"one name, two digests", index(manifest(d1, map[string]string{AnnotationRefName: "quay.io/a/b:1"}), manifest(d2, map[string]string{AnnotationRefName: "quay.io/a/b:1"})),
			nil, "manifests[1]: quay.io/a/b:1 names both " + d1 + " and " + d2},
		{"a digest in the name that is not the manifest's", index(manifest(d1, map[string]string{AnnotationRefName: "quay.io/a/b@" + d2})),
			nil, "names digest " + d2},
		{"not a reference", index(manifest(d1, map[string]string{AnnotationContainerdName: "Quay.io/a/b:1"})),
			nil, "manifests[0]"},
		{"not JSON", []byte("{"), nil, "unexpected EOF"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := LayoutRefs(tt.index)
			if tt.err != "" {
				if err == nil || !strings.Contains(err.Error(), tt.err) {
					t.Fatalf("LayoutRefs = %v, %v; want an error with %q", got, err, tt.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != len(tt.want) {
				t.Errorf("LayoutRefs = %v, want %v", got, tt.want)
			}
			for ref, d := range tt.want {
				if got[ref].Digest.String() != d {
					t.Errorf("%s: %v, want %s", ref, got[ref].Digest, d)
				}
			}
		})
	}
}

// Whatever index.json LayoutRefs accepts, every name it returns is
// canonical and is what an annotation of that manifest says.
func FuzzLayoutRefs(f *testing.F) {
	f.Add([]byte(`{"schemaVersion":2,"manifests":[{"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"sha256:1111111111111111111111111111111111111111111111111111111111111111","size":1,"annotations":{"org.opencontainers.image.ref.name":"registry.k8s.io/pause:3.10.1","io.containerd.image.name":"registry.k8s.io/pause:3.10.1"}}]}`))
	f.Add([]byte(`{"schemaVersion":2,"manifests":[{"digest":"sha256:1111111111111111111111111111111111111111111111111111111111111111","annotations":{"io.containerd.image.name":"alpine"}},{"digest":"sha256:2222222222222222222222222222222222222222222222222222222222222222","annotations":{"org.opencontainers.image.ref.name":"latest"}}]}`))
	f.Add([]byte(`{}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		refs, err := LayoutRefs(data)
		if err != nil {
			return
		}
		for ref, d := range refs {
			r, err := parseCanonical(ref)
			if err != nil || r != ref {
				t.Fatalf("name %q is not canonical (%q, %v)", ref, r, err)
			}
			named := false
			for _, k := range []string{AnnotationRefName, AnnotationContainerdName} {
				if s, err := parseCanonical(d.Annotations[k]); err == nil && s == ref {
					named = true
				}
			}
			if !named {
				t.Fatalf("%s is named by none of its manifest's annotations %v", ref, d.Annotations)
			}
		}
	})
}

func parseCanonical(s string) (string, error) {
	r, err := imageref.Parse(s)
	return r.String(), err
}

// uploads records what a mirror run sends the registry: the blobs whose
// bytes it uploaded (an upload session finished with PUT ?digest=) and
// those it mounted from another repository of the registry (no bytes).
type uploads struct {
	mu               sync.Mutex
	uploaded, mounts []string
}

func (u *uploads) RoundTrip(req *http.Request) (*http.Response, error) {
	q := req.URL.Query()
	u.mu.Lock()
	switch {
	case req.Method == http.MethodPut && strings.Contains(req.URL.Path, "/blobs/uploads/"):
		u.uploaded = append(u.uploaded, q.Get("digest"))
	case req.Method == http.MethodPost && q.Get("mount") != "":
		u.mounts = append(u.mounts, q.Get("mount"))
	}
	u.mu.Unlock()
	return http.DefaultTransport.RoundTrip(req)
}

// sharingImages are a random image of three layers, a random layer, and
// the image with that layer added: the two images share three layers.
func sharingImages(t *testing.T) (base v1.Image, extra v1.Layer, derived v1.Image) {
	t.Helper()
	base, err := random.Image(4096, 3)
	if err != nil {
		t.Fatal(err)
	}
	if extra, err = random.Layer(4096, types.OCILayer); err != nil {
		t.Fatal(err)
	}
	if derived, err = mutate.AppendLayers(base, extra); err != nil {
		t.Fatal(err)
	}
	return base, extra, derived
}

// A blob the registry holds is not uploaded again: an image that shares
// layers with one mirrored before sends only its own layer and config.
func TestMirrorUploadsABlobOnce(t *testing.T) {
	reg := startRegistry(t)
	base, extra, derived := sharingImages(t)
	arts := map[string]*Artifact{}
	for ref, img := range map[string]v1.Image{"registry.k8s.io/base:1": base, "quay.io/derived/image:1": derived} {
		d, err := img.Digest()
		if err != nil {
			t.Fatal(err)
		}
		arts[ref] = &Artifact{Digest: d, Image: img}
	}
	src, err := OpenLayout(writeLayout(t, arts))
	if err != nil {
		t.Fatal(err)
	}
	run := func(refs ...string) *uploads {
		t.Helper()
		u := &uploads{}
		if _, err := Mirror(context.Background(), MirrorOptions{Registry: reg, Insecure: true, Source: src, Refs: refs, Transport: u}); err != nil {
			t.Fatal(err)
		}
		slices.Sort(u.uploaded)
		return u
	}
	digests := func(hs ...v1.Hash) []string {
		var out []string
		for _, h := range hs {
			out = append(out, h.String())
		}
		slices.Sort(out)
		return out
	}
	layers := func(img v1.Image) []v1.Hash {
		ls, err := img.Layers()
		if err != nil {
			t.Fatal(err)
		}
		var out []v1.Hash
		for _, l := range ls {
			d, err := l.Digest()
			if err != nil {
				t.Fatal(err)
			}
			out = append(out, d)
		}
		return out
	}
	baseConfig, _ := base.ConfigName()
	derivedConfig, _ := derived.ConfigName()
	extraDigest, _ := extra.Digest()

	if u := run("registry.k8s.io/base:1"); !slices.Equal(u.uploaded, digests(append(layers(base), baseConfig)...)) {
		t.Fatalf("first run uploaded %v; want base's three layers and config", u.uploaded)
	}
	u := run("registry.k8s.io/base:1", "quay.io/derived/image:1")
	if want := digests(extraDigest, derivedConfig); !slices.Equal(u.uploaded, want) {
		t.Errorf("second run uploaded %v; want only the derived image's own layer and config %v", u.uploaded, want)
	}
	t.Logf("second run: uploaded %d blobs, mounted %d from the base's repository", len(u.uploaded), len(u.mounts))
	if got, err := pulled(t, reg+"/quay.io/derived/image:1"); err != nil || got != arts["quay.io/derived/image:1"].Digest {
		t.Errorf("pull the derived image: %s %v", got, err)
	}
}

// In one run too, with the images copied at once: a blob two images
// share, or an index mirrored under two names, is uploaded once and
// mounted for the other.
func TestMirrorUploadsASharedBlobOnceInOneRun(t *testing.T) {
	base, _, derived := sharingImages(t)
	idx := artifact(t, true)
	arts := map[string]*Artifact{"ghcr.io/one/index:1": idx, "docker.io/two/index:1": idx}
	for ref, img := range map[string]v1.Image{"registry.k8s.io/base:1": base, "quay.io/derived/image:1": derived} {
		d, _ := img.Digest()
		arts[ref] = &Artifact{Digest: d, Image: img}
	}
	unique := map[string]bool{}
	var refs []string
	for ref, a := range arts {
		refs = append(refs, ref)
		blobs, err := blobsOf(a)
		if err != nil {
			t.Fatal(err)
		}
		for _, b := range blobs {
			unique[b.String()] = true
		}
	}
	src, err := OpenLayout(writeLayout(t, arts))
	if err != nil {
		t.Fatal(err)
	}
	reg := startRegistry(t)
	u := &uploads{}
	if _, err := Mirror(context.Background(), MirrorOptions{Registry: reg, Insecure: true, Source: src, Refs: refs, Transport: u}); err != nil {
		t.Fatal(err)
	}
	seen := map[string]int{}
	for _, d := range u.uploaded {
		if seen[d]++; seen[d] == 2 {
			t.Errorf("blob %s uploaded twice", d)
		}
	}
	if len(seen) != len(unique) {
		t.Errorf("uploaded %d distinct blobs; the images have %d", len(seen), len(unique))
	}
	t.Logf("%d blobs uploaded, %d mounted", len(u.uploaded), len(u.mounts))
	for ref, a := range arts {
		if got, err := pulled(t, reg+"/"+ref); err != nil || got != a.Digest {
			t.Errorf("pull %s: %s %v; want %s", ref, got, err, a.Digest)
		}
	}
}

// inFlight holds each blob upload (an upload session's POST until its
// PUT has been answered) until want are in flight at once, or a while
// has passed, the first time; it records the most it saw.
type inFlight struct {
	want    int
	mu      sync.Mutex
	n, most int
	full    chan struct{}
}

func (f *inFlight) RoundTrip(req *http.Request) (*http.Response, error) {
	switch {
	case req.Method == http.MethodPost && strings.HasSuffix(req.URL.Path, "/blobs/uploads/"):
		f.mu.Lock()
		f.n++
		f.most = max(f.most, f.n)
		if f.n == f.want {
			select {
			case <-f.full:
			default:
				close(f.full)
			}
		}
		f.mu.Unlock()
		select {
		case <-f.full:
		case <-time.After(10 * time.Second): // fewer at once than want: the test fails on most
		}
	case req.Method == http.MethodPut && strings.Contains(req.URL.Path, "/blobs/uploads/"):
		defer func() {
			f.mu.Lock()
			f.n--
			f.mu.Unlock()
		}()
	}
	return http.DefaultTransport.RoundTrip(req)
}

// Mirror copies DefaultJobs images at once, each with four blobs at
// once (go-containerregistry's default), and never more.
func TestMirrorConcurrency(t *testing.T) {
	reg := startRegistry(t)
	arts := map[string]*Artifact{}
	var refs []string
	for i := range DefaultJobs + 2 {
		img, err := random.Image(1024, 6)
		if err != nil {
			t.Fatal(err)
		}
		d, _ := img.Digest()
		ref := fmt.Sprintf("registry.k8s.io/image%d:1", i)
		arts[ref], refs = &Artifact{Digest: d, Image: img}, append(refs, ref)
	}
	src, err := OpenLayout(writeLayout(t, arts))
	if err != nil {
		t.Fatal(err)
	}
	const blobsAtOnce = 4
	f := &inFlight{want: DefaultJobs * blobsAtOnce, full: make(chan struct{})}
	if _, err := Mirror(context.Background(), MirrorOptions{Registry: reg, Insecure: true, Source: src, Refs: refs, Transport: f}); err != nil {
		t.Fatal(err)
	}
	if f.most != DefaultJobs*blobsAtOnce {
		t.Errorf("at most %d blob uploads at once; want %d (%d images × %d blobs)", f.most, DefaultJobs*blobsAtOnce, DefaultJobs, blobsAtOnce)
	}
}

// A run cancelled between its passes keeps what it found: an image the
// registry had stays present, and the image it had not begun to copy
// fails with the cancellation.
func TestMirrorCancelledKeepsWhatItFound(t *testing.T) {
	reg := startRegistry(t)
	arts := map[string]*Artifact{"registry.k8s.io/had:1": artifact(t, false), "registry.k8s.io/new:1": artifact(t, false)}
	src, err := OpenLayout(writeLayout(t, arts))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Mirror(context.Background(), MirrorOptions{Registry: reg, Insecure: true, Source: src, Refs: []string{"registry.k8s.io/had:1"}}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	rs, err := Mirror(ctx, MirrorOptions{Registry: reg, Insecure: true, Source: src, Refs: []string{"registry.k8s.io/had:1", "registry.k8s.io/new:1"},
		Progress: func(r Result) {
			if r.Status == StatusPresent {
				cancel() // before the second pass starts
			}
		}})
	got := statuses(rs)
	if got["registry.k8s.io/had:1"] != StatusPresent || got["registry.k8s.io/new:1"] != StatusFailed || !errors.Is(err, context.Canceled) && !strings.Contains(fmt.Sprint(err), "context canceled") {
		t.Errorf("cancelled run: %v, %v; want had present, new failed", got, err)
	}
}
