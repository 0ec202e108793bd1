//go:build integration

package v1alpha1_test

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"cozy.dev/cozy/internal/testing/testenv"
	v1 "cozy.dev/cozy/operators/api/v1alpha1"
)

// valid is the smallest TenantCluster the API server accepts, plus one
// group of each kind (fixed and autoscaled).
func valid(name string) *v1.TenantCluster {
	return &v1.TenantCluster{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "tenant-a"},
		Spec: v1.TenantClusterSpec{
			Version: "v1.36.3",
			NodeGroups: []v1.NodeGroup{
				{Name: "md0", Replicas: ptr.To[int32](2), Resources: &v1.Resources{CPU: 2, Memory: "4Gi"}},
				{Name: "gpu", MinReplicas: ptr.To[int32](0), MaxReplicas: ptr.To[int32](4), InstanceType: "u1.large",
					Taints: []corev1.Taint{{Key: "gpu", Effect: corev1.TaintEffectNoSchedule}}},
			},
		},
	}
}

func startAPI(t *testing.T) client.Client {
	scheme := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{clientgoscheme.AddToScheme, apiextensionsv1.AddToScheme, v1.AddToScheme} {
		if err := add(scheme); err != nil {
			t.Fatal(err)
		}
	}
	env := testenv.Start(t, testenv.Options{
		CRDs:     []testenv.CRDSource{},
		CRDFiles: []string{filepath.Join("..", "..", "..", "charts", "cozy-operator", "crds", "tenancy.cozy.dev_tenantclusters.yaml")},
		Scheme:   scheme,
	})
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "tenant-a"}}
	if err := env.Client.Create(context.Background(), ns); err != nil {
		t.Fatal(err)
	}
	return env.Client
}

// TestValidation creates and updates TenantClusters against a real
// kube-apiserver with the generated CRD: the valid one gets its defaults,
// and every invalid spec is refused with a message that says what to fix.
func TestValidation(t *testing.T) {
	c := startAPI(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	t.Run("defaults", func(t *testing.T) {
		tc := valid("defaults")
		if err := c.Create(ctx, tc); err != nil {
			t.Fatal(err)
		}
		s := tc.Spec
		got := fmt.Sprintln(s.ControlPlane.Replicas, s.ControlPlane.DataStoreName, *s.ControlPlane.Konnectivity, s.ControlPlane.Expose.Type,
			s.Network.PodCIDR, s.Network.ServiceCIDR, s.Network.DNSDomain, s.StorageClass, s.NodeGroups[0].DiskSize)
		want := "2 default true LoadBalancer 10.243.0.0/16 10.95.0.0/16 cluster.local replicated 20Gi\n"
		if got != want {
			t.Errorf("defaults: %s, want %s", got, want)
		}
	})

	creates := []struct {
		name string
		edit func(*v1.TenantCluster)
		want string
	}{
		{"no version", func(tc *v1.TenantCluster) { tc.Spec.Version = "" }, "version must be a supported Kubernetes release"},
		{"unsupported minor", func(tc *v1.TenantCluster) { tc.Spec.Version = "v1.30.1" }, "version must be a supported Kubernetes release, v1.34.x to v1.37.x"},
		{"not a version", func(tc *v1.TenantCluster) { tc.Spec.Version = "latest" }, "version must be a supported Kubernetes release"},
		{"version without v", func(tc *v1.TenantCluster) { tc.Spec.Version = "1.36.3" }, "version must be a supported Kubernetes release"},
		{"name too long", func(tc *v1.TenantCluster) { tc.Name = strings.Repeat("a", 41) }, "at most 40 characters"},
		{"control plane replicas 0", func(tc *v1.TenantCluster) { tc.Spec.ControlPlane.Replicas = -1 }, "spec.controlPlane.replicas: Invalid value: -1: spec.controlPlane.replicas in body should be greater than or equal to 1"},
		{"control plane replicas 9", func(tc *v1.TenantCluster) { tc.Spec.ControlPlane.Replicas = 9 }, "should be less than or equal to 5"},
		{"unknown expose type", func(tc *v1.TenantCluster) { tc.Spec.ControlPlane.Expose.Type = "NodePort" }, `Unsupported value: "NodePort"`},
		{"ingress without host", func(tc *v1.TenantCluster) { tc.Spec.ControlPlane.Expose.Type = v1.ExposeIngress }, "controlPlane.expose.host is required with type Ingress, and only then"},
		{"host without ingress", func(tc *v1.TenantCluster) { tc.Spec.ControlPlane.Expose.Host = "api.t1.example.com" }, "controlPlane.expose.host is required with type Ingress, and only then"},
		{"bad host", func(tc *v1.TenantCluster) {
			tc.Spec.ControlPlane.Expose = v1.Expose{Type: v1.ExposeIngress, Host: "API_server"}
		}, "must be a DNS name"},
		{"extra arg with dashes", func(tc *v1.TenantCluster) {
			tc.Spec.ControlPlane.APIServerExtraArgs = map[string]string{"--audit-log-maxage": "30"}
		}, "flag names without dashes"},
		{"extra arg Kamaji owns", func(tc *v1.TenantCluster) {
			tc.Spec.ControlPlane.APIServerExtraArgs = map[string]string{"etcd-servers": "https://x:2379"}
		}, "cannot set flags Kamaji manages"},
		{"pod CIDR not a CIDR", func(tc *v1.TenantCluster) { tc.Spec.Network.PodCIDR = "10.243.0.0" }, "network.podCIDR must be an IPv4 network"},
		{"pod CIDR IPv6", func(tc *v1.TenantCluster) { tc.Spec.Network.PodCIDR = "fd00::/64" }, "network.podCIDR must be an IPv4 network"},
		{"service CIDR too small", func(tc *v1.TenantCluster) { tc.Spec.Network.ServiceCIDR = "10.95.0.0/28" }, "network.serviceCIDR must be an IPv4 network of /24 or larger"},
		{"CIDRs overlap", func(tc *v1.TenantCluster) {
			tc.Spec.Network.PodCIDR, tc.Spec.Network.ServiceCIDR = "10.0.0.0/8", "10.95.0.0/16"
		}, "network.podCIDR and network.serviceCIDR overlap"},
		{"bad DNS domain", func(tc *v1.TenantCluster) { tc.Spec.Network.DNSDomain = "Cluster.Local." }, "network.dnsDomain must be a DNS domain"},
		{"duplicate group names", func(tc *v1.TenantCluster) { tc.Spec.NodeGroups[1].Name = "md0" }, `spec.nodeGroups[1]: Duplicate value: {"name":"md0"}`},
		{"bad group name", func(tc *v1.TenantCluster) { tc.Spec.NodeGroups[0].Name = "MD_0" }, "a node group name is lower-case letters, digits and dashes"},
		{"min without max", func(tc *v1.TenantCluster) { tc.Spec.NodeGroups[1].MaxReplicas = nil }, "set both minReplicas and maxReplicas to autoscale a node group, or neither"},
		{"min above max", func(tc *v1.TenantCluster) { tc.Spec.NodeGroups[1].MinReplicas = ptr.To[int32](5) }, "minReplicas must not be larger than maxReplicas"},
		{"replicas and autoscaling", func(tc *v1.TenantCluster) { tc.Spec.NodeGroups[1].Replicas = ptr.To[int32](1) }, "replicas is for fixed-size node groups"},
		{"too many replicas", func(tc *v1.TenantCluster) { tc.Spec.NodeGroups[0].Replicas = ptr.To[int32](1000) }, "should be less than or equal to 100"},
		{"negative replicas", func(tc *v1.TenantCluster) { tc.Spec.NodeGroups[0].Replicas = ptr.To[int32](-1) }, "should be greater than or equal to 0"},
		{"instance type and resources", func(tc *v1.TenantCluster) { tc.Spec.NodeGroups[0].InstanceType = "u1.large" }, "either an instanceType or resources"},
		{"neither instance type nor resources", func(tc *v1.TenantCluster) { tc.Spec.NodeGroups[0].Resources = nil }, "either an instanceType or resources"},
		{"no CPUs", func(tc *v1.TenantCluster) { tc.Spec.NodeGroups[0].Resources.CPU = 0 }, "should be greater than or equal to 1"},
		{"tiny memory", func(tc *v1.TenantCluster) { tc.Spec.NodeGroups[0].Resources.Memory = "512Mi" }, "resources.memory must be between 1Gi and 1Ti"},
		{"memory not a size", func(tc *v1.TenantCluster) { tc.Spec.NodeGroups[0].Resources.Memory = "lots" }, "resources.memory must be between 1Gi and 1Ti"},
		{"tiny disk", func(tc *v1.TenantCluster) { tc.Spec.NodeGroups[0].DiskSize = "1Gi" }, "diskSize must be a size between 5Gi and 2Ti"},
		{"huge disk", func(tc *v1.TenantCluster) { tc.Spec.NodeGroups[0].DiskSize = "10Ti" }, "diskSize must be a size between 5Gi and 2Ti"},
		{"url and registry", func(tc *v1.TenantCluster) {
			tc.Spec.NodeGroups[0].Image = v1.ImageSource{URL: "https://images.example.com/u.qcow2", Registry: "docker://quay.io/x:1"}
		}, "image takes a url or a registry, not both"},
		{"image url not http", func(tc *v1.TenantCluster) { tc.Spec.NodeGroups[0].Image.URL = "ftp://images.example.com/u.qcow2" }, "image.url must be an http(s) URL"},
		{"registry without docker://", func(tc *v1.TenantCluster) { tc.Spec.NodeGroups[0].Image.Registry = "quay.io/x:1" }, "image.registry must be a docker://"},
		{"bad label key", func(tc *v1.TenantCluster) { tc.Spec.NodeGroups[0].Labels = map[string]string{"bad key": "x"} }, "labels keys must be Kubernetes label keys"},
		{"bad taint effect", func(tc *v1.TenantCluster) { tc.Spec.NodeGroups[1].Taints[0].Effect = "Sometimes" }, "taints need an effect: NoSchedule, PreferNoSchedule or NoExecute"},
		{"autoscaled group without the autoscaler", func(tc *v1.TenantCluster) { tc.Spec.Addons.ClusterAutoscaler.Enabled = ptr.To(false) }, "enable the clusterAutoscaler add-on"},
		{"too many node groups", func(tc *v1.TenantCluster) {
			for i := range 16 {
				tc.Spec.NodeGroups = append(tc.Spec.NodeGroups, v1.NodeGroup{Name: fmt.Sprintf("g%d", i), InstanceType: "u1.small"})
			}
		}, "must have at most 16 items"},
		{"empty storage class", func(tc *v1.TenantCluster) { tc.Spec.StorageClass = "" }, ""}, // defaulted, accepted
	}
	for i, tt := range creates {
		t.Run("create/"+tt.name, func(t *testing.T) {
			tc := valid(fmt.Sprintf("c%d", i))
			tt.edit(tc)
			err := c.Create(ctx, tc)
			if tt.want == "" {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("err = %v\nwant it to contain %q", err, tt.want)
			}
		})
	}

	// Version moves, from v1.35.2: each step from the previous state.
	tc := valid("upgrades")
	tc.Spec.Version = "v1.35.2"
	if err := c.Create(ctx, tc); err != nil {
		t.Fatal(err)
	}
	steps := []struct {
		version, want string
	}{
		{"v1.37.0", "version can move up one minor release at a time"},
		{"v1.34.9", "version cannot go back to an older minor release"},
		{"v1.35.1", "version cannot go back to an older patch release"},
		{"v1.35.3", ""},
		{"v1.36.0", ""},
		{"v1.35.3", "version cannot go back to an older minor release"},
		{"v1.37.2", ""},
	}
	for _, s := range steps {
		t.Run("upgrade/to "+s.version, func(t *testing.T) {
			tc.Spec.Version = s.version
			err := c.Update(ctx, tc)
			check(t, err, s.want)
			if err != nil {
				if err := c.Get(ctx, client.ObjectKeyFromObject(tc), tc); err != nil {
					t.Fatal(err)
				}
			}
		})
	}

	immutables := []struct {
		name string
		edit func(*v1.TenantCluster)
		want string
	}{
		{"pod CIDR", func(tc *v1.TenantCluster) { tc.Spec.Network.PodCIDR = "10.200.0.0/16" }, "network.podCIDR cannot change after creation"},
		{"service CIDR", func(tc *v1.TenantCluster) { tc.Spec.Network.ServiceCIDR = "10.201.0.0/16" }, "network.serviceCIDR cannot change after creation"},
		{"DNS domain", func(tc *v1.TenantCluster) { tc.Spec.Network.DNSDomain = "tenant.local" }, "network.dnsDomain cannot change after creation"},
		{"storage class", func(tc *v1.TenantCluster) { tc.Spec.StorageClass = "local" }, "storageClass cannot change"},
		{"scale a group", func(tc *v1.TenantCluster) { tc.Spec.NodeGroups[0].Replicas = ptr.To[int32](5) }, ""},
		{"add a group", func(tc *v1.TenantCluster) {
			tc.Spec.NodeGroups = append(tc.Spec.NodeGroups, v1.NodeGroup{Name: "md1", InstanceType: "u1.medium"})
		}, ""},
	}
	for _, tt := range immutables {
		t.Run("update/"+tt.name, func(t *testing.T) {
			cur := &v1.TenantCluster{}
			if err := c.Get(ctx, client.ObjectKeyFromObject(tc), cur); err != nil {
				t.Fatal(err)
			}
			tt.edit(cur)
			check(t, c.Update(ctx, cur), tt.want)
		})
	}
}

func check(t *testing.T, err error, want string) {
	t.Helper()
	if want == "" {
		if err != nil {
			t.Fatalf("refused: %v", err)
		}
		return
	}
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("err = %v\nwant it to contain %q", err, want)
	}
}
