package talosnode

import (
	"context"
	"crypto/tls"
	"net/http"
	"time"

	"github.com/cosi-project/runtime/pkg/state"
	"github.com/siderolabs/talos/pkg/machinery/config/config"
	"github.com/siderolabs/talos/pkg/machinery/resources/k8s"
)

// Talos publishes, for each static pod its kubelet runs, a StaticPodStatus
// resource (ID kube-system/<pod>-<node>) with the pod's status. The
// emulated node runs the control plane's components as processes, and
// publishes for each the status a static pod of it would have: the
// image of the version that runs (the binary's own, kubeversions.go) and
// Ready when the component answers its health check, as the kubelet's
// probe of Talos's static pod asks it.

// statusInterval is how often the statuses are refreshed.
const statusInterval = 2 * time.Second

// healthURL is where each component answers its health check, on
// this node: kube-apiserver on the node's address, the others on
// localhost, where Talos binds them.
func healthURL(c Config, mc config.Config, name string) string {
	switch name {
	case "kube-apiserver":
		return "https://" + c.hostPort(apiServerPort(mc)) + "/readyz"
	case "kube-controller-manager":
		return "https://127.0.0.1:10257/healthz"
	case "kube-scheduler":
		return "https://127.0.0.1:10259/healthz"
	}
	return ""
}

// reportStaticPods keeps the StaticPodStatus resources of this control
// plane's components current until ctx ends.
func (n *Node) reportStaticPods(ctx context.Context, st state.State, hostname string) {
	// As the kubelet's HTTPS probes: the serving certificate is not
	// checked, and the health paths need no credentials.
	hc := &http.Client{Timeout: statusInterval, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{InsecureSkipVerify: true}, //nolint:gosec // a probe, as the kubelet's
	}}
	defer hc.CloseIdleConnections()
	published := map[string]bool{}
	for {
		n.mu.Lock()
		cp, mc := n.cp, n.machine
		n.mu.Unlock()
		if cp != nil && mc != nil {
			for name, p := range cp.programs {
				bin, _ := p.get()
				cp.imagesMu.Lock()
				image := imageWithTag(cp.images[name], binaryVersion(bin))
				cp.imagesMu.Unlock()
				ready := probe(ctx, hc, healthURL(n.cfg, mc, name))
				id := "kube-system/" + name + "-" + hostname
				if err := put(ctx, st, staticPodStatus(id, name, image, ready)); err != nil && ctx.Err() == nil {
					n.log.Warn("static pod status", "id", id, "err", err)
				}
				published[id] = true
			}
		} else {
			// etcd left or the control plane stopped: no static pods.
			for id := range published {
				_ = st.Destroy(ctx, k8s.NewStaticPodStatus(k8s.NamespaceName, id).Metadata())
				delete(published, id)
			}
		}
		if !sleep(ctx, statusInterval) {
			return
		}
	}
}

func probe(ctx context.Context, hc *http.Client, url string) bool {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return false
	}
	resp, err := hc.Do(req)
	if err != nil {
		return false
	}
	defer resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// staticPodStatus is the status of a static pod with one container, in
// the shape of a Kubernetes PodStatus, as Talos's resource holds it.
func staticPodStatus(id, container, image string, ready bool) *k8s.StaticPodStatus {
	r := k8s.NewStaticPodStatus(k8s.NamespaceName, id)
	cond := "False"
	if ready {
		cond = "True"
	}
	r.TypedSpec().PodStatus = map[string]any{
		"phase": "Running",
		"conditions": []any{
			map[string]any{"type": "Ready", "status": cond},
			map[string]any{"type": "ContainersReady", "status": cond},
		},
		"containerStatuses": []any{map[string]any{
			"name":  container,
			"image": image,
			"ready": ready,
		}},
	}
	return r
}
