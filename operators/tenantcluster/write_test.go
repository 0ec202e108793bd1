package tenantcluster

import (
	"testing"

	apimeta "k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

func TestWriterPath(t *testing.T) {
	secret := schema.GroupVersionKind{Version: "v1", Kind: "Secret"}
	cluster := schema.GroupVersionKind{Group: "cluster.x-k8s.io", Version: "v1beta2", Kind: "Cluster"}
	role := schema.GroupVersionKind{Group: "rbac.authorization.k8s.io", Version: "v1", Kind: "ClusterRole"}
	mapper := apimeta.NewDefaultRESTMapper(nil)
	mapper.Add(secret, apimeta.RESTScopeNamespace)
	mapper.Add(cluster, apimeta.RESTScopeNamespace)
	mapper.Add(role, apimeta.RESTScopeRoot)
	w := &writer{mapper: mapper}
	for _, tc := range []struct {
		gvk   schema.GroupVersionKind
		named bool
		want  string
	}{
		{secret, false, "/api/v1/namespaces/tenant-acme/secrets"},
		{secret, true, "/api/v1/namespaces/tenant-acme/secrets/acme"},
		{cluster, false, "/apis/cluster.x-k8s.io/v1beta2/namespaces/tenant-acme/clusters"},
		{cluster, true, "/apis/cluster.x-k8s.io/v1beta2/namespaces/tenant-acme/clusters/acme"},
		{role, true, "/apis/rbac.authorization.k8s.io/v1/clusterroles/acme"},
		// Again, from the cache.
		{cluster, true, "/apis/cluster.x-k8s.io/v1beta2/namespaces/tenant-acme/clusters/acme"},
	} {
		u := &unstructured.Unstructured{}
		u.SetGroupVersionKind(tc.gvk)
		u.SetNamespace("tenant-acme")
		u.SetName("acme")
		got, err := w.path(u, tc.named)
		if err != nil || got != tc.want {
			t.Errorf("path(%s, named %v) = %q, %v; want %q", tc.gvk.Kind, tc.named, got, err, tc.want)
		}
	}
	u := &unstructured.Unstructured{}
	u.SetGroupVersionKind(schema.GroupVersionKind{Group: "example.com", Version: "v1", Kind: "Unknown"})
	if _, err := w.path(u, false); err == nil {
		t.Error("a kind the mapper does not know got a path")
	}
}
