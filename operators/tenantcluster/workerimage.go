package tenantcluster

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/remote/transport"
	"golang.org/x/sync/singleflight"
	corev1 "k8s.io/api/core/v1"

	"cozy.dev/cozy/internal/httpguard"
	"cozy.dev/cozy/internal/imageref"
	v1 "cozy.dev/cozy/operators/api/v1alpha1"
)

// WorkerImages is where a node group that names no image finds its disk:
// Cozy's own worker containerDisk for its Kubernetes version,
// REPOSITORY:VERSION, as `cozyctl tenant image build` names it and
// `cozyctl images mirror` pushes it (docs/tenants.md#worker-images); and
// where the workers' containerd pulls the images of their pods.
type WorkerImages struct {
	// Repository is HOST[:PORT]/PATH, such as
	// 10.0.0.1:5000/cozy.dev/tenant-worker. Empty: there is none, and
	// every node group must name its image.
	Repository string
	// Insecure reads the registry over plain HTTP (CDI must then list
	// the host in its insecureRegistries, as the platform does).
	Insecure bool
	// Mirror is the rack's registry mirror, http(s)://HOST[:PORT] (its
	// registries.mirror): the workers pull the images of docker.io,
	// ghcr.io, quay.io and registry.k8s.io through it, as the rack's
	// Talos nodes do. Empty: from the registries themselves.
	Mirror string
	// Mirrors are the rack's registries.mirrors: a registry host (or "*"
	// for every other one) and the endpoints its images are pulled from,
	// in order, as the rack's Talos nodes pull them. No host is in both
	// Mirror's and Mirrors.
	Mirrors map[string][]string
	// Transport carries the operator's checks (nil: http.DefaultTransport).
	Transport http.RoundTripper
}

// Ref is the worker image for a version, "" if there is no repository.
func (w WorkerImages) Ref(version string) string {
	if w.Repository == "" {
		return ""
	}
	return w.Repository + ":" + version
}

// Check reads whether the registry holds ref: nil if it does,
// errImageMissing if the registry says it does not, another error if it
// cannot tell (unreachable, refused, not a registry).
func (w WorkerImages) Check(ctx context.Context, ref string) error {
	var opts []name.Option
	insecure := w.Insecure
	if host, plain := w.mirrorHost(); plain && strings.HasPrefix(ref, host+"/") {
		insecure = true // the rack's mirror, over plain HTTP
	}
	if insecure {
		opts = append(opts, name.Insecure)
	}
	r, err := name.ParseReference(ref, opts...)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, imageCheckTimeout)
	defer cancel()
	_, err = remote.Head(r, remote.WithContext(ctx), remote.WithUserAgent("cozy-operator"),
		remote.WithTransport(httpguard.Transport{Base: w.Transport, AllowHTTP: insecure}))
	var te *transport.Error
	if errors.As(err, &te) && te.StatusCode == http.StatusNotFound {
		return errImageMissing
	}
	return err
}

var errImageMissing = errors.New("not in the registry")

// mirrorHost is the host of the rack's registry mirror (Mirror), and
// whether it is reached over plain HTTP; "" without a mirror.
func (w WorkerImages) mirrorHost() (string, bool) {
	u, err := url.Parse(w.Mirror)
	if w.Mirror == "" || err != nil {
		return "", false
	}
	return u.Host, u.Scheme == "http"
}

// InMirror is where the rack's registry mirror keeps image: under its
// registry host, named as `cozyctl images mirror` names it
// (imageref.Ref.In: HOST/registry.k8s.io/kube-apiserver:v1.36.3); ""
// without a mirror.
func (w WorkerImages) InMirror(image string) (string, error) {
	host, _ := w.mirrorHost()
	if host == "" {
		return "", nil
	}
	r, err := imageref.Parse(image)
	if err != nil {
		return "", err
	}
	in, err := r.In(host)
	if err != nil {
		return "", err
	}
	return in.String(), nil
}

// imageCheckTimeout bounds one HEAD: a reconcile must not hang on a
// registry that does not answer.
const imageCheckTimeout = 10 * time.Second

// Variables, not constants, so that a test need not wait them out.
var (
	// imageFoundTTL and imageMissingTTL are how long an answer is
	// reused: a found image stays (tags of released versions do not
	// move); a missing one or a failed check is asked again soon, since
	// someone may be pushing it.
	imageFoundTTL   = 10 * time.Minute
	imageMissingTTL = 20 * time.Second
	// workerImageRetry is how soon a TenantCluster whose workers wait
	// for their image looks again.
	workerImageRetry = 30 * time.Second
)

// imageChecks remembers the registry's answers, so a thousand
// TenantClusters at one version cost one request.
type imageChecks struct {
	images WorkerImages
	now    func() time.Time
	flight singleflight.Group

	mu   sync.Mutex
	seen map[string]imageAnswer
}

type imageAnswer struct {
	err error
	at  time.Time
}

func newImageChecks(w WorkerImages) *imageChecks {
	return &imageChecks{images: w, now: time.Now, seen: map[string]imageAnswer{}}
}

// check is WorkerImages.Check, remembered.
func (c *imageChecks) check(ctx context.Context, ref string) error {
	c.mu.Lock()
	a, ok := c.seen[ref]
	c.mu.Unlock()
	if ok {
		ttl := imageMissingTTL
		if a.err == nil {
			ttl = imageFoundTTL
		}
		if c.now().Sub(a.at) < ttl {
			return a.err
		}
	}
	v, _, _ := c.flight.Do(ref, func() (any, error) {
		// Not the caller's context: its cancellation must not become the
		// answer every other caller is given.
		err := c.images.Check(context.WithoutCancel(ctx), ref)
		c.mu.Lock()
		c.seen[ref] = imageAnswer{err: err, at: c.now()}
		c.mu.Unlock()
		return err, nil
	})
	err, _ := v.(error)
	return err
}

// imageHold holds a group that boots the default image while the
// registry lacks it for the group's version, or there is no repository.
// Only a group being created or moved to another version is checked: the
// disk of one that runs is already known to be there. A check that
// cannot tell holds nothing (the importer will report the same trouble)
// but is told as a Warning event.
func (r *Reconciler) imageHold(ctx context.Context, tc *v1.TenantCluster, g v1.NodeGroup, o Observed, v Versions) (hold, bool) {
	if g.Image.URL != "" || g.Image.Registry != "" {
		return hold{}, false
	}
	version := v.Group(g.Name)
	if md := o.MachineDeployments[g.Name]; md != nil && md.Spec.Template.Spec.Version == version {
		return hold{}, false
	}
	ref := r.WorkerImages.Ref(version)
	if ref == "" {
		return hold{ReasonWorkerImageMissing, fmt.Sprintf("node group %s names no image and the operator has no worker image repository: "+
			"set the platform's cozyOperator.workerImage (the rack's registries.mirror sets it) or the group's image", g.Name)}, true
	}
	switch err := r.imageChecks.check(ctx, ref); {
	case errors.Is(err, errImageMissing):
		return hold{ReasonWorkerImageMissing, fmt.Sprintf("node group %s waits for its worker image %s, which is not in the registry: "+
			"build it with `cozyctl tenant image build --version %s` and push it with `cozyctl images mirror`", g.Name, ref, version)}, true
	case err != nil:
		r.event(tc, corev1.EventTypeWarning, "WorkerImageUnchecked", "CheckImage", "cannot tell whether worker image %s exists: %v", ref, err)
	}
	return hold{}, false
}
