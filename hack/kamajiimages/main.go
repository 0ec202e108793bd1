// Command kamajiimages packs Kamaji's image, the images of the tenant
// control planes it runs (kube-apiserver, kube-controller-manager and
// kube-scheduler of the Kubernetes version Kamaji supports, Konnectivity's
// server and agent) and those of the Cluster API managers that drive it
// (core, kubeadm bootstrap, the Kamaji control-plane provider, CAPK) into one
// OCI image layout, each under
// its exact upstream name and tag, for the registry mirror the
// management cluster pulls from. hack/kamaji.sh builds the binaries,
// fetches Debian's ca-certificates and runs it.
package main

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"cozy.dev/cozy/internal/ociimage"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "kamajiimages:", err)
		os.Exit(1)
	}
}

type inputs struct {
	out, debs         string
	kamaji, kamajiTag string
	kubeDir, kubeTag  string
	// extra are more control-plane versions: VERSION=DIR each.
	extra             controlPlanes
	capiDir, capiTag  string
	provider, provTag string
	konnDir, konnTag  string
	capk, capkTag     string
}

// controlPlane are the binaries of a tenant control plane, each in its
// own image, as Kamaji's Deployment names them (registry.k8s.io/NAME).
var controlPlane = []string{"kube-apiserver", "kube-controller-manager", "kube-scheduler"}

func run() error {
	var in inputs
	flag.StringVar(&in.out, "o", "", "OCI image layout directory to write (must not exist)")
	flag.StringVar(&in.debs, "debs", "", "tree where Debian's ca-certificates was extracted (dpkg-deb -x)")
	flag.StringVar(&in.kamaji, "kamaji", "", "static Kamaji binary")
	flag.StringVar(&in.kamajiTag, "kamaji-tag", "", "Kamaji's version (v1.0.0)")
	flag.StringVar(&in.kubeDir, "kubernetes", "", "directory of static "+fmt.Sprint(controlPlane)+" binaries")
	flag.StringVar(&in.kubeTag, "kubernetes-version", "", "their version (v1.30.2)")
	flag.Var(&in.extra, "more-kubernetes", "VERSION=DIR: the control-plane images of another version too (repeatable)")
	flag.StringVar(&in.capiDir, "capi", "", "directory of hack/capi-controllers.sh's cluster-api-manager and kubeadm-bootstrap-manager")
	flag.StringVar(&in.capiTag, "capi-version", "", "their version (v1.14.2)")
	flag.StringVar(&in.provider, "provider", "", "static Kamaji control-plane provider binary")
	flag.StringVar(&in.provTag, "provider-tag", "", "its version (v0.20.0)")
	flag.StringVar(&in.konnDir, "konnectivity", "", "directory of static proxy-server and proxy-agent binaries")
	flag.StringVar(&in.konnTag, "konnectivity-version", "", "their version (v0.34.0)")
	flag.StringVar(&in.capk, "capk", "", "static Cluster API KubeVirt provider (CAPK) binary")
	flag.StringVar(&in.capkTag, "capk-version", "", "its version (v0.11.2)")
	flag.Parse()
	for name, v := range map[string]string{"-o": in.out, "-debs": in.debs, "-kamaji": in.kamaji, "-kamaji-tag": in.kamajiTag,
		"-kubernetes": in.kubeDir, "-kubernetes-version": in.kubeTag, "-capi": in.capiDir, "-capi-version": in.capiTag,
		"-provider": in.provider, "-provider-tag": in.provTag, "-konnectivity": in.konnDir, "-konnectivity-version": in.konnTag,
		"-capk": in.capk, "-capk-version": in.capkTag} {
		if v == "" {
			flag.Usage()
			return fmt.Errorf("%s is required", name)
		}
	}
	if flag.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", flag.Args())
	}
	images, err := kamajiImages(in)
	if err != nil {
		return err
	}
	return ociimage.WriteNewLayout(in.out, os.Stderr, images...)
}

// controlPlanes is the repeatable -more-kubernetes flag: a version and
// the directory of its binaries each.
type controlPlanes []struct{ version, dir string }

func (c *controlPlanes) String() string { return fmt.Sprint(*c) }

func (c *controlPlanes) Set(v string) error {
	version, dir, ok := strings.Cut(v, "=")
	if !ok || !strings.HasPrefix(version, "v") || dir == "" {
		return fmt.Errorf("%q: want VERSION=DIR", v)
	}
	*c = append(*c, struct{ version, dir string }{version, dir})
	return nil
}

func kamajiImages(in inputs) ([]ociimage.Image, error) {
	base, err := ociimage.StaticBase(in.debs)
	if err != nil {
		return nil, err
	}
	image := func(ref, version, source string, config ocispec.ImageConfig, files ...ociimage.File) (ociimage.Image, error) {
		for _, f := range files {
			if _, err := os.Stat(f.Source); err != nil {
				return ociimage.Image{}, err
			}
		}
		config.Env = append(config.Env, ociimage.EnvPath)
		config.Labels = map[string]string{
			"org.opencontainers.image.version":     version,
			"org.opencontainers.image.source":      source,
			"org.opencontainers.image.description": "built from source by cozy hack/kamaji.sh",
		}
		// Dated at the epoch: the same inputs give the same digests.
		return ociimage.Image{Ref: ref, Arch: "amd64", Created: time.Unix(0, 0), Config: config,
			Layers: []ociimage.Layer{base, {CreatedBy: source + " (CGO_ENABLED=0)", Files: files}}}, nil
	}
	// Kamaji's Dockerfile: distroless static, /kamaji as the entrypoint,
	// USER 65532:65532.
	kamaji, err := image("docker.io/clastix/kamaji:"+in.kamajiTag, in.kamajiTag, "github.com/clastix/kamaji@"+in.kamajiTag,
		ocispec.ImageConfig{User: "65532:65532", WorkingDir: "/", Entrypoint: []string{"/kamaji"}},
		ociimage.File{Path: "/kamaji", Mode: 0o755, Source: in.kamaji})
	if err != nil {
		return nil, err
	}
	images := []ociimage.Image{kamaji}
	// Kubernetes' server images: the binary in /usr/local/bin; Kamaji
	// gives each container its command by name, found through PATH.
	for _, cp := range append(controlPlanes{{in.kubeTag, in.kubeDir}}, in.extra...) {
		for _, name := range controlPlane {
			im, err := image("registry.k8s.io/"+name+":"+cp.version, cp.version, "k8s.io/kubernetes@"+cp.version+" cmd/"+name,
				ocispec.ImageConfig{Entrypoint: []string{"/usr/local/bin/" + name}},
				ociimage.File{Path: "/usr/local/bin/" + name, Mode: 0o755, Source: filepath.Join(cp.dir, name)})
			if err != nil {
				return nil, err
			}
			images = append(images, im)
		}
	}
	// Cluster API's Dockerfile, the Kamaji provider's and CAPK's:
	// distroless static, /manager as the entrypoint, USER 65532; named as
	// their releases publish them.
	for _, m := range []struct{ ref, version, source, bin string }{
		{"registry.k8s.io/cluster-api/cluster-api-controller:" + in.capiTag, in.capiTag, "sigs.k8s.io/cluster-api@" + in.capiTag + " core", filepath.Join(in.capiDir, "cluster-api-manager")},
		{"registry.k8s.io/cluster-api/kubeadm-bootstrap-controller:" + in.capiTag, in.capiTag, "sigs.k8s.io/cluster-api@" + in.capiTag + " bootstrap/kubeadm", filepath.Join(in.capiDir, "kubeadm-bootstrap-manager")},
		{"docker.io/clastix/cluster-api-control-plane-provider-kamaji:" + in.provTag, in.provTag, "github.com/clastix/cluster-api-control-plane-provider-kamaji@" + in.provTag + " (ported to Kamaji " + in.kamajiTag + ")", in.provider},
		{"quay.io/capk/capk-manager:" + in.capkTag, in.capkTag, "sigs.k8s.io/cluster-api-provider-kubevirt@" + in.capkTag, in.capk},
	} {
		im, err := image(m.ref, m.version, m.source, ocispec.ImageConfig{User: "65532:65532", WorkingDir: "/", Entrypoint: []string{"/manager"}},
			ociimage.File{Path: "/manager", Mode: 0o755, Source: m.bin})
		if err != nil {
			return nil, err
		}
		images = append(images, im)
	}
	// Konnectivity's Dockerfiles: distroless static nonroot, the binary
	// at / as the entrypoint (Kamaji names it as the command too).
	for _, bin := range []string{"proxy-server", "proxy-agent"} {
		im, err := image("registry.k8s.io/kas-network-proxy/"+bin+":"+in.konnTag, in.konnTag,
			"sigs.k8s.io/apiserver-network-proxy@"+in.konnTag+" cmd/"+strings.TrimPrefix(bin, "proxy-"),
			ocispec.ImageConfig{User: "65532:65532", WorkingDir: "/", Entrypoint: []string{"/" + bin}},
			ociimage.File{Path: "/" + bin, Mode: 0o755, Source: filepath.Join(in.konnDir, bin)})
		if err != nil {
			return nil, err
		}
		images = append(images, im)
	}
	return images, nil
}
