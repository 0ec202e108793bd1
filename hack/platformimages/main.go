// Command platformimages packs the images of the platform components
// Cozy builds from source (Flux's source-, kustomize- and
// helm-controller; MetalLB's controller and speaker) into one OCI image
// layout, each under its exact upstream name and tag, for the lab's
// registry mirror. hack/platform-images.sh builds the binaries, fetches
// Debian's ca-certificates and runs it.
package main

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"cozy.dev/cozy/internal/ociimage"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "platformimages:", err)
		os.Exit(1)
	}
}

// inputs are the built binaries, the extracted packages and the tags the
// images are named after.
type inputs struct {
	out, debs         string
	fluxDir           string
	fluxTags          map[string]string // controller -> tag
	metallbController string
	metallbSpeaker    string
	metallbTag        string
	fluxTagsFlag      string
}

// fluxControllers are the Flux controllers the platform runs, each a
// binary of that name in -flux.
var fluxControllers = []string{"source-controller", "kustomize-controller", "helm-controller"}

func run() error {
	var in inputs
	flag.StringVar(&in.out, "o", "", "OCI image layout directory to write (must not exist)")
	flag.StringVar(&in.debs, "debs", "", "tree where Debian's ca-certificates was extracted (dpkg-deb -x)")
	flag.StringVar(&in.fluxDir, "flux", "", "directory of the Flux controllers' static binaries (hack/flux-controllers.sh)")
	flag.StringVar(&in.fluxTagsFlag, "flux-tags", "", "each controller's tag: source-controller=v1.9.6,kustomize-controller=v1.9.6,helm-controller=v1.6.4")
	flag.StringVar(&in.metallbController, "metallb-controller", "", "static MetalLB controller binary")
	flag.StringVar(&in.metallbSpeaker, "metallb-speaker", "", "static MetalLB speaker binary")
	flag.StringVar(&in.metallbTag, "metallb-tag", "", "MetalLB image tag (v0.15.2)")
	flag.Parse()
	for name, v := range map[string]string{
		"-o": in.out, "-debs": in.debs, "-flux": in.fluxDir, "-flux-tags": in.fluxTagsFlag,
		"-metallb-controller": in.metallbController, "-metallb-speaker": in.metallbSpeaker, "-metallb-tag": in.metallbTag,
	} {
		if v == "" {
			flag.Usage()
			return fmt.Errorf("%s is required", name)
		}
	}
	if flag.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", flag.Args())
	}
	tags, err := parseTags(in.fluxTagsFlag)
	if err != nil {
		return err
	}
	in.fluxTags = tags
	images, err := platformImages(in)
	if err != nil {
		return err
	}
	return ociimage.WriteNewLayout(in.out, os.Stderr, images...)
}

// parseTags reads NAME=TAG,... for every Flux controller, and nothing else.
func parseTags(s string) (map[string]string, error) {
	tags := map[string]string{}
	for kv := range strings.SplitSeq(s, ",") {
		name, tag, ok := strings.Cut(kv, "=")
		if !ok || tag == "" || !slices.Contains(fluxControllers, name) {
			return nil, fmt.Errorf("-flux-tags: %q is not CONTROLLER=TAG for one of %s", kv, strings.Join(fluxControllers, ", "))
		}
		tags[name] = tag
	}
	for _, c := range fluxControllers {
		if tags[c] == "" {
			return nil, fmt.Errorf("-flux-tags: no tag for %s", c)
		}
	}
	return tags, nil
}

func platformImages(in inputs) ([]ociimage.Image, error) {
	base, err := ociimage.StaticBase(in.debs)
	if err != nil {
		return nil, err
	}
	image := func(ref string, config ocispec.ImageConfig, layers ...ociimage.Layer) ociimage.Image {
		// Dated at the epoch: the same inputs give the same digests.
		config.Env = append(config.Env, ociimage.EnvPath)
		return ociimage.Image{Ref: ref, Arch: "amd64", Created: time.Unix(0, 0), Layers: layers, Config: config}
	}
	labels := func(version, source string) map[string]string {
		return map[string]string{
			"org.opencontainers.image.version":     version,
			"org.opencontainers.image.source":      source,
			"org.opencontainers.image.description": "built from source by cozy hack/platform-images.sh",
		}
	}
	var images []ociimage.Image
	// Flux's Dockerfiles: alpine with ca-certificates, the binary in
	// /usr/local/bin, USER 65534:65534, ENTRYPOINT the binary
	// (kustomize-controller's through tini, with git, openssh and gnupg
	// for SOPS's PGP keys and Git over SSH: not here, see docs/images.md).
	for _, c := range fluxControllers {
		bin := filepath.Join(in.fluxDir, c)
		if _, err := os.Stat(bin); err != nil {
			return nil, err
		}
		tag := in.fluxTags[c]
		images = append(images, image("ghcr.io/fluxcd/"+c+":"+tag,
			ocispec.ImageConfig{User: "65534:65534", Entrypoint: []string{c}, Labels: labels(tag, "github.com/fluxcd/"+c+"@"+tag)},
			base,
			ociimage.Layer{CreatedBy: c + " " + tag + " (CGO_ENABLED=0)", Files: []ociimage.File{
				{Path: "/usr/local/bin/" + c, Mode: 0o755, Source: bin},
			}}))
	}
	// MetalLB's Dockerfiles: distroless static, /controller or /speaker
	// as the entrypoint (the speaker's FRR-mode tools are left out: Cozy
	// runs it in native L2 mode).
	for _, c := range []struct{ name, bin string }{{"controller", in.metallbController}, {"speaker", in.metallbSpeaker}} {
		if _, err := os.Stat(c.bin); err != nil {
			return nil, err
		}
		images = append(images, image("quay.io/metallb/"+c.name+":"+in.metallbTag,
			ocispec.ImageConfig{Entrypoint: []string{"/" + c.name}, Labels: labels(in.metallbTag, "go.universe.tf/metallb@"+in.metallbTag+" "+c.name)},
			base,
			ociimage.Layer{CreatedBy: "metallb " + c.name + " " + in.metallbTag + " (CGO_ENABLED=0)", Files: []ociimage.File{
				{Path: "/" + c.name, Mode: 0o755, Source: c.bin},
			}}))
	}
	return images, nil
}
