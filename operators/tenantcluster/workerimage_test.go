package tenantcluster

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/utils/ptr"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	v1 "cozy.dev/cozy/operators/api/v1alpha1"
)

// testImages is a worker image repository for tests that only build
// objects.
var testImages = WorkerImages{Repository: "10.0.0.1:5000/cozy.dev/tenant-worker", Insecure: true, Mirror: "http://10.0.0.1:5000"}

// testVersions are the versions the tests' TenantClusters run; the
// registry of workerRegistry holds a worker image for each.
var testVersions = []string{"v1.35.4", "v1.35.9", "v1.36.0", "v1.36.1", "v1.36.2", "v1.36.3", "v1.37.0", "v1.37.1"}

// workerRegistry is a registry on loopback (go-containerregistry's, in
// memory) holding a small image as the worker image of each version,
// and the WorkerImages that read it. requests counts what it was asked.
func workerRegistry(t testing.TB, versions ...string) (WorkerImages, *atomic.Int64) {
	t.Helper()
	var requests atomic.Int64
	reg := registry.New(registry.Logger(log.New(io.Discard, "", 0)))
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.Contains(r.URL.Path, "/manifests/") {
			requests.Add(1)
		}
		reg.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	w := WorkerImages{Repository: strings.TrimPrefix(srv.URL, "http://") + "/cozy.dev/tenant-worker", Insecure: true}
	for _, v := range versions {
		pushWorkerImage(t, w, v)
	}
	requests.Store(0)
	return w, &requests
}

func pushWorkerImage(t testing.TB, w WorkerImages, version string) {
	t.Helper()
	img, err := random.Image(256, 1)
	if err != nil {
		t.Fatal(err)
	}
	ref, err := name.ParseReference(w.Ref(version), name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(ref, img); err != nil {
		t.Fatal(err)
	}
}

func TestWorkerImagesCheck(t *testing.T) {
	w, _ := workerRegistry(t, "v1.36.3")
	ctx := context.Background()
	if err := w.Check(ctx, w.Ref("v1.36.3")); err != nil {
		t.Errorf("present image: %v", err)
	}
	if err := w.Check(ctx, w.Ref("v1.35.0")); !errors.Is(err, errImageMissing) {
		t.Errorf("absent tag: %v, want errImageMissing", err)
	}
	other := w
	other.Repository = strings.Replace(w.Repository, "tenant-worker", "no-such-repository", 1)
	if err := other.Check(ctx, other.Ref("v1.36.3")); !errors.Is(err, errImageMissing) {
		t.Errorf("absent repository: %v, want errImageMissing", err)
	}

	tls := w
	tls.Insecure = false
	if err := tls.Check(ctx, tls.Ref("v1.36.3")); err == nil || errors.Is(err, errImageMissing) || !strings.Contains(err.Error(), "plain HTTP") {
		t.Errorf("a registry over plain HTTP without Insecure: %v, want a refusal", err)
	}

	// A port nothing listens on: the check cannot tell, and says so.
	srv := httptest.NewServer(http.NotFoundHandler())
	gone := WorkerImages{Repository: strings.TrimPrefix(srv.URL, "http://") + "/cozy.dev/tenant-worker", Insecure: true}
	srv.Close()
	if err := gone.Check(ctx, gone.Ref("v1.36.3")); err == nil || errors.Is(err, errImageMissing) {
		t.Errorf("unreachable registry: %v, want an error other than errImageMissing", err)
	}

	if (WorkerImages{}).Ref("v1.36.3") != "" {
		t.Error("no repository gave a reference")
	}
}

// TestImageChecksRemember: one request per version, however many ask;
// a missing image is asked again after imageMissingTTL, a found one
// after imageFoundTTL.
func TestImageChecksRemember(t *testing.T) {
	w, requests := workerRegistry(t, "v1.36.3")
	c := newImageChecks(w)
	now := time.Unix(1000, 0)
	c.now = func() time.Time { return now }
	ctx := context.Background()
	for range 100 {
		if err := c.check(ctx, w.Ref("v1.36.3")); err != nil {
			t.Fatal(err)
		}
		if err := c.check(ctx, w.Ref("v1.37.0")); !errors.Is(err, errImageMissing) {
			t.Fatalf("missing image: %v", err)
		}
	}
	if n := requests.Load(); n != 2 {
		t.Errorf("%d registry requests for 200 checks of two images, want 2", n)
	}
	pushWorkerImage(t, w, "v1.37.0")
	requests.Store(0)
	now = now.Add(imageMissingTTL)
	if err := c.check(ctx, w.Ref("v1.37.0")); err != nil {
		t.Errorf("pushed image, after imageMissingTTL: %v", err)
	}
	if err := c.check(ctx, w.Ref("v1.36.3")); err != nil {
		t.Error(err)
	}
	if n := requests.Load(); n != 1 {
		t.Errorf("%d requests after imageMissingTTL, want 1 (the found image is remembered longer)", n)
	}
	now = now.Add(imageFoundTTL)
	_ = c.check(ctx, w.Ref("v1.36.3"))
	if n := requests.Load(); n != 2 {
		t.Errorf("found image not asked again after imageFoundTTL (%d requests)", n)
	}
}

// TestHeldGroups: which node groups wait for their worker image, and why.
func TestHeldGroups(t *testing.T) {
	w, requests := workerRegistry(t, "v1.36.3")
	md := func(version string) *clusterv1.MachineDeployment {
		m := &clusterv1.MachineDeployment{}
		m.Spec.Template.Spec.Version = version
		return m
	}
	for _, tt := range []struct {
		name   string
		images WorkerImages
		group  v1.NodeGroup
		md     *clusterv1.MachineDeployment
		v      Versions
		want   string // part of why the group is held; "" not held
	}{
		{name: "image in the registry", images: w, v: Uniform("v1.36.3")},
		{name: "image missing", images: w, v: Uniform("v1.37.0"),
			want: "node group g waits for its worker image " + w.Ref("v1.37.0") + ", which is not in the registry: build it with `cozyctl tenant image build --version v1.37.0`"},
		{name: "running group keeps its version", images: w, md: md("v1.35.0"), v: Versions{ControlPlane: "v1.36.3", Groups: map[string]string{"g": "v1.35.0"}}},
		{name: "running group moving to a missing image", images: w, md: md("v1.36.3"), v: Uniform("v1.37.0"), want: "is not in the registry"},
		{name: "no repository", v: Uniform("v1.36.3"), want: "names no image and the operator has no worker image repository"},
		{name: "group names a registry image", group: v1.NodeGroup{Image: v1.ImageSource{Registry: "docker://example.com/disk:1"}}, v: Uniform("v1.36.3")},
		{name: "group names a URL", group: v1.NodeGroup{Image: v1.ImageSource{URL: "http://example.com/disk.qcow2"}}, v: Uniform("v1.36.3")},
	} {
		t.Run(tt.name, func(t *testing.T) {
			g := tt.group
			g.Name = "g"
			tc := &v1.TenantCluster{
				ObjectMeta: metav1.ObjectMeta{Name: "acme", Namespace: "tenant-acme"},
				Spec:       v1.TenantClusterSpec{Version: tt.v.ControlPlane, NodeGroups: []v1.NodeGroup{g}},
			}
			o := Observed{MachineDeployments: map[string]*clusterv1.MachineDeployment{}}
			if tt.md != nil {
				o.MachineDeployments["g"] = tt.md
			}
			r := &Reconciler{WorkerImages: tt.images, imageChecks: newImageChecks(tt.images)}
			got := r.heldGroups(context.Background(), tc, o, tt.v)["g"].Message
			if (got == "") != (tt.want == "") || !strings.Contains(got, tt.want) {
				t.Errorf("held: %q, want %q", got, tt.want)
			}
		})
	}
	if n := requests.Load(); n == 0 {
		t.Error("the registry was never asked")
	}
}

// An unreachable registry holds nothing back and says so in an event.
func TestHeldGroupsUnreachableRegistry(t *testing.T) {
	srv := httptest.NewServer(http.NotFoundHandler())
	w := WorkerImages{Repository: strings.TrimPrefix(srv.URL, "http://") + "/cozy.dev/tenant-worker", Insecure: true}
	srv.Close()
	rec := &recordingRecorder{}
	r := &Reconciler{WorkerImages: w, imageChecks: newImageChecks(w), Recorder: rec}
	tc := &v1.TenantCluster{Spec: v1.TenantClusterSpec{Version: "v1.36.3", NodeGroups: []v1.NodeGroup{{Name: "g", Replicas: ptr.To[int32](1)}}}}
	if held := r.heldGroups(context.Background(), tc, Observed{}, Uniform("v1.36.3")); len(held) != 0 {
		t.Errorf("held %v", held)
	}
	if len(rec.events) != 1 || !strings.Contains(rec.events[0], corev1.EventTypeWarning+" WorkerImageUnchecked cannot tell whether worker image "+w.Ref("v1.36.3")+" exists") {
		t.Errorf("events %q", rec.events)
	}
}

// recordingRecorder keeps the events it is given, as "TYPE REASON NOTE".
type recordingRecorder struct{ events []string }

func (r *recordingRecorder) Eventf(_, _ runtime.Object, typ, reason, _, note string, args ...any) {
	r.events = append(r.events, typ+" "+reason+" "+fmt.Sprintf(note, args...))
}
