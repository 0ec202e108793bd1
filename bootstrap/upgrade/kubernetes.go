package upgrade

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"

	"github.com/cosi-project/runtime/pkg/resource"
	"github.com/cosi-project/runtime/pkg/state"
	"github.com/siderolabs/talos/pkg/machinery/api/common"
	"github.com/siderolabs/talos/pkg/machinery/api/machine"
	"github.com/siderolabs/talos/pkg/machinery/client"
	"github.com/siderolabs/talos/pkg/machinery/compatibility"
	coreconfig "github.com/siderolabs/talos/pkg/machinery/config"
	"github.com/siderolabs/talos/pkg/machinery/resources/k8s"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"cozy.dev/cozy/bootstrap/rack"
	"cozy.dev/cozy/bootstrap/rackapi"
	"cozy.dev/cozy/internal/imageref"
	"cozy.dev/cozy/internal/wait"
)

// The components `cozyctl upgrade kubernetes` moves, in the order Talos's
// `talosctl upgrade-k8s` does: each control-plane component on every
// control plane in turn, then kube-proxy, then every kubelet.
const (
	APIServer         = "kube-apiserver"
	ControllerManager = "kube-controller-manager"
	Scheduler         = "kube-scheduler"
	KubeProxy         = "kube-proxy"
	Kubelet           = "kubelet"
)

// staticPods are the control plane's components, run as static pods.
var staticPods = []string{APIServer, ControllerManager, Scheduler}

// KubernetesOptions of one Kubernetes upgrade.
type KubernetesOptions struct {
	Rack *rackapi.Rack
	// Version, if set, must be the rack's cluster.kubernetesVersion.
	Version string
	DryRun  bool
	// Timeout bounds the wait for each component (default 10m).
	Timeout time.Duration
	Log     *slog.Logger
}

// ComponentStep is one component on one node.
type ComponentStep struct {
	Node      string `json:"node"`
	Component string `json:"component"`
	From      string `json:"from,omitempty"`
	To        string `json:"to"`
	// Result is "upgraded", "already on the version" or, in a dry run,
	// "to upgrade".
	Result string        `json:"result"`
	Took   time.Duration `json:"took,omitempty"`
}

// KubernetesResult is a whole Kubernetes upgrade.
type KubernetesResult struct {
	Version string          `json:"version"`
	DryRun  bool            `json:"dryRun,omitempty"`
	Steps   []ComponentStep `json:"steps"`
	Took    time.Duration   `json:"took"`
}

// nodeConfig is what a node's config says of Kubernetes.
type nodeConfig struct {
	name         string
	controlPlane bool
	images       map[string]string // by component; kube-proxy only when enabled
}

// Kubernetes moves every node to the rack's cluster.kubernetesVersion as
// `talosctl upgrade-k8s` does: every node's config is read and every
// image pre-pulled before anything changes (a downgrade, a skipped minor,
// a version a node's Talos does not run, or an image a node cannot pull
// stops it there); then each control-plane component on each control
// plane in turn (its image patched into the node's config, applied
// without a reboot, and waited for until the node's static pod runs the
// new version and is Ready), kube-proxy, and each kubelet (until its
// Node reports the version and is Ready).
//
// Like the Talos upgrade it keeps no state: each node's config says what
// is left, and a component whose config is on the version is only waited
// for, so a second run after a kill goes on without patching anything
// twice.
func Kubernetes(ctx context.Context, o KubernetesOptions) (KubernetesResult, error) {
	start := time.Now()
	if o.Timeout == 0 {
		o.Timeout = 10 * time.Minute
	}
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	r := o.Rack.Rack
	target := "v" + strings.TrimPrefix(r.Cluster.KubernetesVersion, "v")
	if o.Version != "" && "v"+strings.TrimPrefix(o.Version, "v") != target {
		return KubernetesResult{}, fmt.Errorf("--version %s: the rack file says cluster.kubernetesVersion %s; set it to %s there first (the rack is what the rack runs, and what new machines get)",
			o.Version, target, o.Version)
	}
	res := KubernetesResult{Version: target, DryRun: o.DryRun}
	nodes, err := readConfigs(ctx, o, target)
	if err != nil {
		return res, err
	}
	res.Steps = plan(r, vipHolder(ctx, o.Rack, o.Log), nodes, target)
	if o.DryRun {
		return res, nil
	}
	if err := prePull(ctx, o, nodes, target); err != nil {
		return res, err
	}
	for i := range res.Steps {
		s := &res.Steps[i]
		t := time.Now()
		how, err := upgradeComponent(ctx, o, s, nodes)
		s.Took = time.Since(t).Round(100 * time.Millisecond)
		if err != nil {
			s.Result = "failed"
			return res, fmt.Errorf("%s on %s: %w (the steps before it are done; run again to go on)", s.Component, s.Node, err)
		}
		s.Result = how
	}
	res.Took = time.Since(start).Round(100 * time.Millisecond)
	return res, nil
}

// readConfigs reads every node's config and checks the step each of its
// components would take.
func readConfigs(ctx context.Context, o KubernetesOptions, target string) (map[string]nodeConfig, error) {
	want, err := compatibility.ParseKubernetesVersion(strings.TrimPrefix(target, "v"))
	if err != nil {
		return nil, fmt.Errorf("%q is not a Kubernetes version: %w", target, err)
	}
	nodes := map[string]nodeConfig{}
	for _, name := range order(o.Rack.Rack, "") {
		var (
			mc coreconfig.Provider
			ms rackapi.MachineState
		)
		err := wait.For(ctx, min(o.Timeout, answerWait), name+" answering", func() error {
			var err error
			if ms, err = o.Rack.MachineState(ctx, name); err != nil {
				return err
			}
			mc, err = o.Rack.MachineConfig(ctx, name)
			return err
		})
		if err != nil {
			return nil, fmt.Errorf("%s does not answer (%w): every node must, before an upgrade starts", name, err)
		}
		talos, err := compatibility.ParseTalosVersion(&machine.VersionInfo{Tag: ms.Version})
		if err != nil {
			return nil, fmt.Errorf("%s: Talos version %q: %w", name, ms.Version, err)
		}
		if err := want.SupportedWith(talos); err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
		nc := nodeConfig{name: name, controlPlane: mc.Machine().Type().IsControlPlane(), images: imagesOf(mc)}
		for comp, image := range nc.images {
			if err := checkStep("Kubernetes", tagOf(image), target); err != nil {
				return nil, fmt.Errorf("%s: %s (%s): %w", name, comp, image, err)
			}
		}
		nodes[name] = nc
	}
	return nodes, nil
}

// imagesOf is the image of each Kubernetes component a node's config
// runs: the kubelet, and on a control plane the control plane's
// components and kube-proxy (when enabled).
func imagesOf(mc coreconfig.Provider) map[string]string {
	images := map[string]string{Kubelet: mc.Machine().Kubelet().Image()}
	if mc.Machine().Type().IsControlPlane() {
		cl := mc.Cluster()
		images[APIServer] = cl.APIServer().Image()
		images[ControllerManager] = cl.ControllerManager().Image()
		images[Scheduler] = cl.Scheduler().Image()
		if p := cl.Proxy(); p != nil && p.Enabled() {
			images[KubeProxy] = p.Image()
		}
	}
	return images
}

// plan is the steps in Talos's order: each control-plane component on
// every control plane, kube-proxy on every control plane, then the
// kubelets (control planes first). Control planes go in rack order but
// for the VIP's holder, last: its kube-apiserver's restart moves the VIP.
func plan(r *rack.Rack, holder string, nodes map[string]nodeConfig, target string) []ComponentStep {
	var cps, all []nodeConfig
	for _, name := range order(r, holder) {
		n := nodes[name]
		all = append(all, n)
		if n.controlPlane {
			cps = append(cps, n)
		}
	}
	var steps []ComponentStep
	add := func(n nodeConfig, comp string) {
		image, ok := n.images[comp]
		if !ok {
			return
		}
		s := ComponentStep{Node: n.name, Component: comp, From: tagOf(image), To: target, Result: "to upgrade"}
		if s.From == target {
			s.Result = "already on the version"
		}
		steps = append(steps, s)
	}
	for _, comp := range slices.Concat(staticPods, []string{KubeProxy}) {
		for _, n := range cps {
			add(n, comp)
		}
	}
	for _, n := range all {
		add(n, Kubelet)
	}
	return steps
}

// tagOf is an image's tag; "" if it has none.
func tagOf(image string) string {
	ref, err := imageref.Parse(image)
	if err != nil {
		return ""
	}
	return ref.Tag
}

// withTag is image with its tag replaced.
func withTag(image, tag string) string {
	ref, err := imageref.Parse(image)
	if err != nil {
		return image
	}
	return ref.Name() + ":" + tag
}

// prePull has every node pull the images it is to run, as talosctl
// upgrade-k8s does before it changes anything: a version no node can get
// stops the upgrade before it starts. A node that does not implement the
// pull (Unimplemented) is skipped, as Talos's tool skips it.
func prePull(ctx context.Context, o KubernetesOptions, nodes map[string]nodeConfig, target string) error {
	for _, name := range order(o.Rack.Rack, "") {
		n := nodes[name]
		for _, comp := range slices.Concat(staticPods, []string{Kubelet}) {
			image, ok := n.images[comp]
			if !ok || tagOf(image) == target {
				continue
			}
			ref := withTag(image, target)
			ns := common.ContainerdNamespace_NS_CRI
			if comp == Kubelet {
				ns = common.ContainerdNamespace_NS_SYSTEM
			}
			err := pull(ctx, o.Rack, name, ns, ref)
			if status.Code(err) == codes.Unimplemented {
				o.Log.Info("the node does not pre-pull; skipped", "node", name, "image", ref)
				continue
			}
			if err != nil {
				return fmt.Errorf("%s cannot pull %s (nothing was changed): %w", name, ref, err)
			}
			o.Log.Info("pre-pulled", "node", name, "image", ref)
		}
	}
	return nil
}

func pull(ctx context.Context, r *rackapi.Rack, name string, ns common.ContainerdNamespace, ref string) error {
	return r.Call(ctx, name, 10*time.Minute, func(ctx context.Context, c *client.Client) error {
		//lint:ignore SA1019 Talos's upgrade-k8s calls the same (ImageService in Talos 1.13 is its successor); the emulated node serves this one
		return c.ImagePull(ctx, ns, ref)
	})
}

// upgradeComponent patches the component's image into the node's config
// unless it is there already, then waits for it to run.
func upgradeComponent(ctx context.Context, o KubernetesOptions, s *ComponentStep, nodes map[string]nodeConfig) (string, error) {
	how := "already on the version"
	if s.Result == "to upgrade" {
		image := withTag(nodes[s.Node].images[s.Component], s.To)
		o.Log.Info("upgrading", "node", s.Node, "component", s.Component, "from", s.From, "to", s.To)
		changed, err := o.Rack.PatchConfig(ctx, s.Node, imagePatch(s.Component, image))
		if err != nil {
			return "", err
		}
		if changed {
			how = "upgraded"
		}
	}
	var err error
	switch s.Component {
	case KubeProxy:
		err = upgradeKubeProxy(ctx, o, withTag(nodes[s.Node].images[KubeProxy], s.To))
	case Kubelet:
		err = waitKubelet(ctx, o, s.Node, s.To)
	default:
		var runs bool
		runs, err = waitStaticPod(ctx, o, s.Node, s.Component, s.To)
		if err == nil && !runs {
			how = "config only: it does not run on the node"
		}
	}
	if err != nil {
		return "", err
	}
	o.Log.Info("done", "node", s.Node, "component", s.Component, "version", s.To, "result", how)
	return how, nil
}

// imagePatch is the config patch that sets a component's image.
func imagePatch(component, image string) string {
	switch component {
	case Kubelet:
		return fmt.Sprintf("machine:\n  kubelet:\n    image: %s\n", image)
	case APIServer:
		return fmt.Sprintf("cluster:\n  apiServer:\n    image: %s\n", image)
	case ControllerManager:
		return fmt.Sprintf("cluster:\n  controllerManager:\n    image: %s\n", image)
	case Scheduler:
		return fmt.Sprintf("cluster:\n  scheduler:\n    image: %s\n", image)
	case KubeProxy:
		return fmt.Sprintf("cluster:\n  proxy:\n    image: %s\n", image)
	}
	panic("no patch for " + component)
}

// waitStaticPod waits until the node's static pod of the component runs
// the version and is Ready, by Talos's StaticPodStatus resource. A node
// whose kube-apiserver runs and that has no pod of the component does not
// run it (the config disables it, or the emulated node runs without its
// node services): false, and nothing to wait for.
func waitStaticPod(ctx context.Context, o KubernetesOptions, node, component, version string) (bool, error) {
	runs := true
	err := wait.For(ctx, o.Timeout, component+" on "+version+" and Ready", func() error {
		image, ready, err := staticPod(ctx, o.Rack, node, component)
		switch {
		case notFound(err) && component != APIServer:
			if _, _, aerr := staticPod(ctx, o.Rack, node, APIServer); aerr != nil {
				return fmt.Errorf("%w (and %w)", err, aerr)
			}
			runs = false
			return nil
		case err != nil:
			return err
		case tagOf(image) != version:
			return fmt.Errorf("it runs %s", image)
		case !ready:
			return errors.New("it is not Ready")
		}
		return nil
	})
	return runs, err
}

func notFound(err error) bool {
	return err != nil && (state.IsNotFoundError(err) || status.Code(errors.Unwrap(err)) == codes.NotFound)
}

// staticPod reads a StaticPodStatus: the first container's image, and
// the pod's Ready condition.
func staticPod(ctx context.Context, r *rackapi.Rack, node, component string) (image string, ready bool, err error) {
	id := "kube-system/" + component + "-" + node
	var st map[string]any
	err = r.Call(ctx, node, 15*time.Second, func(ctx context.Context, c *client.Client) error {
		res, err := c.COSI.Get(ctx, resource.NewMetadata(k8s.NamespaceName, k8s.StaticPodStatusType, id, resource.VersionUndefined))
		if err != nil {
			return fmt.Errorf("static pod status %s: %w", id, err)
		}
		sp, ok := res.(*k8s.StaticPodStatus)
		if !ok {
			return fmt.Errorf("static pod status %s: the node sent a %T", id, res)
		}
		st = sp.TypedSpec().PodStatus
		return nil
	})
	if err != nil {
		return "", false, err
	}
	if cs, ok := st["containerStatuses"].([]any); ok && len(cs) > 0 {
		if c, ok := cs[0].(map[string]any); ok {
			image, _ = c["image"].(string)
		}
	}
	if conds, ok := st["conditions"].([]any); ok {
		for _, x := range conds {
			if c, ok := x.(map[string]any); ok && c["type"] == "Ready" {
				ready = c["status"] == "True"
			}
		}
	}
	return image, ready, nil
}

// upgradeKubeProxy sets the kube-proxy DaemonSet's image, as Talos's
// manifest sync does after the config names the new one, and waits for
// the rollout. A cluster without the DaemonSet (kube-proxy disabled, or
// no bootstrap manifests) has nothing to do.
func upgradeKubeProxy(ctx context.Context, o KubernetesOptions, image string) error {
	kc, err := o.Rack.Kube()
	if err != nil {
		return err
	}
	ds, err := kc.AppsV1().DaemonSets("kube-system").Get(ctx, KubeProxy, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		o.Log.Info("no kube-proxy DaemonSet: nothing to roll out")
		return nil
	}
	if err != nil {
		return err
	}
	if len(ds.Spec.Template.Spec.Containers) > 0 && ds.Spec.Template.Spec.Containers[0].Image != image {
		patch := fmt.Sprintf(`{"spec":{"template":{"spec":{"containers":[{"name":%q,"image":%q}]}}}}`, ds.Spec.Template.Spec.Containers[0].Name, image)
		if _, err := kc.AppsV1().DaemonSets("kube-system").Patch(ctx, KubeProxy, types.StrategicMergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
			return fmt.Errorf("kube-proxy DaemonSet: %w", err)
		}
	}
	return wait.For(ctx, o.Timeout, "kube-proxy rolled out", func() error {
		ds, err := kc.AppsV1().DaemonSets("kube-system").Get(ctx, KubeProxy, metav1.GetOptions{})
		if err != nil {
			return err
		}
		st := ds.Status
		if st.ObservedGeneration < ds.Generation || st.UpdatedNumberScheduled != st.DesiredNumberScheduled || st.NumberAvailable != st.DesiredNumberScheduled {
			return fmt.Errorf("%d of %d updated, %d available", st.UpdatedNumberScheduled, st.DesiredNumberScheduled, st.NumberAvailable)
		}
		return nil
	})
}

// waitKubelet waits until the node's Node reports the kubelet version and
// is Ready. A node whose kubelet never registered (the process tier runs
// none) has no Node: that is said, and there is nothing to wait for.
func waitKubelet(ctx context.Context, o KubernetesOptions, node, version string) error {
	kc, err := o.Rack.Kube()
	if err != nil {
		return err
	}
	return wait.For(ctx, o.Timeout, "kubelet "+version+" and its Node Ready", func() error {
		n, err := kc.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			o.Log.Info("no Node registered: the kubelet's version is not checked", "node", node)
			return nil
		}
		if err != nil {
			return err
		}
		if v := n.Status.NodeInfo.KubeletVersion; v != version {
			return fmt.Errorf("its Node reports kubelet %s", v)
		}
		for _, c := range n.Status.Conditions {
			if c.Type == corev1.NodeReady && c.Status == corev1.ConditionTrue {
				return nil
			}
		}
		return errors.New("its Node is not Ready")
	})
}
