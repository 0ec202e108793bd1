package tenantcluster

import (
	"context"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	corev1 "k8s.io/api/core/v1"

	v1 "cozy.dev/cozy/operators/api/v1alpha1"
)

// The control plane's images are looked for in the rack's registry mirror,
// under their registry host as `images mirror` names them: all there says
// nothing; some missing names them, the mirror and the command that
// fills it; no mirror checks nothing; a mirror that does not answer holds
// nothing back and says so in a Warning event.
func TestMissingControlPlaneImages(t *testing.T) {
	srv := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	t.Cleanup(srv.Close)
	host := strings.TrimPrefix(srv.URL, "http://")
	for _, image := range append(ControlPlaneImages("v1.36.3"), "registry.k8s.io/kube-apiserver:v1.35.4") {
		img, err := random.Image(64, 1)
		if err != nil {
			t.Fatal(err)
		}
		ref, err := name.ParseReference(host+"/"+image, name.Insecure)
		if err != nil {
			t.Fatal(err)
		}
		if err := remote.Write(ref, img); err != nil {
			t.Fatal(err)
		}
	}
	tc := &v1.TenantCluster{}
	ctx := context.Background()
	check := func(w WorkerImages, version string) (string, []string) {
		rec := &recordingRecorder{}
		r := &Reconciler{WorkerImages: w, imageChecks: newImageChecks(w), Recorder: rec}
		return r.missingControlPlaneImages(ctx, tc, version), rec.events
	}
	mirror := WorkerImages{Mirror: srv.URL}
	if msg, events := check(mirror, "v1.36.3"); msg != "" || len(events) != 0 {
		t.Errorf("all there: %q, events %q", msg, events)
	}
	want := "the control plane at v1.35.4 waits for registry.k8s.io/kube-controller-manager:v1.35.4, registry.k8s.io/kube-scheduler:v1.35.4, " +
		"which the rack's registry mirror " + srv.URL + " lacks: copy them there with `cozyctl images mirror --tenant-version v1.35.4`"
	if msg, _ := check(mirror, "v1.35.4"); msg != want {
		t.Errorf("two missing:\n got %s\nwant %s", msg, want)
	}
	if msg, _ := check(WorkerImages{}, "v1.35.4"); msg != "" {
		t.Errorf("no mirror: %q", msg)
	}

	gone := httptest.NewServer(http.NotFoundHandler())
	gone.Close()
	msg, events := check(WorkerImages{Mirror: gone.URL}, "v1.36.3")
	if msg != "" || len(events) != len(ControlPlaneComponents) ||
		!strings.Contains(events[0], corev1.EventTypeWarning+" ControlPlaneImageUnchecked cannot tell whether the registry mirror holds registry.k8s.io/kube-apiserver:v1.36.3") {
		t.Errorf("unreachable mirror: %q, events %q", msg, events)
	}
}
