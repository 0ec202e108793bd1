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
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/remote/transport"

	"cozy.dev/cozy/internal/httpguard"
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
	// Charts are Helm charts to push as OCI artifacts (ChartImage), each
	// to REGISTRY/ChartPath/NAME:ChartTag(VERSION), where Flux reads them
	// through the rack's platform.mirror.
	Charts []MirrorChart
	// ChartPath is the repository path the charts go under
	// (DefaultChartPath if empty).
	ChartPath string
	// Jobs is how many images are copied at once (0: DefaultJobs).
	Jobs int
	// Transport carries the requests to the registry (nil:
	// http.DefaultTransport).
	Transport http.RoundTripper
	// Progress, when set, hears of each image as it starts (Status
	// copying) and as it ends. It is called from several goroutines.
	Progress func(Result)
}

// MirrorChart is a chart to mirror.
type MirrorChart struct {
	Name, Version string
	Image         v1.Image
}

// DefaultChartPath is where charts go in a registry without a rack's
// platform.mirror to say.
const DefaultChartPath = "charts"

// Result is what became of one image or chart.
type Result struct {
	// Image is the upstream reference; empty for a chart.
	Image string `json:"image,omitempty"`
	// Chart is "NAME VERSION" for a chart.
	Chart string `json:"chart,omitempty"`
	// Target is its name in the registry.
	Target string `json:"target"`
	Digest string `json:"digest,omitempty"`
	Status string `json:"status"`
	Error  string `json:"error,omitempty"`
}

// Mirror copies every image of o.Refs from o.Source into o.Registry as
// HOST/REPO:TAG → REGISTRY/HOST/REPO:TAG (imageref.Ref.In). An image whose
// manifest digest the registry already has under that name is not copied
// again, so an interrupted run resumes; a blob an image found or copied
// in this run holds is mounted, not uploaded again (blobHomes). Every
// image is tried; the error names each one that failed and why. Results
// come in the order of o.Refs.
func Mirror(ctx context.Context, o MirrorOptions) ([]Result, error) {
	if o.Source == nil {
		return nil, errors.New("mirror: no source")
	}
	if _, err := name.NewRegistry(o.Registry, name.StrictValidation); err != nil || o.Registry == "" || strings.Contains(o.Registry, "/") {
		return nil, fmt.Errorf("mirror: %q is not a registry HOST[:PORT]", o.Registry)
	}
	if strings.Trim(cmp.Or(o.ChartPath, DefaultChartPath), "/") != cmp.Or(o.ChartPath, DefaultChartPath) {
		return nil, fmt.Errorf("mirror: chart path %q: a repository path without leading or trailing /", o.ChartPath)
	}
	// Two passes: first what the registry already has (and so where
	// its blobs are), then the copies, so that no image uploads a blob
	// an image found in the registry holds.
	type job struct {
		what  Result // what it copies, for a run cancelled before its start
		check func() (Result, func() Result)
		write func() Result // nil once check has the result
	}
	jobs := make([]job, 0, len(o.Refs)+len(o.Charts))
	homes := newBlobHomes()
	for _, s := range o.Refs {
		jobs = append(jobs, job{what: Result{Image: s}, check: func() (Result, func() Result) { return mirrorImage(ctx, o, homes, s) }})
	}
	for _, c := range o.Charts {
		jobs = append(jobs, job{what: Result{Chart: c.Name + " " + c.Version}, check: func() (Result, func() Result) { return mirrorChart(ctx, o, homes, c) }})
	}
	results := make([]Result, len(jobs))
	sem := make(chan struct{}, cmp.Or(o.Jobs, DefaultJobs))
	// pass runs run for each job that needs it, o.Jobs at once; a
	// job still waiting when ctx ends has failed.
	pass := func(needs func(i int) bool, run func(i int)) {
		var wg sync.WaitGroup
		for i := range jobs {
			if !needs(i) {
				continue
			}
			wg.Go(func() {
				select {
				case sem <- struct{}{}:
					defer func() { <-sem }()
				case <-ctx.Done():
					results[i], jobs[i].write = failed(jobs[i].what, ctx.Err()), nil
					return
				}
				run(i)
			})
		}
		wg.Wait()
	}
	done := func(i int) {
		if o.Progress != nil {
			o.Progress(results[i])
		}
	}
	pass(func(int) bool { return true }, func(i int) {
		if results[i], jobs[i].write = jobs[i].check(); jobs[i].write == nil {
			done(i)
		}
	})
	pass(func(i int) bool { return jobs[i].write != nil }, func(i int) {
		results[i] = jobs[i].write()
		done(i)
	})
	var errs []error
	for _, r := range results {
		if r.Status == StatusFailed {
			errs = append(errs, fmt.Errorf("%s: %s", r.What(), r.Error))
		}
	}
	if len(errs) > 0 {
		return results, fmt.Errorf("%d of %d not mirrored into %s:\n%w", len(errs), len(results), o.Registry, errors.Join(errs...))
	}
	return results, nil
}

// What names the image or chart: the image's reference, or "chart NAME VERSION".
func (r Result) What() string {
	if r.Chart != "" {
		return "chart " + r.Chart
	}
	return r.Image
}

func mirrorImage(ctx context.Context, o MirrorOptions, homes *blobHomes, s string) (Result, func() Result) {
	res := Result{Image: s}
	ref, err := imageref.Parse(s)
	if err != nil {
		return failed(res, err), nil
	}
	res.Image = ref.String()
	target, err := ref.In(o.Registry)
	if err != nil {
		return failed(res, err), nil
	}
	res.Target = target.String()
	return copyArtifact(ctx, o, homes, res, func() (*Artifact, error) { return o.Source.Get(ctx, ref) })
}

func mirrorChart(ctx context.Context, o MirrorOptions, homes *blobHomes, c MirrorChart) (Result, func() Result) {
	res := Result{Chart: c.Name + " " + c.Version}
	res.Target = o.Registry + "/" + cmp.Or(o.ChartPath, DefaultChartPath) + "/" + c.Name + ":" + ChartTag(c.Version)
	return copyArtifact(ctx, o, homes, res, func() (*Artifact, error) {
		d, err := c.Image.Digest()
		return &Artifact{Digest: d, Image: c.Image}, err
	})
}

func failed(res Result, err error) Result {
	res.Status, res.Error = StatusFailed, err.Error()
	return res
}

// copyArtifact checks whether the registry has what get gives at
// res.Target: if so, or if it fails, it returns the result; if not, the
// function that copies it there, mounting the blobs homes knows in
// another of the registry's repositories.
func copyArtifact(ctx context.Context, o MirrorOptions, homes *blobHomes, res Result, get func() (*Artifact, error)) (Result, func() Result) {
	fail := func(err error) (Result, func() Result) { return failed(res, err), nil }
	target := res.Target
	var nameOpts []name.Option
	if o.Insecure {
		nameOpts = append(nameOpts, name.Insecure)
	}
	dst, err := name.ParseReference(target, nameOpts...)
	if err != nil {
		return fail(err)
	}
	if o.Progress != nil {
		o.Progress(Result{Image: res.Image, Chart: res.Chart, Target: res.Target, Status: StatusCopying})
	}

	art, err := get()
	if err != nil {
		return fail(err)
	}
	res.Digest = art.Digest.String()
	blobs, err := blobsOf(art)
	if err != nil {
		return fail(err)
	}

	ropts := []remote.Option{
		remote.WithContext(ctx),
		remote.WithTransport(httpguard.Transport{Base: o.Transport, AllowHTTP: o.Insecure}),
		remote.WithUserAgent(userAgent),
	}
	head, err := remote.Head(dst, ropts...)
	var te *transport.Error
	switch {
	case err == nil && head.Digest == art.Digest:
		homes.found(dst.Context(), blobs)
		res.Status = StatusPresent
		return res, nil
	case err != nil && !errors.As(err, &te):
		// Not an answer from the registry: it is not reachable.
		return fail(fmt.Errorf("registry %s: %w", o.Registry, err))
	}
	// Absent, another digest under this tag, or the registry would not
	// say (401/403 on HEAD): the push gives the real answer.
	return res, func() Result {
		fail := func(err error) Result { return failed(res, err) }
		mounts, done, err := homes.reserve(ctx, dst.Context(), blobs)
		if err != nil {
			return fail(err)
		}
		if art.Index != nil {
			err = remote.WriteIndex(dst, mountIndex{art.Index, mounts}, ropts...)
		} else {
			err = remote.Write(dst, mountImage{art.Image, mounts}, ropts...)
		}
		done(err == nil)
		var te *transport.Error
		if errors.As(err, &te) {
			return fail(fmt.Errorf("push to %s refused: %s", target, answer(te)))
		} else if err != nil {
			return fail(fmt.Errorf("push to %s: %w", target, err))
		}
		res.Status = StatusCopied
		return res
	}
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
