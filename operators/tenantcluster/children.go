package tenantcluster

import (
	helmv2 "github.com/fluxcd/helm-controller/api/v2"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	bootstrapv1 "sigs.k8s.io/cluster-api/api/bootstrap/kubeadm/v1beta2"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
)

// How the controller reads a kind of child: typed or unstructured when
// it needs the status, only the metadata otherwise (a smaller cache).
type readAs int

const (
	readTyped readAs = iota
	readUnstructured
	readMetadata
)

// childKind is one kind of object a TenantCluster owns.
type childKind struct {
	GVK  schema.GroupVersionKind
	Read readAs
	// Stage is when the finalizer deletes it: workers (0), then the
	// Cluster with its control plane and infrastructure (1), then
	// templates and add-ons (2).
	Stage int
	// Template kinds are immutable and named by content; an old one is
	// kept while a MachineSet still refers to it.
	Template bool
}

var (
	gvkCluster           = clusterv1.GroupVersion.WithKind("Cluster")
	gvkMachineDeployment = clusterv1.GroupVersion.WithKind("MachineDeployment")
	gvkMachineHealth     = clusterv1.GroupVersion.WithKind("MachineHealthCheck")
	gvkKamaji            = schema.GroupVersionKind{Group: kamajiGroup, Version: kamajiVersion, Kind: kindKamajiCP}
	gvkKubevirtCluster   = schema.GroupVersionKind{Group: capkGroup, Version: capkVersion, Kind: kindKubevirtCluster}
	gvkKubevirtTemplate  = schema.GroupVersionKind{Group: capkGroup, Version: capkVersion, Kind: kindKubevirtTemplate}
	gvkKubeadmTemplate   = bootstrapv1.GroupVersion.WithKind(kindKubeadmTemplate)
	gvkHelmRelease       = helmv2.GroupVersion.WithKind(helmv2.HelmReleaseKind)
	gvkDeployment        = appsv1.SchemeGroupVersion.WithKind("Deployment")
)

// childKinds are every kind a TenantCluster can own, in apply order.
var childKinds = []childKind{
	{GVK: gvkKubevirtCluster, Read: readMetadata, Stage: 1},
	{GVK: gvkKamaji, Read: readUnstructured, Stage: 1},
	{GVK: gvkCluster, Read: readTyped, Stage: 1},
	{GVK: gvkKubevirtTemplate, Read: readMetadata, Stage: 2, Template: true},
	{GVK: gvkKubeadmTemplate, Read: readMetadata, Stage: 2, Template: true},
	{GVK: gvkMachineDeployment, Read: readTyped, Stage: 0},
	{GVK: gvkMachineHealth, Read: readMetadata, Stage: 0},
	{GVK: gvkHelmRelease, Read: readTyped, Stage: 2},
	{GVK: corev1.SchemeGroupVersion.WithKind("ServiceAccount"), Read: readMetadata, Stage: 2},
	{GVK: corev1.SchemeGroupVersion.WithKind("ConfigMap"), Read: readMetadata, Stage: 2},
	{GVK: rbacv1.SchemeGroupVersion.WithKind("Role"), Read: readMetadata, Stage: 2},
	{GVK: rbacv1.SchemeGroupVersion.WithKind("RoleBinding"), Read: readMetadata, Stage: 2},
	{GVK: gvkDeployment, Read: readTyped, Stage: 2},
}

func kindOf(gvk schema.GroupVersionKind) (childKind, bool) {
	for _, k := range childKinds {
		if k.GVK == gvk {
			return k, true
		}
	}
	return childKind{}, false
}
