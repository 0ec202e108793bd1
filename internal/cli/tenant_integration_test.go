//go:build integration

package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/utils/ptr"

	"cozy.dev/cozy/internal/testing/testenv"
	v1 "cozy.dev/cozy/operators/api/v1alpha1"
)

// TestTenantCommands runs `cozyctl tenant list` and `tenant kubeconfig`
// against a real kube-apiserver with the TenantCluster CRD.
func TestTenantCommands(t *testing.T) {
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	if err := v1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	env := testenv.Start(t, testenv.Options{
		CRDs:     []testenv.CRDSource{},
		CRDFiles: []string{filepath.Join("..", "..", "charts", "cozy-operator", "crds", "tenancy.cozy.dev_tenantclusters.yaml")},
		Scheme:   scheme,
	})
	kubeconfig := env.WriteKubeconfig(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c := env.Client

	for _, ns := range []string{"tenant-a", "tenant-b"} {
		if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
			t.Fatal(err)
		}
	}
	newTC := func(ns, name string) *v1.TenantCluster {
		tc := &v1.TenantCluster{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
			Spec: v1.TenantClusterSpec{Version: "v1.36.3", NodeGroups: []v1.NodeGroup{
				{Name: "md0", Replicas: ptr.To[int32](2), InstanceType: "u1.medium"},
			}},
		}
		if err := c.Create(ctx, tc); err != nil {
			t.Fatal(err)
		}
		return tc
	}
	acme := newTC("tenant-a", "acme")
	globex := newTC("tenant-b", "globex")
	globex.Status = v1.TenantClusterStatus{Phase: v1.PhaseProvisioning, Workers: "0/1", Conditions: []metav1.Condition{
		{Type: v1.ConditionControlPlaneReady, Status: metav1.ConditionFalse, Reason: "NoLoadBalancer", Message: "no pool", LastTransitionTime: metav1.Now()},
		{Type: v1.ConditionWorkersReady, Status: metav1.ConditionFalse, Reason: "WorkerImageMissing", Message: "no image", LastTransitionTime: metav1.Now()},
	}}
	if err := c.Status().Update(ctx, globex); err != nil {
		t.Fatal(err)
	}
	acme.Status = v1.TenantClusterStatus{Phase: v1.PhaseReady, Workers: "2/2", Endpoint: "https://10.0.0.5:6443",
		KubeconfigSecretRef: &corev1.LocalObjectReference{Name: "acme-admin"}}
	if err := c.Status().Update(ctx, acme); err != nil {
		t.Fatal(err)
	}
	secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "tenant-a", Name: "acme-admin"},
		Data: map[string][]byte{"value": []byte("apiVersion: v1\nkind: Config\n# acme\n")}}
	if err := c.Create(ctx, secret); err != nil {
		t.Fatal(err)
	}

	run := func(args ...string) (string, error) {
		var out, errOut bytes.Buffer
		cmd := NewRootCommand(&out, &errOut)
		cmd.SetArgs(append(args, "--kubeconfig", kubeconfig))
		err := cmd.Execute()
		return out.String(), err
	}

	out, err := run("tenant", "list", "-A")
	if err != nil {
		t.Fatal(err)
	}
	fields := strings.Join(strings.Fields(out), " ")
	if !strings.Contains(fields, "tenant-a acme v1.36.3 Ready 2/2 https://10.0.0.5:6443 - ") {
		t.Errorf("tenant list -A:\n%s", out)
	}
	// A cluster that waits says on what: its first condition not true.
	if !strings.Contains(fields, "tenant-b globex v1.36.3 Provisioning 0/1 - ControlPlaneReady/NoLoadBalancer ") {
		t.Errorf("tenant list -A, tenant-b/globex:\n%s", out)
	}
	out, err = run("tenant", "list", "-n", "tenant-b", "-o", "json")
	if err != nil {
		t.Fatal(err)
	}
	var list struct{ Items []v1.TenantCluster }
	if err := json.Unmarshal([]byte(out), &list); err != nil || len(list.Items) != 1 || list.Items[0].Name != "globex" {
		t.Errorf("tenant list -n tenant-b -o json: %v %s", err, out)
	}

	tests := []struct {
		args      []string
		want, err string
	}{
		{args: []string{"tenant", "kubeconfig", "acme", "-n", "tenant-a"}, want: "# acme"},
		{args: []string{"tenant", "kubeconfig", "globex", "-n", "tenant-b"}, err: "TenantCluster tenant-b/globex has no kubeconfig yet (phase Provisioning): the Secret globex-kubeconfig appears once its control plane is up"},
		{args: []string{"tenant", "kubeconfig", "nope", "-n", "tenant-a"}, err: "no TenantCluster nope in namespace tenant-a"},
	}
	for _, tt := range tests {
		out, err := run(tt.args...)
		if tt.err != "" {
			if err == nil || !strings.Contains(err.Error(), tt.err) {
				t.Errorf("%v: err = %v, want %q", tt.args, err, tt.err)
			}
			continue
		}
		if err != nil || !strings.Contains(out, tt.want) {
			t.Errorf("%v: %q, %v", tt.args, out, err)
		}
	}
}
