package talosnode

import (
	"context"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/siderolabs/talos/pkg/machinery/api/machine"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"cozy.dev/cozy/internal/imageref"
)

// Talos runs each Kubernetes component from the image its machine config
// names (cluster.apiServer.image, machine.kubelet.image, ...), so the
// image's tag is the version that runs. The emulated node runs binaries
// instead: for each component it takes the binary whose own version
// (`--version`) is the image's tag, from the directories of
// Config.KubernetesAssets, then the default binary (Config.Bin). When none
// has that version it runs the default binary, which reports its own
// version: a rack may name a Kubernetes version the node has no build of
// (Talos's default, 1.36.0, beside a 1.36.3 build), and the node still
// runs. What it runs is what its StaticPodStatus resources and the
// components' own /version say.

// kubeComponents are the programs a Kubernetes version is made of, by the
// name of their binaries.
var kubeComponents = []string{"kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubelet"}

// binVersions caches each binary's version by path; "" for a binary that
// does not run.
var binVersions sync.Map

// binaryVersion is the version a Kubernetes binary reports, "v1.36.3";
// "" if it does not run.
func binaryVersion(path string) string {
	if v, ok := binVersions.Load(path); ok {
		return v.(string)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, path, "--version").Output()
	v := ""
	if err == nil {
		// "Kubernetes v1.36.3"
		if f := strings.Fields(string(out)); len(f) == 2 && f[0] == "Kubernetes" {
			v = f[1]
		}
	}
	if err == nil || ctx.Err() == nil {
		binVersions.Store(path, v) // a binary that timed out is asked again
	}
	return v
}

// defaultBinary is the binary of a component Config.Bin names.
func (c Config) defaultBinary(component string) string {
	switch component {
	case "kube-apiserver":
		return c.Bin.APIServer
	case "kube-controller-manager":
		return c.Bin.ControllerManager
	case "kube-scheduler":
		return c.Bin.Scheduler
	case "kubelet":
		return c.Bin.Kubelet
	}
	panic("not a Kubernetes component: " + component)
}

// candidates are the binaries of a component the node has, in the order
// they are preferred.
func (c Config) candidates(component string) []string {
	var out []string
	for _, dir := range c.KubernetesAssets {
		out = append(out, filepath.Join(dir, component))
	}
	if p, err := exec.LookPath(c.defaultBinary(component)); err == nil {
		out = append(out, p)
	} else {
		out = append(out, c.defaultBinary(component))
	}
	return out
}

// kubeBinary is the binary that runs the component for the image the
// config names: one of the image tag's version, else the default.
func (c Config) kubeBinary(component, image string) string {
	if b, ok := c.binaryOf(component, image); ok {
		return b
	}
	return c.defaultBinary(component)
}

// binaryOf finds a binary of the component whose version is the image's
// tag.
func (c Config) binaryOf(component, image string) (string, bool) {
	ref, err := imageref.Parse(image)
	if err != nil || ref.Tag == "" {
		return "", false
	}
	for _, b := range c.candidates(component) {
		if binaryVersion(b) == ref.Tag {
			return b, true
		}
	}
	return "", false
}

// versionsOf lists the versions the node has of a component, for messages.
func (c Config) versionsOf(component string) []string {
	var out []string
	for _, b := range c.candidates(component) {
		if v := binaryVersion(b); v != "" {
			out = append(out, v)
		}
	}
	return out
}

// componentOfImage names the component an image of Talos's is for: its
// repository's last element (registry.k8s.io/kube-apiserver,
// ghcr.io/siderolabs/kubelet).
func componentOfImage(image string) (string, bool) {
	ref, err := imageref.Parse(image)
	if err != nil {
		return "", false
	}
	name := ref.Repository[strings.LastIndex(ref.Repository, "/")+1:]
	for _, c := range kubeComponents {
		if name == c {
			return c, true
		}
	}
	return "", false
}

// ImagePull is Talos's image pre-pull (talosctl upgrade-k8s calls it
// before it changes anything). The emulated node runs binaries, not
// images, so pulling a Kubernetes component's image means having a
// binary of its version: NotFound, with the versions it has, otherwise.
// Other images: Unimplemented, which Talos's upgrade-k8s skips.
func (s *configuredServer) ImagePull(_ context.Context, req *machine.ImagePullRequest) (*machine.ImagePullResponse, error) {
	image := req.GetReference()
	component, ok := componentOfImage(image)
	if !ok {
		return nil, status.Errorf(codes.Unimplemented, "the emulated node pulls only the images of the Kubernetes components (%s), not %q", strings.Join(kubeComponents, ", "), image)
	}
	if _, ok := s.node.cfg.binaryOf(component, image); !ok {
		return nil, status.Errorf(codes.NotFound, "failed to pull image %q: the emulated node has no %s of that version (it has %s)", image, component, strings.Join(s.node.cfg.versionsOf(component), ", "))
	}
	return &machine.ImagePullResponse{Messages: []*machine.ImagePull{{}}}, nil
}

// imageWithTag is image with its tag replaced: what a component's status
// reports it runs.
func imageWithTag(image, tag string) string {
	ref, err := imageref.Parse(image)
	if err != nil || tag == "" {
		return image
	}
	return ref.Name() + ":" + tag
}
