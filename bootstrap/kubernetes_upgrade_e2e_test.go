//go:build integration && e2e

package bootstrap_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"cozy.dev/cozy/internal/testing/prereq"
)

// TestKubernetesUpgradeVersions is TestKubernetesUpgrade across two real
// builds: the rack is bootstrapped on Kubernetes 1.35.4, whose binaries
// the nodes have from COZY_K8S_PREVIOUS (hack/envtest-assets.sh v1.35.4),
// and upgraded to 1.36.3, the default build: the API through the VIP
// reports 1.35.4 before and 1.36.3 after, and each control plane's
// kube-apiserver was restarted once, onto the 1.36.3 binary. It needs a
// second Kubernetes build (about 14 minutes cold), beyond CI's time: `make e2e`.
func TestKubernetesUpgradeVersions(t *testing.T) {
	prev := os.Getenv("COZY_K8S_PREVIOUS")
	if prev == "" {
		prereq.Missing(t, "COZY_K8S_PREVIOUS is not set: the directory of hack/envtest-assets.sh v1.35.4 (make e2e sets it)")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 12*time.Minute)
	defer cancel()
	const from, to = "v1.35.4", "v1.36.3"
	r, rc := haRackWith(ctx, t, 3, 1, "kubernetesVersion: "+from, []string{"--kubernetes-assets", prev})
	if v, err := r.ns.KubeVersion(filepath.Join(r.stateDir, "kubeconfig")); err != nil || v != from {
		t.Fatalf("/version through the VIP before the upgrade: %q, %v; want %s", v, err, from)
	}
	upgradeKubernetes(ctx, t, r, rc, from, to, func(t *testing.T, n *emuNode) {
		restarts := strings.Count(n.log.String(), restartLine)
		if n.role != "controlplane" {
			if restarts != 0 {
				t.Errorf("%s: %d restarts, want none on a worker", n.host, restarts)
			}
			return
		}
		if restarts != 1 || !strings.Contains(n.log.String(), "binary="+filepath.Join(r.assets, "kube-apiserver")) {
			t.Errorf("%s: %d restarts, want one, onto %s", n.host, restarts, filepath.Join(r.assets, "kube-apiserver"))
		}
	})
	if v, err := r.ns.KubeVersion(filepath.Join(r.stateDir, "kubeconfig")); err != nil || v != to {
		t.Errorf("/version through the VIP after the upgrade: %q, %v; want %s", v, err, to)
	}
}
