//go:build integration

package workerimage_test

import (
	"context"
	"net/url"
	"os"
	"path/filepath"
	"testing"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/utils/ptr"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"cozy.dev/cozy/internal/testing/netnstest"
	"cozy.dev/cozy/internal/testing/testenv"
	"cozy.dev/cozy/internal/testing/workertest"
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
			// The schema's defaults, which the API server would fill in.
			Network: v1.Network{PodCIDR: "10.243.0.0/16", ServiceCIDR: "10.95.0.0/16", DNSDomain: "cluster.local"},
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
// for a worker Machine of the tenant (workertest.RenderUserData): the
// KubeadmConfig cloned from the KubeadmConfigTemplate cozy-operator
// builds for node group md0, the Cluster reported as Kamaji and CAPK
// would (endpoint apiAddr:6443), and the tenant's CA and kubeconfig
// Secrets holding the control plane's (dir's PKI, the super-admin
// kubeconfig).
func bootstrapUserData(ctx context.Context, t *testing.T, ns *netnstest.NS, dir, superAdmin string, bootstrapTemplate *unstructured.Unstructured) string {
	t.Helper()
	manager := testenv.KubeadmBootstrapManager(t)
	ctrllog.SetLogger(logr.Discard()) // envtest's own chatter; the manager logs to its file
	var crds []testenv.CRDSource
	for _, src := range testenv.UpstreamCRDs() {
		if src.Module == "sigs.k8s.io/cluster-api" {
			crds = append(crds, src)
		}
	}
	env := testenv.Start(t, testenv.Options{Scheme: workertest.Scheme(t), CRDs: crds})
	apiURL, err := url.Parse(env.Config.Host)
	if err != nil {
		t.Fatal(err)
	}
	ns.Forward(t, apiURL.Host)

	// The manager dying ends the waits below at once.
	ctx, exited := context.WithCancelCause(ctx)
	t.Cleanup(func() { exited(nil) })
	testenv.StartCAPIManager(t, ns, manager, env.WriteKubeconfig(t), testenv.WebhookCertDir(t), exited)

	if err := env.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace}}); err != nil {
		t.Fatal(err)
	}
	read := func(f string) []byte {
		t.Helper()
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	return workertest.RenderUserData(ctx, t, env.Client, workertest.Machine{
		Namespace: namespace, Cluster: cluster, Name: node, Version: version, Host: apiAddr, Port: 6443,
		CACert: read(filepath.Join(dir, "pki", "ca.crt")), CAKey: read(filepath.Join(dir, "pki", "ca.key")), Kubeconfig: read(superAdmin),
		BootstrapTemplate: bootstrapTemplate,
	})
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
