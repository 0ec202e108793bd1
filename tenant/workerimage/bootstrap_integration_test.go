//go:build integration

package workerimage_test

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/utils/ptr"
	bootstrapv1 "sigs.k8s.io/cluster-api/api/bootstrap/kubeadm/v1beta2"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"cozy.dev/cozy/internal/testing/netnstest"
	"cozy.dev/cozy/internal/testing/poll"
	"cozy.dev/cozy/internal/testing/testenv"
	v1 "cozy.dev/cozy/operators/api/v1alpha1"
	"cozy.dev/cozy/operators/tenantcluster"
)

// The tenant the bootstrap provider renders a worker for: one node group,
// one Machine, named as a MachineSet names its Machines.
const (
	cluster   = "acme"
	namespace = "tenant-acme"
)

// tenant is a TenantCluster with one node group, md0, whose nodes carry
// the label cozy.dev/tenant=acme.
func tenant() *v1.TenantCluster {
	return &v1.TenantCluster{
		ObjectMeta: metav1.ObjectMeta{Name: cluster, Namespace: namespace, UID: "6a1f0c52-2f57-4c38-9d2e-0e3f0a4b7c11"},
		Spec: v1.TenantClusterSpec{
			Version: version,
			NodeGroups: []v1.NodeGroup{{
				Name: "md0", Replicas: ptr.To[int32](1), DiskSize: "20Gi",
				Resources: &v1.Resources{CPU: 2, Memory: "2Gi"},
				Labels:    map[string]string{"cozy.dev/tenant": cluster},
			}},
		},
	}
}

// bootstrapUserData runs the Cluster API kubeadm bootstrap provider's own
// manager (v1.14.2, built by hack/capi-controllers.sh) in ns, against a
// management API server of its own, and returns the user-data it renders
// for a worker Machine of the tenant: the KubeadmConfig is cloned from
// the KubeadmConfigTemplate cozy-operator builds for node group md0, the
// Cluster is reported as Kamaji and CAPK would (infrastructure
// provisioned, control plane initialised, endpoint apiAddr:6443), and the
// tenant's CA and kubeconfig Secrets hold the control plane's (dir's PKI,
// the super-admin kubeconfig). The provider does the rest: it creates a
// bootstrap token in the tenant cluster, works out the CA hash, and
// writes the cloud-config Secret a VM's NoCloud disk carries.
func bootstrapUserData(ctx context.Context, t *testing.T, ns *netnstest.NS, dir, superAdmin string, bootstrapTemplate *unstructured.Unstructured) string {
	t.Helper()
	manager := testenv.KubeadmBootstrapManager(t)
	ctrllog.SetLogger(logr.Discard()) // envtest's own chatter; the manager logs to its file
	scheme := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{clientgoscheme.AddToScheme, clusterv1.AddToScheme, bootstrapv1.AddToScheme} {
		if err := add(scheme); err != nil {
			t.Fatal(err)
		}
	}
	var crds []testenv.CRDSource
	for _, src := range testenv.UpstreamCRDs() {
		if src.Module == "sigs.k8s.io/cluster-api" {
			crds = append(crds, src)
		}
	}
	env := testenv.Start(t, testenv.Options{Scheme: scheme, CRDs: crds})
	c := env.Client
	apiURL, err := url.Parse(env.Config.Host)
	if err != nil {
		t.Fatal(err)
	}
	ns.Forward(t, apiURL.Host)

	// The manager dying ends the waits below at once.
	ctx, exited := context.WithCancelCause(ctx)
	t.Cleanup(func() { exited(nil) })
	testenv.StartCAPIManager(t, ns, manager, env.WriteKubeconfig(t), testenv.WebhookCertDir(t), exited)

	create := func(obj client.Object) {
		t.Helper()
		if err := c.Create(ctx, obj); err != nil {
			t.Fatalf("create %T %s: %v", obj, obj.GetName(), err)
		}
	}
	labels := map[string]string{clusterv1.ClusterNameLabel: cluster}
	create(&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace}})
	read := func(f string) []byte {
		t.Helper()
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	// What Kamaji writes for a tenant: its CA, and an admin kubeconfig.
	create(&corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: cluster + "-ca", Namespace: namespace, Labels: labels},
		Type:       clusterv1.ClusterSecretType,
		Data:       map[string][]byte{"tls.crt": read(filepath.Join(dir, "pki", "ca.crt")), "tls.key": read(filepath.Join(dir, "pki", "ca.key"))},
	})
	create(&corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: cluster + "-kubeconfig", Namespace: namespace, Labels: labels},
		Type:       clusterv1.ClusterSecretType,
		Data:       map[string][]byte{"value": read(superAdmin)},
	})
	cl := &clusterv1.Cluster{
		ObjectMeta: metav1.ObjectMeta{Name: cluster, Namespace: namespace},
		Spec:       clusterv1.ClusterSpec{ControlPlaneEndpoint: clusterv1.APIEndpoint{Host: apiAddr, Port: 6443}},
	}
	create(cl)
	cl.Status.Initialization.InfrastructureProvisioned = ptr.To(true)
	cl.Status.Initialization.ControlPlaneInitialized = ptr.To(true)
	cl.Status.Conditions = []metav1.Condition{{
		Type: clusterv1.ClusterControlPlaneInitializedCondition, Status: metav1.ConditionTrue,
		Reason: clusterv1.ClusterControlPlaneInitializedReason, LastTransitionTime: metav1.Now(),
	}}
	if err := c.Status().Update(ctx, cl); err != nil {
		t.Fatal(err)
	}

	// A Machine of node group md0, as its MachineSet would make it, with
	// the KubeadmConfig cloned from the operator's template.
	m := &clusterv1.Machine{
		ObjectMeta: metav1.ObjectMeta{Name: node, Namespace: namespace, Labels: labels},
		Spec: clusterv1.MachineSpec{
			ClusterName: cluster, Version: version,
			Bootstrap: clusterv1.Bootstrap{ConfigRef: clusterv1.ContractVersionedObjectReference{
				APIGroup: bootstrapv1.GroupVersion.Group, Kind: "KubeadmConfig", Name: node}},
			InfrastructureRef: clusterv1.ContractVersionedObjectReference{
				APIGroup: "infrastructure.cluster.x-k8s.io", Kind: "KubevirtMachine", Name: node},
		},
	}
	create(m)
	spec, found, err := unstructured.NestedMap(bootstrapTemplate.Object, "spec", "template", "spec")
	if err != nil || !found {
		t.Fatalf("the operator's KubeadmConfigTemplate has no spec.template.spec: %v", err)
	}
	kc := &unstructured.Unstructured{Object: map[string]any{"spec": spec}}
	kc.SetAPIVersion(bootstrapv1.GroupVersion.String())
	kc.SetKind("KubeadmConfig")
	kc.SetName(node)
	kc.SetNamespace(namespace)
	kc.SetLabels(labels)
	kc.SetOwnerReferences([]metav1.OwnerReference{{
		APIVersion: clusterv1.GroupVersion.String(), Kind: "Machine", Name: m.Name, UID: m.UID, Controller: ptr.To(true),
	}})
	create(kc)

	start := time.Now()
	var cfg bootstrapv1.KubeadmConfig
	poll.Until(t, ctx, time.Second, "the bootstrap provider's data Secret", func() error {
		if err := c.Get(ctx, client.ObjectKey{Namespace: namespace, Name: node}, &cfg); err != nil {
			return err
		}
		if cfg.Status.DataSecretName == "" {
			var why []string
			for _, cond := range cfg.Status.Conditions {
				why = append(why, cond.Type+"="+string(cond.Status)+" "+cond.Reason+" "+cond.Message)
			}
			return fmt.Errorf("no data Secret yet: %v", why)
		}
		return nil
	})
	var data corev1.Secret
	if err := c.Get(ctx, client.ObjectKey{Namespace: namespace, Name: cfg.Status.DataSecretName}, &data); err != nil {
		t.Fatal(err)
	}
	if f := string(data.Data["format"]); f != string(bootstrapv1.CloudConfig) {
		t.Fatalf("data Secret %s: format %q, want cloud-config", data.Name, f)
	}
	joinArgs := cfg.Spec.JoinConfiguration.NodeRegistration.KubeletExtraArgs
	if !slices.ContainsFunc(joinArgs, func(a bootstrapv1.Arg) bool { return a.Name == "node-labels" }) {
		t.Errorf("KubeadmConfig %s: kubelet arguments %v lack the group's node-labels", node, joinArgs)
	}
	t.Logf("the kubeadm bootstrap provider rendered %s's user-data (%d bytes) %v after the manager started",
		node, len(data.Data["value"]), time.Since(start).Round(time.Second))
	return string(data.Data["value"])
}

// desiredGroup is what cozy-operator builds for the tenant's node group
// md0, its disk from images.
func desiredGroup(t *testing.T, images tenantcluster.WorkerImages) tenantcluster.GroupChildren {
	t.Helper()
	c, err := tenantcluster.Desired(tenant(), version, images)
	if err != nil || len(c.Groups) != 1 {
		t.Fatalf("the operator's children: %v (%d groups)", err, len(c.Groups))
	}
	return c.Groups[0]
}
