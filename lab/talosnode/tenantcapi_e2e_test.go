//go:build integration && (e2e || bench)

package talosnode_test

import (
	"context"
	"fmt"
	"net"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"cozy.dev/cozy/internal/testing/poll"
	"cozy.dev/cozy/internal/testing/testenv"
	"cozy.dev/cozy/internal/testing/workertest"
	v1 "cozy.dev/cozy/operators/api/v1alpha1"
	"cozy.dev/cozy/operators/tenantcluster"
	"cozy.dev/cozy/tenant/workerimage"
)

// bootstrapWebhookPort is where the kubeadm bootstrap manager serves its
// webhooks: beside core's (testenv.CAPIWebhookPort) in the same
// namespace. Its webhook configurations are not registered.
const bootstrapWebhookPort = 9444

// startClusterAPI runs what turns cozy-operator's children into a
// tenant: Cluster API's core and kubeadm bootstrap managers
// (hack/capi-controllers.sh) and the Kamaji control-plane provider
// (hack/kamaji.sh's port of v0.20.0 to Kamaji v1.0.0), as processes in
// the control plane node's network namespace, where hostNetwork pods of
// theirs would run: they reach the management API, and tenants' ClusterIP
// Services through the node's kube-proxy. Their CRDs and CAPK's (whose
// KubevirtCluster the Kamaji provider marks provisioned; CAPK itself does
// not run: no KubeVirt here) come from their modules; core's webhooks
// are registered, failing closed. If a manager exits, exited is called with why.
func startClusterAPI(ctx context.Context, t *testing.T, c *procCluster, kamaji string, exited context.CancelCauseFunc) {
	t.Helper()
	var sources []testenv.CRDSource
	for _, src := range testenv.UpstreamCRDs() {
		switch src.Module {
		case "sigs.k8s.io/cluster-api", "sigs.k8s.io/cluster-api-provider-kubevirt", "github.com/clastix/cluster-api-control-plane-provider-kamaji":
			sources = append(sources, src)
		}
	}
	crds, err := testenv.LoadCRDs(ctx, sources)
	if err != nil {
		t.Fatal(err)
	}
	cl := clusterClient(t, c)
	for _, crd := range crds {
		if err := cl.Create(ctx, crd); err != nil {
			t.Fatal(err)
		}
	}

	// Established before the managers start and the children come.
	poll.Within(t, time.Minute, 500*time.Millisecond, "the Cluster API kinds established", func() error {
		for _, k := range []string{
			"cluster.x-k8s.io/v1beta2 MachineList", "bootstrap.cluster.x-k8s.io/v1beta2 KubeadmConfigList",
			"controlplane.cluster.x-k8s.io/v1alpha2 KamajiControlPlaneList", "infrastructure.cluster.x-k8s.io/v1alpha1 KubevirtClusterList",
		} {
			var list unstructured.UnstructuredList
			apiVersion, kind, _ := strings.Cut(k, " ")
			list.SetAPIVersion(apiVersion)
			list.SetKind(kind)
			if err := cl.List(ctx, &list); err != nil {
				return err
			}
		}
		return nil
	})

	cp := c.nodes[0]
	certDir := testenv.WebhookCertDir(t, cp.ip)
	testenv.StartCAPIManager(t, cp.ns, testenv.CAPIManager(t), c.kubeconfig, certDir, exited)
	testenv.StartProcess(t, cp.ns, testenv.KubeadmBootstrapManager(t), []string{
		"--kubeconfig=" + c.kubeconfig,
		"--webhook-cert-dir=" + certDir,
		"--webhook-port=" + strconv.Itoa(bootstrapWebhookPort),
		"--health-addr=0", "--diagnostics-address=0", "--leader-elect=false",
	}, nil, exited)
	// Its manager reads no --kubeconfig flag (controller-runtime's
	// KUBECONFIG instead); it registers no webhooks.
	testenv.StartProcess(t, cp.ns, filepath.Join(kamaji, testenv.KamajiProviderBinary), []string{
		"--health-probe-bind-address=0", "--diagnostics-address=0", "--leader-elect=false",
	}, []string{"KUBECONFIG=" + c.kubeconfig}, exited)

	// Core's webhooks, once its server answers.
	testenv.RegisterCAPIWebhooks(ctx, t, cl, c.sw.DialContext, net.JoinHostPort(cp.ip, strconv.Itoa(testenv.CAPIWebhookPort)), certDir)
}

// managementClient is a client of the cluster's API that knows Cluster
// API's kinds.
func managementClient(t *testing.T, c *procCluster) client.Client {
	t.Helper()
	scheme := workertest.Scheme(t)
	rc, err := clientcmd.BuildConfigFromFlags("https://"+c.nodes[0].kubeAPI, c.kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	cl, err := client.New(rc, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	return cl
}

// applyChildren applies cozy-operator's children for tc
// (tenantcluster.Desired at its version, workers pulling through the
// mirror) as the operator applies them: server-side, under its field
// owner. tc itself is not stored: its CRD accepts Kubernetes v1.34 and
// newer, and Kamaji v1.0.0 serves v1.30.2 at most; so the children go
// without their owner reference to it (the garbage collector would
// delete them at once), and the test deletes them as the collector would.
func applyChildren(ctx context.Context, t *testing.T, cl client.Client, tc *v1.TenantCluster) tenantcluster.Children {
	t.Helper()
	children, err := tenantcluster.Desired(tc, tc.Spec.Version, tenantcluster.WorkerImages{
		Repository: mirrorAddr + "/cozy.dev/tenant-worker", Insecure: true, Mirror: "http://" + mirrorAddr,
	})
	if err != nil {
		t.Fatalf("the operator's children: %v", err)
	}
	for _, u := range children.All() {
		u = u.DeepCopy()
		u.SetOwnerReferences(nil)
		err := cl.Apply(ctx, client.ApplyConfigurationFromUnstructured(u), client.FieldOwner("cozy-operator"), client.ForceOwnership)
		if err != nil {
			t.Fatalf("apply %s %s: %v", u.GetKind(), u.GetName(), err)
		}
	}
	return children
}

// joinWorker waits for the Machine Cluster API's core manager makes for
// the tenant's one node group and for the user-data the kubeadm bootstrap
// provider renders for it (the Machine's bootstrap data Secret), then
// boots Cozy's worker image with it under QEMU in the worker node's
// network namespace, as KubeVirt runs a VM in a pod of a management
// node: its user network reaches the tenant's ClusterIP Service through
// the node's kube-proxy, and the mirror on the LAN. It returns the VM and
// the Machine's name, which the worker takes as its hostname.
func joinWorker(ctx context.Context, t *testing.T, cl client.Client, worker *clusterNode, namespace, cluster, version string) (workertest.VM, string) {
	t.Helper()
	images := testenv.BuiltDir(t, "COZY_KAMAJI_WORKER_IMAGE", "hack/worker-image.sh "+version, "index.json", "disk/"+workerimage.DiskName(version))
	var machine, dataSecret string
	poll.Within(t, 5*time.Minute, time.Second, "the worker Machine's bootstrap data", func() error {
		if err := context.Cause(ctx); err != nil {
			t.Fatal(err)
		}
		var list unstructured.UnstructuredList
		list.SetAPIVersion("cluster.x-k8s.io/v1beta2")
		list.SetKind("MachineList")
		if err := cl.List(ctx, &list, client.InNamespace(namespace), client.MatchingLabels{"cluster.x-k8s.io/cluster-name": cluster}); err != nil {
			return err
		}
		if len(list.Items) != 1 {
			return fmt.Errorf("%d Machines", len(list.Items))
		}
		machine = list.Items[0].GetName()
		dataSecret, _, _ = unstructured.NestedString(list.Items[0].Object, "spec", "bootstrap", "dataSecretName")
		if dataSecret == "" {
			return fmt.Errorf("Machine %s: no spec.bootstrap.dataSecretName yet", machine)
		}
		return nil
	})
	var secret corev1.Secret
	if err := cl.Get(ctx, client.ObjectKey{Namespace: namespace, Name: dataSecret}, &secret); err != nil {
		t.Fatal(err)
	}
	userData := secret.Data["value"]
	if len(userData) == 0 {
		t.Fatalf("the bootstrap data Secret %s holds no value", dataSecret)
	}
	dir := t.TempDir()
	vm := workertest.Boot(ctx, t, worker.ns, dir, filepath.Join(images, "disk", workerimage.DiskName(version)),
		workertest.Seed(t, dir, machine, namespace, string(userData)))
	t.Cleanup(func() {
		select {
		case err := <-vm.Exited:
			t.Errorf("the worker VM exited before the test ended: %v", err)
		default:
		}
	})
	return vm, machine
}

// object fetches apiVersion/kind namespace/name as unstructured.
func object(ctx context.Context, cl client.Client, apiVersion, kind, namespace, name string) (*unstructured.Unstructured, error) {
	u := &unstructured.Unstructured{}
	u.SetAPIVersion(apiVersion)
	u.SetKind(kind)
	err := cl.Get(ctx, client.ObjectKey{Namespace: namespace, Name: name}, u)
	return u, err
}

// checkClusterAPIControlPlane checks what the Kamaji provider reports
// to Cluster API once the tenant's control plane is Ready: the
// KamajiControlPlane ready and initialised, the Cluster's endpoint the
// tenant's Service, the infrastructure and the control plane marked
// provisioned and initialised in the Cluster (by the provider's patch of
// the KubevirtCluster, and core), the kubeconfig Secret Cluster API's
// controllers read. Then bad input: a KamajiControlPlane setting what
// Kamaji v1.0.0 cannot carry is refused by name, and the running tenant
// keeps serving; taken out again, the refusal clears.
func checkClusterAPIControlPlane(ctx context.Context, t *testing.T, cl client.Client, apiHost string, answers func() error) {
	t.Helper()
	const ns, name = "tenants", "acme"
	kcpAPI := "controlplane.cluster.x-k8s.io/v1alpha2"
	poll.Within(t, 3*time.Minute, time.Second, "Cluster API's view of the control plane", func() error {
		kcp, err := object(ctx, cl, kcpAPI, "KamajiControlPlane", ns, name)
		if err != nil {
			return err
		}
		ready, _, _ := unstructured.NestedBool(kcp.Object, "status", "ready")
		initialized, _, _ := unstructured.NestedBool(kcp.Object, "status", "initialization", "controlPlaneInitialized")
		if !ready || !initialized {
			return fmt.Errorf("KamajiControlPlane: ready %v, initialised %v", ready, initialized)
		}
		cluster, err := object(ctx, cl, "cluster.x-k8s.io/v1beta2", "Cluster", ns, name)
		if err != nil {
			return err
		}
		host, _, _ := unstructured.NestedString(cluster.Object, "spec", "controlPlaneEndpoint", "host")
		port, _, _ := unstructured.NestedInt64(cluster.Object, "spec", "controlPlaneEndpoint", "port")
		if host != apiHost || port != 6443 {
			return fmt.Errorf("the Cluster's controlPlaneEndpoint: %s:%d, want %s:6443", host, port, apiHost)
		}
		infra, _, _ := unstructured.NestedBool(cluster.Object, "status", "initialization", "infrastructureProvisioned")
		cpInit, _, _ := unstructured.NestedBool(cluster.Object, "status", "initialization", "controlPlaneInitialized")
		if !infra || !cpInit {
			return fmt.Errorf("the Cluster: infrastructure provisioned %v, control plane initialised %v", infra, cpInit)
		}
		var secret corev1.Secret
		return cl.Get(ctx, client.ObjectKey{Namespace: ns, Name: name + "-kubeconfig"}, &secret)
	})

	created := func(kcp *unstructured.Unstructured) (string, string) {
		conds, _, _ := unstructured.NestedSlice(kcp.Object, "status", "conditions")
		for _, c := range conds {
			m, _ := c.(map[string]any)
			if m["type"] == "TenantControlPlaneCreated" {
				s, _ := m["status"].(string)
				msg, _ := m["message"].(string)
				return s, msg
			}
		}
		return "", ""
	}
	patch := func(body string) {
		t.Helper()
		kcp, err := object(ctx, cl, kcpAPI, "KamajiControlPlane", ns, name)
		if err != nil {
			t.Fatal(err)
		}
		if err := cl.Patch(ctx, kcp, client.RawPatch(types.MergePatchType, []byte(body)), client.FieldOwner("someone")); err != nil {
			t.Fatalf("patch the KamajiControlPlane with %s: %v", body, err)
		}
	}
	patch(`{"spec":{"network":{"advertiseAddress":"10.77.0.250"}}}`)
	poll.Within(t, 2*time.Minute, time.Second, "the provider refusing spec.network.advertiseAddress", func() error {
		kcp, err := object(ctx, cl, kcpAPI, "KamajiControlPlane", ns, name)
		if err != nil {
			return err
		}
		if status, msg := created(kcp); status != "False" || !strings.Contains(msg, "spec.network.advertiseAddress is not supported") {
			return fmt.Errorf("TenantControlPlaneCreated %s: %q", status, msg)
		}
		return nil
	})
	kcp, _ := object(ctx, cl, kcpAPI, "KamajiControlPlane", ns, name)
	_, msg := created(kcp)
	t.Logf("refused: TenantControlPlaneCreated False: %s", msg)
	if err := answers(); err != nil {
		t.Errorf("the tenant's API while its KamajiControlPlane was refused: %v", err)
	}
	patch(`{"spec":{"network":{"advertiseAddress":null}}}`)
	poll.Within(t, 2*time.Minute, time.Second, "the refusal cleared", func() error {
		kcp, err := object(ctx, cl, kcpAPI, "KamajiControlPlane", ns, name)
		if err != nil {
			return err
		}
		if status, msg := created(kcp); status != "True" {
			return fmt.Errorf("TenantControlPlaneCreated %s: %q", status, msg)
		}
		return nil
	})
}

// clusterAPIGone waits until the tenant's Cluster API objects are gone:
// its Cluster, KamajiControlPlane, KubevirtCluster, Machines,
// KubeadmConfigs and the Secrets labelled with its cluster name.
func clusterAPIGone(ctx context.Context, t *testing.T, cl client.Client, namespace, cluster string) {
	t.Helper()
	poll.Within(t, 5*time.Minute, time.Second, "the tenant's Cluster API objects gone", func() error {
		var left []string
		for _, k := range []struct{ apiVersion, kind string }{
			{"cluster.x-k8s.io/v1beta2", "Cluster"},
			{"controlplane.cluster.x-k8s.io/v1alpha2", "KamajiControlPlane"},
			{"infrastructure.cluster.x-k8s.io/v1alpha1", "KubevirtCluster"},
		} {
			if _, err := object(ctx, cl, k.apiVersion, k.kind, namespace, cluster); !apierrors.IsNotFound(err) {
				left = append(left, fmt.Sprintf("%s (%v)", k.kind, err))
			}
		}
		for _, k := range []struct{ apiVersion, kind string }{
			{"cluster.x-k8s.io/v1beta2", "MachineList"},
			{"bootstrap.cluster.x-k8s.io/v1beta2", "KubeadmConfigList"},
			{"v1", "SecretList"},
		} {
			var list unstructured.UnstructuredList
			list.SetAPIVersion(k.apiVersion)
			list.SetKind(k.kind)
			if err := cl.List(ctx, &list, client.InNamespace(namespace), client.MatchingLabels{"cluster.x-k8s.io/cluster-name": cluster}); err != nil {
				return err
			}
			for _, u := range list.Items {
				left = append(left, strings.TrimSuffix(k.kind, "List")+"/"+u.GetName())
			}
		}
		if len(left) > 0 {
			return fmt.Errorf("left: %s", strings.Join(left, " "))
		}
		return nil
	})
}
