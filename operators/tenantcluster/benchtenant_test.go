package tenantcluster

import (
	"fmt"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	v1 "cozy.dev/cozy/operators/api/v1alpha1"
)

// benchNamespaces is how many namespaces the benchmark's TenantClusters
// are spread over, as tenants would be.
const benchNamespaces = 100

// benchTenantCluster is the benchmark's i-th TenantCluster: two node
// groups (11 children), in one of benchNamespaces namespaces.
func benchTenantCluster(i int) *v1.TenantCluster {
	return &v1.TenantCluster{
		ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("t%04d", i), Namespace: fmt.Sprintf("tenant-%03d", i%benchNamespaces)},
		Spec: v1.TenantClusterSpec{
			Version: "v1.36.3",
			// The CRD's defaults, which the API server fills in for the
			// operator's side; the plain client's Desired needs them too.
			Network: v1.Network{PodCIDR: "10.243.0.0/16", ServiceCIDR: "10.95.0.0/16", DNSDomain: "cluster.local"},
			NodeGroups: []v1.NodeGroup{
				{Name: "md0", Replicas: ptr.To[int32](2), Resources: &v1.Resources{CPU: 2, Memory: "4Gi"}, DiskSize: "20Gi"},
				{Name: "md1", MinReplicas: ptr.To[int32](1), MaxReplicas: ptr.To[int32](3), Resources: &v1.Resources{CPU: 4, Memory: "8Gi"}, DiskSize: "40Gi"},
			},
		},
	}
}

// TestBenchTenantCluster keeps the benchmark's TenantCluster one the
// operator can build (the benchmark itself runs only under make bench):
// once, a check added to Desired made every round of TestBenchOperator
// fail at its first cluster, unseen until the next make bench.
func TestBenchTenantCluster(t *testing.T) {
	children, err := Desired(benchTenantCluster(0), "v1.36.3", testImages)
	if err != nil {
		t.Fatalf("the benchmark's TenantCluster: %v", err)
	}
	if n := len(children.All()); n != 11 {
		t.Errorf("%d children, want the 11 the benchmark's figures are for", n)
	}
}
