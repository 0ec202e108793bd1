// Package v1alpha1 is the tenancy.cozy.dev/v1alpha1 API: TenantCluster, a
// tenant's Kubernetes cluster with a Kamaji control plane and KubeVirt
// worker VMs, which cozy-operator turns into Cluster API objects.
//
// Validation lives in the CRD (OpenAPI and CEL rules from the markers
// below), so the API server refuses a bad spec with a message before any
// controller sees it.
//
// +kubebuilder:object:generate=true
// +groupName=tenancy.cozy.dev
package v1alpha1

import (
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/scheme"
)

var (
	// GroupVersion is the API's group and version.
	GroupVersion = schema.GroupVersion{Group: "tenancy.cozy.dev", Version: "v1alpha1"}

	// SchemeBuilder registers the types with a runtime.Scheme.
	SchemeBuilder = &scheme.Builder{GroupVersion: GroupVersion}

	// AddToScheme adds the types to a scheme.
	AddToScheme = SchemeBuilder.AddToScheme
)

func init() {
	SchemeBuilder.Register(&TenantCluster{}, &TenantClusterList{})
}
