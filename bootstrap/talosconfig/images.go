package talosconfig

import (
	"fmt"

	"github.com/siderolabs/talos/pkg/machinery/config"
	"github.com/siderolabs/talos/pkg/machinery/constants"
)

// SandboxImage is the pause image containerd runs every pod's sandbox
// from: containerd's default, which Talos keeps (Talos's pkg/images
// DefaultSandboxImage, checked by its integration tests).
const SandboxImage = "registry.k8s.io/pause:3.10.1"

// Image is one image a node pulls, and the part of Talos that runs it.
type Image struct {
	Ref       string
	Component string
}

// Images are the images a node with this config pulls, read from the
// config as Talos's own pkg/images List reads them, keeping only what
// Talos starts for the config: the kubelet, the pod sandbox and the
// installer on every node; on control planes also etcd, the control-plane
// static pods and the bootstrap manifests Talos applies (CoreDNS and
// kube-proxy unless disabled, Flannel only as the CNI, with
// kube-network-policies when Flannel enforces network policies).
func Images(cfg config.Config) []Image {
	m := cfg.Machine()
	out := []Image{
		{m.Kubelet().Image(), "kubelet"},
		{SandboxImage, "pause (pod sandbox)"},
	}
	if img := m.Install().Image(); img != "" {
		out = append(out, Image{img, "installer"})
	}
	if !m.Type().IsControlPlane() {
		return out
	}
	c := cfg.Cluster()
	out = append(out,
		Image{c.Etcd().Image(), "etcd"},
		Image{c.APIServer().Image(), "kube-apiserver"},
		Image{c.ControllerManager().Image(), "kube-controller-manager"},
		Image{c.Scheduler().Image(), "kube-scheduler"},
	)
	if c.CoreDNS().Enabled() {
		out = append(out, Image{c.CoreDNS().Image(), "coredns"})
	}
	if c.Proxy().Enabled() {
		out = append(out, Image{c.Proxy().Image(), "kube-proxy"})
	}
	if cni := c.Network().CNI(); cni.Name() == constants.FlannelCNI {
		out = append(out, Image{fmt.Sprintf("ghcr.io/siderolabs/flannel:%s", constants.FlannelVersion), "flannel"})
		if cni.Flannel().KubeNetworkPoliciesEnabled() {
			out = append(out, Image{fmt.Sprintf("registry.k8s.io/networking/kube-network-policies:%s", constants.KubeNetworkPoliciesVersion), "kube-network-policies"})
		}
	}
	return out
}
