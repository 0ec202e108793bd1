//go:build integration && (e2e || bench)

package talosnode_test

import (
	"bytes"
	"context"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"cozy.dev/cozy/internal/testing/cozyctl"
	"cozy.dev/cozy/internal/testing/poll"
	"cozy.dev/cozy/internal/testing/testenv"
	"cozy.dev/cozy/lab/talosnode"
	v1 "cozy.dev/cozy/operators/api/v1alpha1"
	"cozy.dev/cozy/operators/tenantcluster"
)

// operatorTenantVersion is what the TenantCluster of operatorTenant
// runs: hack/kamaji.sh's tenant_version, past Kamaji v1.0.0's own ceiling
// (v1.30.2), which that build lifts to it (a TenantCluster runs v1.34 or
// newer, and the platform's Kamaji cannot be built here).
const operatorTenantVersion = "v1.36.3"

// operatorTenant deploys cozy-operator as the platform does, a pod of its
// image from its chart with the values the platform renders for the rack
// (deployOperator: the mirror, no load-balancer pool), and a
// TenantCluster "beta" at operatorTenantVersion with one control-plane
// replica, one worker and its add-ons off (their charts cannot be
// fetched here; flannel stands in for the CNI) goes the whole way: the
// operator writes its children, Kamaji, Cluster API, the Kamaji provider
// and CAPK make the tenant, the test boots the VM CAPK asks for
// (joinWorker), its API answers through the kubeconfig `cozyctl tenant
// kubeconfig` prints, and the TenantCluster's own status reaches Ready,
// its workers 1/1, as `cozyctl tenant list` shows. Deleting the
// TenantCluster takes its children, VM and Secrets with it (the
// operator's finalizer and the garbage collector). Then tenantsThatWait.
func operatorTenant(ctx context.Context, t *testing.T, c *procCluster, mgmt client.Client, worker *clusterNode) {
	t.Helper()
	installOperatorCRDs(ctx, t, mgmt)
	images := testenv.BuiltDir(t, "COZY_TENANT_WORKER_IMAGE", "hack/worker-image.sh "+operatorTenantVersion, "index.json")
	mirrorLayout(t, ctx, c.sw, mirrorAddr, images, nil)
	deployOperator(ctx, t, c, mgmt)
	cozy := cozyctlOn(t, c) // built now, not while beta's clock runs

	tc := sampleTenant("beta", operatorTenantVersion)
	start := time.Now()
	if err := mgmt.Create(ctx, tc); err != nil {
		t.Fatalf("the TenantCluster beta: %v", err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			out, err := c.kubectl("-n", "tenants", "get", "tenantcluster", "beta", "-o", "jsonpath={.status}")
			t.Logf("beta's status: %s%v", out, err)
		}
	})
	condition := func(typ string) (*metav1.Condition, error) {
		if err := mgmt.Get(ctx, client.ObjectKeyFromObject(tc), tc); err != nil {
			return nil, err
		}
		c := apimeta.FindStatusCondition(tc.Status.Conditions, typ)
		if c == nil {
			return nil, fmt.Errorf("no %s condition yet: %+v", typ, tc.Status.Conditions)
		}
		return c, nil
	}
	poll.Within(t, 5*time.Minute, time.Second, "beta's ControlPlaneReady", func() error {
		c, err := condition(v1.ConditionControlPlaneReady)
		if err == nil && c.Status != metav1.ConditionTrue {
			err = fmt.Errorf("ControlPlaneReady %s %s: %s", c.Status, c.Reason, c.Message)
		}
		return err
	})
	t.Logf("the TenantCluster beta's control plane was ready %s after it was created: %s", time.Since(start).Round(time.Second), tc.Status.Endpoint)

	// Its worker: the VM CAPK makes from the operator's template boots
	// Cozy's image at the TenantCluster's version.
	_, name := joinWorker(ctx, t, mgmt, worker, "tenants", "beta", operatorTenantVersion, "COZY_TENANT_WORKER_IMAGE")
	if tc.Status.KubeconfigSecretRef == nil {
		t.Fatal("beta's status names no kubeconfig Secret")
	}
	// Its admin kubeconfig, as a user gets it: `cozyctl tenant
	// kubeconfig`, from the Secret its status names.
	kubeconfig, err := cozy("tenant", "kubeconfig", "beta", "-n", "tenants")
	if err != nil {
		t.Fatal(err)
	}
	kubectlIn := tenantKubectl(t, worker, []byte(kubeconfig))
	kubectl := func(args ...string) (string, error) { return kubectlIn(ctx, args...) }
	version, err := kubectl("get", "--raw", "/version")
	if err != nil || !strings.Contains(version, `"gitVersion": "`+operatorTenantVersion+`"`) {
		t.Fatalf("beta's /version through its kubeconfig: %s %v, want %s", version, err, operatorTenantVersion)
	}
	if out, err := kubectl("get", "namespaces", "-o", "name"); err != nil || !strings.Contains(out, "namespace/kube-system") {
		t.Fatalf("beta's namespaces through its kubeconfig: %q %v", out, err)
	}
	endpoint, err := url.Parse(tc.Status.Endpoint)
	if err != nil {
		t.Fatalf("beta's endpoint %q: %v", tc.Status.Endpoint, err)
	}
	flannel := tenantFlannel(t, tc.Spec.Network.PodCIDR, endpoint.Hostname())
	poll.Within(t, 2*time.Minute, 2*time.Second, "flannel applied in beta", func() error {
		out, err := kubectl("apply", "-f", flannel)
		if err != nil {
			return fmt.Errorf("%s %w", out, err)
		}
		return nil
	})

	// The TenantCluster's own status: Ready, as the operator reads its
	// children.
	poll.Within(t, 10*time.Minute, 2*time.Second, "the TenantCluster beta Ready", func() error {
		c, err := condition(v1.ConditionReady)
		if err != nil {
			return err
		}
		if c.Status != metav1.ConditionTrue || tc.Status.Phase != v1.PhaseReady || tc.Status.Workers != "1/1" {
			return fmt.Errorf("Ready %s %s: %s; phase %s, workers %s", c.Status, c.Reason, c.Message, tc.Status.Phase, tc.Status.Workers)
		}
		return nil
	})
	t.Logf("the TenantCluster beta was Ready %s after it was created: phase %s, workers %s, version %s, Node %s",
		time.Since(start).Round(time.Second), tc.Status.Phase, tc.Status.Workers, tc.Status.Version, name)
	if out, err := cozy("tenant", "list", "-n", "tenants"); err != nil || !regexp.MustCompile(`(?m)^tenants\s+beta\s+`+operatorTenantVersion+`\s+Ready\s+1/1\s`).MatchString(out) {
		t.Errorf("cozyctl tenant list: %v\n%s\nwant beta %s Ready 1/1", err, out, operatorTenantVersion)
	} else {
		t.Logf("cozyctl tenant list:\n%s", out)
	}
	if out, err := kubectl("get", "node", name, "-o", "jsonpath={.status.nodeInfo.kubeletVersion} {.spec.providerID}"); err != nil ||
		out != operatorTenantVersion+" kubevirt://"+name {
		t.Errorf("beta's Node %s: kubelet and provider ID %q (%v)", name, out, err)
	}

	tenantsThatWait(ctx, t, mgmt)

	// Deleted: the controller's finalizer lets it go once its children
	// are gone, and Cluster API's, the VM's and the Secrets with them.
	t.Logf("the TenantCluster beta was gone %s after its deletion", deleteTenantCluster(ctx, t, mgmt, tc).Round(time.Second))
}

// deleteTenantCluster deletes tc and waits until it is gone (the
// controller's finalizer lets it go once its children are) and so are
// its Cluster API objects (clusterAPIGone); it returns how long the
// TenantCluster took to go.
func deleteTenantCluster(ctx context.Context, t *testing.T, mgmt client.Client, tc *v1.TenantCluster) time.Duration {
	t.Helper()
	start := time.Now()
	if err := mgmt.Delete(ctx, tc); err != nil {
		t.Fatal(err)
	}
	poll.Within(t, 5*time.Minute, time.Second, "the TenantCluster "+tc.Name+" gone", func() error {
		if err := mgmt.Get(ctx, client.ObjectKeyFromObject(tc), &v1.TenantCluster{}); !apierrors.IsNotFound(err) {
			return fmt.Errorf("still there (%v)", err)
		}
		return nil
	})
	gone := time.Since(start)
	clusterAPIGone(ctx, t, mgmt, tc.Namespace, tc.Name)
	return gone
}

// tenantsThatWait: TenantClusters that cannot come up say why in their
// status, instead of leaving Kamaji's pods in ImagePullBackOff, workers
// importing nothing or a control plane never made; deleted, they go.
//   - gamma, at a version (v1.35.4) whose control-plane images and worker
//     image the rack's mirror lacks, names them;
//   - delta names a DataStore that does not exist: Kamaji's webhook
//     refuses its TenantControlPlane, and the TenantCluster says so.
func tenantsThatWait(ctx context.Context, t *testing.T, mgmt client.Client) {
	t.Helper()
	const version = "v1.35.4"
	gamma := sampleTenant("gamma", version)
	delta := sampleTenant("delta", operatorTenantVersion)
	delta.Spec.ControlPlane.DataStoreName = "gone"
	for _, tc := range []struct {
		tc   *v1.TenantCluster
		want map[string]string // condition -> "Reason: message" prefix
	}{
		{gamma, map[string]string{
			v1.ConditionControlPlaneReady: tenantcluster.ReasonControlPlaneImageMissing + ": the control plane at " + version + " waits for registry.k8s.io/kube-apiserver:" + version,
			v1.ConditionWorkersReady:      tenantcluster.ReasonWorkerImageMissing + ": node group md0 waits for its worker image " + mirrorAddr + "/cozy.dev/tenant-worker:" + version,
		}},
		{delta, map[string]string{
			v1.ConditionControlPlaneReady: tenantcluster.ReasonProviderError + ": the Kamaji control-plane provider reports TenantControlPlaneCreated False: " +
				"cannot create or update TenantControlPlane: admission webhook \"vtenantcontrolplane.kb.io\" denied the request: gone DataStore does not exist",
		}},
	} {
		if err := mgmt.Create(ctx, tc.tc); err != nil {
			t.Fatalf("the TenantCluster %s: %v", tc.tc.Name, err)
		}
		poll.Within(t, 2*time.Minute, time.Second, tc.tc.Name+"'s status saying why it waits", func() error {
			if err := mgmt.Get(ctx, client.ObjectKeyFromObject(tc.tc), tc.tc); err != nil {
				return err
			}
			for typ, w := range tc.want {
				c := apimeta.FindStatusCondition(tc.tc.Status.Conditions, typ)
				if c == nil || c.Status != metav1.ConditionFalse || !strings.HasPrefix(c.Reason+": "+c.Message, w) {
					return fmt.Errorf("%s: %+v, want False %s", typ, c, w)
				}
			}
			return nil
		})
		for typ := range tc.want {
			c := apimeta.FindStatusCondition(tc.tc.Status.Conditions, typ)
			t.Logf("%s at %s on DataStore %s: %s %s %s: %s", tc.tc.Name, tc.tc.Spec.Version, tc.tc.Spec.ControlPlane.DataStoreName, typ, c.Status, c.Reason, c.Message)
		}
		deleteTenantCluster(ctx, t, mgmt, tc.tc)
	}
}

// sampleTenant is the tests' TenantCluster name in namespace tenants at
// version: one control-plane replica on the DataStore default exposed
// as ClusterIP (the rack has no load-balancer pool), one node group md0
// of one worker labelled with the tenant's name. Its add-ons are off for
// the operator's controller (their charts cannot be fetched here; the
// test puts flannel in for the CNI: tenantFlannel); applyChildren builds
// acme's children without add-ons either way.
func sampleTenant(name, version string) *v1.TenantCluster {
	off := v1.Addon{Enabled: ptr.To(false)}
	return &v1.TenantCluster{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "tenants"},
		Spec: v1.TenantClusterSpec{
			Version: version,
			ControlPlane: v1.ControlPlane{
				Replicas: 1, DataStoreName: "default",
				Expose: v1.Expose{Type: v1.ExposeClusterIP},
			},
			Network: v1.Network{PodCIDR: "10.243.0.0/16", ServiceCIDR: "10.95.0.0/16", DNSDomain: "cluster.local"},
			NodeGroups: []v1.NodeGroup{{
				Name: "md0", Replicas: ptr.To[int32](1), DiskSize: "20Gi",
				Resources: &v1.Resources{CPU: 2, Memory: "2Gi"},
				Labels:    map[string]string{"cozy.dev/tenant": name},
			}},
			Addons: v1.Addons{CNI: off, KubevirtCSI: off, CloudControllerManager: off, ClusterAutoscaler: off, MetricsServer: off},
		},
	}
}

// tenantFlannel writes Talos's flannel for a tenant of pod network
// podCIDR whose API is at host:6443 (talosnode.TenantFlannel) into a file
// of the test's, for kubectl apply -f.
func tenantFlannel(t *testing.T, podCIDR, host string) string {
	t.Helper()
	manifests, err := talosnode.TenantFlannel(podCIDR, host, 6443)
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "flannel.yaml")
	if err := os.WriteFile(file, manifests, 0o600); err != nil {
		t.Fatal(err)
	}
	return file
}

// installOperatorCRDs installs the TenantCluster CRD from cozy-operator's
// chart, and Flux's, whose HelmReleases the controller watches (the
// platform installs both).
func installOperatorCRDs(ctx context.Context, t *testing.T, cl client.Client) {
	t.Helper()
	var sources []testenv.CRDSource
	for _, src := range testenv.UpstreamCRDs() {
		if strings.HasPrefix(src.Module, "github.com/fluxcd/") {
			sources = append(sources, src)
		}
	}
	crds, err := testenv.LoadCRDs(ctx, sources)
	if err != nil {
		t.Fatal(err)
	}
	files, err := filepath.Glob("../../charts/cozy-operator/crds/*.yaml")
	if err != nil || len(files) == 0 {
		t.Fatalf("cozy-operator's CRDs: %v %v", files, err)
	}
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		crd := &apiextensionsv1.CustomResourceDefinition{}
		if err := yaml.UnmarshalStrict(data, crd); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		crds = append(crds, crd)
	}
	for _, crd := range crds {
		if err := cl.Create(ctx, crd); err != nil {
			t.Fatal(err)
		}
	}
	established(ctx, t, cl, "the TenantCluster and HelmRelease kinds", "tenancy.cozy.dev/v1alpha1 TenantClusterList", "helm.toolkit.fluxcd.io/v2 HelmReleaseList")
}

// cozyctlOn runs cozyctl against the cluster's API, through its first
// control plane's address on host loopback (a copy of its admin
// kubeconfig pointing there), and returns its stdout.
func cozyctlOn(t *testing.T, c *procCluster) func(args ...string) (string, error) {
	t.Helper()
	cfg, err := clientcmd.LoadFromFile(c.kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	for _, cl := range cfg.Clusters {
		cl.Server = "https://" + c.nodes[0].kubeAPI
	}
	file := filepath.Join(t.TempDir(), "kubeconfig")
	if err := clientcmd.WriteToFile(*cfg, file); err != nil {
		t.Fatal(err)
	}
	bin := cozyctl.Path(t)
	return func(args ...string) (string, error) {
		cmd := exec.Command(bin, append([]string{"--kubeconfig", file}, args...)...)
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		if err := cmd.Run(); err != nil {
			return "", fmt.Errorf("cozyctl %s: %v: %s", strings.Join(args, " "), err, stderr.String())
		}
		return stdout.String(), nil
	}
}

// tenantKubectl runs kubectl in the worker node's network namespace (where
// the tenant's ClusterIP Service is routed) with kubeconfig, written to a
// file of the test's; each call's context is its own, so that cleanups
// can outlive the test's.
func tenantKubectl(t *testing.T, worker *clusterNode, kubeconfig []byte) func(ctx context.Context, args ...string) (string, error) {
	t.Helper()
	if len(kubeconfig) == 0 {
		t.Fatal("an empty tenant kubeconfig")
	}
	file := filepath.Join(t.TempDir(), "tenant.kubeconfig")
	if err := os.WriteFile(file, kubeconfig, 0o600); err != nil {
		t.Fatal(err)
	}
	kubectl := filepath.Join(testenv.AssetsDir(t), "kubectl")
	return func(ctx context.Context, args ...string) (string, error) {
		cmd := worker.ns.Command(ctx, kubectl, append([]string{"--kubeconfig", file, "--request-timeout", "20s"}, args...)...)
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		if err := cmd.Run(); err != nil {
			return "", fmt.Errorf("kubectl %s: %v: %s", strings.Join(args, " "), err, stderr.String())
		}
		return stdout.String(), nil
	}
}
