package images

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/remote/transport"

	"cozy.dev/cozy/internal/imageref"
)

// DefaultJobs is how many images Mirror copies at once; each also copies
// up to four layers at once.
const DefaultJobs = 3

const userAgent = "cozyctl"

// Statuses of a Result.
const (
	StatusCopying = "copying" // only in progress reports
	StatusCopied  = "copied"
	StatusPresent = "present" // the registry already had this digest
	StatusFailed  = "failed"
)

// MirrorOptions say what Mirror copies where.
type MirrorOptions struct {
	// Registry is the target's HOST[:PORT].
	Registry string
	// Insecure allows plain HTTP to the registry; without it only HTTPS
	// is used, even for addresses go-containerregistry would otherwise
	// try over HTTP (loopback, private networks).
	Insecure bool
	// Source holds the images.
	Source Source
	// Refs are the images, as `images list` gives them.
	Refs []string
	// Jobs is how many images are copied at once (0: DefaultJobs).
	Jobs int
	// Transport carries the requests to the registry (nil:
	// http.DefaultTransport).
	Transport http.RoundTripper
	// Progress, when set, hears of each image as it starts (Status
	// copying) and as it ends. It is called from several goroutines.
	Progress func(Result)
}

// Result is what became of one image.
type Result struct {
	// Image is the upstream reference.
	Image string `json:"image"`
	// Target is its name in the registry.
	Target string `json:"target"`
	Digest string `json:"digest,omitempty"`
	Status string `json:"status"`
	Error  string `json:"error,omitempty"`
}

// Mirror copies every image of o.Refs from o.Source into o.Registry as
// HOST/REPO:TAG → REGISTRY/HOST/REPO:TAG (imageref.Ref.In). An image whose
// manifest digest the registry already has under that name is not copied
// again, and blobs the registry has are not uploaded again, so an
// interrupted run resumes. Every image is tried; the error names each one
// that failed and why. Results come in the order of o.Refs.
func Mirror(ctx context.Context, o MirrorOptions) ([]Result, error) {
	if o.Source == nil {
		return nil, errors.New("mirror: no source")
	}
	if _, err := name.NewRegistry(o.Registry, name.StrictValidation); err != nil || o.Registry == "" || strings.Contains(o.Registry, "/") {
		return nil, fmt.Errorf("mirror: %q is not a registry HOST[:PORT]", o.Registry)
	}
	results := make([]Result, len(o.Refs))
	sem := make(chan struct{}, cmp.Or(o.Jobs, DefaultJobs))
	var wg sync.WaitGroup
	for i, s := range o.Refs {
		wg.Go(func() {
			select {
			case sem <- struct{}{}:
				defer func() { <-sem }()
			case <-ctx.Done():
				results[i] = Result{Image: s, Status: StatusFailed, Error: ctx.Err().Error()}
				return
			}
			results[i] = mirrorOne(ctx, o, s)
			if o.Progress != nil {
				o.Progress(results[i])
			}
		})
	}
	wg.Wait()
	var errs []error
	for _, r := range results {
		if r.Status == StatusFailed {
			errs = append(errs, fmt.Errorf("%s: %s", r.Image, r.Error))
		}
	}
	if len(errs) > 0 {
		return results, fmt.Errorf("%d of %d images not mirrored into %s:\n%w", len(errs), len(results), o.Registry, errors.Join(errs...))
	}
	return results, nil
}

func mirrorOne(ctx context.Context, o MirrorOptions, s string) Result {
	res := Result{Image: s}
	fail := func(err error) Result {
		res.Status, res.Error = StatusFailed, err.Error()
		return res
	}
	ref, err := imageref.Parse(s)
	if err != nil {
		return fail(err)
	}
	res.Image = ref.String()
	target, err := ref.In(o.Registry)
	if err != nil {
		return fail(err)
	}
	res.Target = target.String()
	var nameOpts []name.Option
	if o.Insecure {
		nameOpts = append(nameOpts, name.Insecure)
	}
	dst, err := name.ParseReference(target.String(), nameOpts...)
	if err != nil {
		return fail(err)
	}
	if o.Progress != nil {
		o.Progress(Result{Image: res.Image, Target: res.Target, Status: StatusCopying})
	}

	art, err := o.Source.Get(ctx, ref)
	if err != nil {
		return fail(err)
	}
	res.Digest = art.Digest.String()

	ropts := []remote.Option{
		remote.WithContext(ctx),
		remote.WithTransport(httpGuard{base: o.Transport, allowHTTP: o.Insecure}),
		remote.WithUserAgent(userAgent),
	}
	head, err := remote.Head(dst, ropts...)
	var te *transport.Error
	switch {
	case err == nil && head.Digest == art.Digest:
		res.Status = StatusPresent
		return res
	case err != nil && !errors.As(err, &te):
		// Not an answer from the registry: it is not reachable.
		return fail(fmt.Errorf("registry %s: %w", o.Registry, err))
	}
	// Absent, another digest under this tag, or the registry would not
	// say (401/403 on HEAD): the push gives the real answer.
	if art.Index != nil {
		err = remote.WriteIndex(dst, art.Index, ropts...)
	} else {
		err = remote.Write(dst, art.Image, ropts...)
	}
	if err != nil {
		if errors.As(err, &te) {
			return fail(fmt.Errorf("push to %s refused: %s", target, answer(te)))
		}
		return fail(fmt.Errorf("push to %s: %w", target, err))
	}
	res.Status = StatusCopied
	return res
}

// answer is a registry's refusal as a person reads it: the HTTP status
// and the registry's own error codes and messages (or its body).
func answer(te *transport.Error) string {
	status := fmt.Sprintf("%d %s", te.StatusCode, http.StatusText(te.StatusCode))
	noReq := *te
	noReq.Request = nil // its method and URL are noise here
	body := noReq.Error()
	body = strings.TrimPrefix(body, "unexpected status code "+status)
	body = strings.TrimPrefix(body, ": ")
	if body == "" || strings.HasPrefix(body, " (HEAD responses") {
		return "the registry answered " + status
	}
	return fmt.Sprintf("the registry answered %s: %s", status, body)
}

// httpGuard refuses plain HTTP unless allowed: go-containerregistry falls
// back to HTTP by itself for loopback and private addresses.
type httpGuard struct {
	base      http.RoundTripper
	allowHTTP bool
}

func (g httpGuard) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.URL.Scheme == "http" && !g.allowHTTP {
		return nil, fmt.Errorf("plain HTTP to %s refused: HTTPS only unless insecure (--insecure)", req.URL.Host)
	}
	return cmp.Or[http.RoundTripper](g.base, http.DefaultTransport).RoundTrip(req)
}
