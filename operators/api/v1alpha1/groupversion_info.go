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
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

var (
	// GroupVersion is the API's group and version.
	GroupVersion = schema.GroupVersion{Group: "tenancy.cozy.dev", Version: "v1alpha1"}

	// SchemeBuilder registers the types with a runtime.Scheme.
	SchemeBuilder = runtime.NewSchemeBuilder(addKnownTypes)

	// AddToScheme adds the types to a scheme.
	AddToScheme = SchemeBuilder.AddToScheme
)

func addKnownTypes(s *runtime.Scheme) error {
	s.AddKnownTypes(GroupVersion, &TenantCluster{}, &TenantClusterList{})
	metav1.AddToGroupVersion(s, GroupVersion)
	return nil
}
