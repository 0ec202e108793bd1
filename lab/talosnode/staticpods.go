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
			for name := range cp.programs {
				id, err := cp.publishStaticPod(ctx, st, name, hostname, func() bool { return probe(ctx, hc, healthURL(n.cfg, mc, name)) })
				if err != nil && ctx.Err() == nil {
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

// publishStaticPod writes the status of a component's static pod: the
// image of the process that runs (the binary's own version), as the
// kubelet reports the container that runs, and Ready only once that
// process runs the latest config and probe says so (probe nil: not
// Ready), as the kubelet's status is of the pod of the new spec. After a
// new config the old process shuts down, still answering its probe for
// a while, then the new one starts: pairing the new config with the old
// process's Ready would let an upgrade move on to the next control
// plane while this one's API server restarts.
func (cp *controlPlane) publishStaticPod(ctx context.Context, st state.State, name, hostname string, probe func() bool) (string, error) {
	id := "kube-system/" + name + "-" + hostname
	p := cp.programs[name]
	gen := p.generation()
	ready := probe != nil && probe()
	// Checked again under the lock, after the probe: a config applied
	// meanwhile (reconfigure, then staticPodsRestarting) wins.
	cp.statusMu.Lock()
	defer cp.statusMu.Unlock()
	bin, latest := p.current()
	latest = latest && p.generation() == gen
	if bin == "" {
		bin, _ = p.get()
	}
	cp.imagesMu.Lock()
	image := imageWithTag(cp.images[name], binaryVersion(bin))
	cp.imagesMu.Unlock()
	return id, put(ctx, st, staticPodStatus(id, name, image, ready && latest))
}

// staticPodsRestarting marks each component that a config applied
// without a reboot restarts as not Ready at once, before the apply is
// answered: a client that reads the status after its apply never sees
// the old process's Ready.
func (cp *controlPlane) staticPodsRestarting(ctx context.Context, st state.State, hostname string) error {
	for name, p := range cp.programs {
		if _, latest := p.current(); latest {
			continue
		}
		if _, err := cp.publishStaticPod(ctx, st, name, hostname, nil); err != nil {
			return err
		}
	}
	return nil
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
