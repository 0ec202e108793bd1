//go:build integration && bench

package images

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"cozy.dev/cozy/internal/imageref"
	"cozy.dev/cozy/internal/testing/cozyctl"
	"cozy.dev/cozy/internal/testing/prereq"
	"cozy.dev/cozy/internal/testing/verdict"
)

// TestBenchImagesMirror copies the lab's images (an OCI layout built from
// source by hack/lab-images.sh, about 200 MB) into an empty registry on
// loopback with `cozyctl images mirror` and with Debian's skopeo, given
// the same concurrency (DefaultJobs images at once: skopeo copies one
// image per run, so that many runs at once) and the same work (digests
// kept: skopeo --preserve-digests; checked after every copy), in five
// rounds that
// alternate which goes first, each into a fresh registry. It prints each
// one's median throughput and the ratio. Run with `make bench`.
func TestBenchImagesMirror(t *testing.T) {
	skopeo, err := exec.LookPath("skopeo")
	if err != nil {
		prereq.Missing(t, "skopeo is not installed: run hack/install-deps.sh")
	}
	lay := os.Getenv("COZY_LAB_IMAGES")
	if lay == "" {
		prereq.Missing(t, "COZY_LAB_IMAGES is not set: run with COZY_LAB_IMAGES=$(hack/lab-images.sh)")
	}
	src, err := OpenLayout(lay)
	if err != nil {
		t.Fatal(err)
	}
	refs := src.Refs()
	var size int64
	digests := map[string]v1.Hash{}
	for _, r := range refs {
		ref, err := imageref.Parse(r)
		if err != nil {
			t.Fatal(err)
		}
		art, err := src.Get(context.Background(), ref)
		if err != nil {
			t.Fatal(err)
		}
		size += artifactSize(t, art)
		digests[r] = art.Digest
	}
	// Both must copy, not convert: every image in the registry with the
	// layout's digest (skopeo would otherwise compress the uncompressed
	// layers, which is other work and other images).
	sameDigests := func(reg string) error {
		for r, want := range digests {
			ref, _ := imageref.Parse(r)
			dst, _ := ref.In(reg)
			n, err := name.ParseReference(dst.String(), name.Insecure)
			if err != nil {
				return err
			}
			d, err := remote.Head(n)
			if err != nil {
				return err
			}
			if d.Digest != want {
				return fmt.Errorf("%s is %s in the registry, %s in the layout", r, d.Digest, want)
			}
		}
		return nil
	}
	bin := cozyctl.Path(t)
	tools := map[string]func(reg string) error{
		"cozy": func(reg string) error {
			out, err := exec.Command(bin, "images", "mirror", "--from", lay, "--to", reg, "--insecure").CombinedOutput()
			if err != nil {
				return fmt.Errorf("%v: %s", err, out)
			}
			return nil
		},
		"skopeo": func(reg string) error {
			sem := make(chan struct{}, DefaultJobs)
			errs := make([]error, len(refs))
			var wg sync.WaitGroup
			for i, r := range refs {
				wg.Go(func() {
					sem <- struct{}{}
					defer func() { <-sem }()
					ref, _ := imageref.Parse(r)
					dst, _ := ref.In(reg)
					out, err := exec.Command(skopeo, "copy", "--all", "--preserve-digests", "--quiet", "--dest-tls-verify=false",
						"oci:"+lay+":"+r, "docker://"+dst.String()).CombinedOutput()
					if err != nil {
						errs[i] = fmt.Errorf("skopeo copy %s: %v: %s", r, err, out)
					}
				})
			}
			wg.Wait()
			for _, err := range errs {
				if err != nil {
					return err
				}
			}
			return nil
		},
	}
	const rounds = 5
	times := map[string][]time.Duration{}
	for round := range rounds {
		order := []string{"cozy", "skopeo"}
		if round%2 == 1 {
			slices.Reverse(order)
		}
		for _, tool := range order {
			reg := startRegistry(t)
			start := time.Now()
			if err := tools[tool](reg); err != nil {
				t.Fatalf("round %d, %s: %v", round, tool, err)
			}
			d := time.Since(start)
			if err := sameDigests(reg); err != nil {
				t.Fatalf("round %d, %s: %v", round, tool, err)
			}
			times[tool] = append(times[tool], d)
			t.Logf("round %d: %s copied %d images (%.0f MB) in %v: %.0f MB/s", round, tool, len(refs), float64(size)/1e6, d.Round(time.Millisecond), float64(size)/1e6/d.Seconds())
		}
	}
	median := func(ds []time.Duration) time.Duration {
		s := slices.Clone(ds)
		slices.Sort(s)
		return s[len(s)/2]
	}
	cozy, peer := median(times["cozy"]), median(times["skopeo"])
	fmt.Printf("images mirror: %d images, %.0f MB from an OCI layout into a registry on loopback, %d at once; median of %d rounds: cozy %v (%.0f MB/s), skopeo %v (%.0f MB/s)\n",
		len(refs), float64(size)/1e6, DefaultJobs, rounds, cozy.Round(time.Millisecond), float64(size)/1e6/cozy.Seconds(), peer.Round(time.Millisecond), float64(size)/1e6/peer.Seconds())
	verdict.AtLeast("images mirror throughput, cozy / skopeo copy", peer.Seconds()/cozy.Seconds(), 1.0, "%.2f")
}

// artifactSize is the bytes of an image's (or every image of an
// index's) manifests, config and layers.
func artifactSize(t *testing.T, art *Artifact) int64 {
	t.Helper()
	image := func(img v1.Image) int64 {
		raw, err := img.RawManifest()
		if err != nil {
			t.Fatal(err)
		}
		m, err := img.Manifest()
		if err != nil {
			t.Fatal(err)
		}
		n := int64(len(raw)) + m.Config.Size
		for _, l := range m.Layers {
			n += l.Size
		}
		return n
	}
	if art.Index == nil {
		return image(art.Image)
	}
	raw, err := art.Index.RawManifest()
	if err != nil {
		t.Fatal(err)
	}
	im, err := art.Index.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	n := int64(len(raw))
	for _, d := range im.Manifests {
		img, err := art.Index.Image(d.Digest)
		if err != nil {
			t.Fatal(err)
		}
		n += image(img)
	}
	return n
}
