package v1alpha1

import (
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// SupportedVersions are the Kubernetes minors a tenant cluster can run;
// the CRD's version rule lists the same ones.
var SupportedVersions = []string{"v1.34", "v1.35", "v1.36", "v1.37"}

// CheckVersion says why v is not a version a TenantCluster accepts, in
// the CRD rule's words, for callers outside the API server (the rule
// itself is the CRD's; TestCheckVersionMatchesCRD keeps them together).
func CheckVersion(v string) error {
	minor, patch, ok := strings.Cut(strings.TrimPrefix(v, "v"), ".")
	if ok {
		minor, patch, ok = strings.Cut(patch, ".")
		minor = "v1." + minor
	}
	if !ok || !strings.HasPrefix(v, "v1.") || !slices.Contains(SupportedVersions, minor) || !validPatch(patch) {
		return fmt.Errorf("version %q must be a supported Kubernetes release, %s.x to %s.x, e.g. %s.2",
			v, SupportedVersions[0], SupportedVersions[len(SupportedVersions)-1], SupportedVersions[len(SupportedVersions)-1])
	}
	return nil
}

// validPatch: 0, or 1 to 99 without a leading zero, as the CRD's rule.
func validPatch(p string) bool {
	if p == "0" {
		return true
	}
	if len(p) == 0 || len(p) > 2 || p[0] == '0' {
		return false
	}
	for _, c := range p {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}

// TenantCluster is a tenant's Kubernetes cluster: a Kamaji control plane
// in the management cluster and KubeVirt VMs as workers.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=tc,categories=cozy
// +kubebuilder:printcolumn:name="Version",type=string,JSONPath=`.spec.version`
// +kubebuilder:printcolumn:name="Phase",type=string,JSONPath=`.status.phase`
// +kubebuilder:printcolumn:name="Workers",type=string,JSONPath=`.status.workers`,description="ready/desired worker nodes"
// +kubebuilder:printcolumn:name="Endpoint",type=string,JSONPath=`.status.endpoint`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
// +kubebuilder:validation:XValidation:rule="size(self.metadata.name) <= 40",message="the name of a TenantCluster is at most 40 characters: it prefixes the names of its Cluster API objects"
type TenantCluster struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// +required
	Spec   TenantClusterSpec   `json:"spec"`
	Status TenantClusterStatus `json:"status,omitempty"`
}

// TenantClusterSpec is what the tenant asks for.
//
// +kubebuilder:validation:XValidation:rule="!has(self.nodeGroups) || !self.nodeGroups.exists(g, has(g.minReplicas)) || !has(self.addons) || !has(self.addons.clusterAutoscaler) || !has(self.addons.clusterAutoscaler.enabled) || self.addons.clusterAutoscaler.enabled",message="node groups with minReplicas/maxReplicas are autoscaled: enable the clusterAutoscaler add-on, or give them a fixed replicas count"
// +kubebuilder:validation:XValidation:rule="!has(self.network) || !has(self.network.podCIDR) || !has(self.network.serviceCIDR) || !cidr(self.network.podCIDR).containsIP(cidr(self.network.serviceCIDR).ip()) && !cidr(self.network.serviceCIDR).containsIP(cidr(self.network.podCIDR).ip())",message="network.podCIDR and network.serviceCIDR overlap: pick two separate ranges"
type TenantClusterSpec struct {
	// Version is the Kubernetes release the cluster runs, e.g. v1.37.2.
	// It only moves forward, one minor at a time; the control plane is
	// upgraded first, then the node groups.
	//
	// +required
	// +kubebuilder:validation:MaxLength=16
	// +kubebuilder:validation:XValidation:rule="self.matches('^v1\\\\.(34|35|36|37)\\\\.(0|[1-9][0-9]?)$')",message="version must be a supported Kubernetes release, v1.34.x to v1.37.x, e.g. v1.37.2"
	// +kubebuilder:validation:XValidation:rule="!self.matches('^v1\\\\.[0-9]+\\\\.[0-9]+$') || !oldSelf.matches('^v1\\\\.[0-9]+\\\\.[0-9]+$') || int(self.split('.')[1]) >= int(oldSelf.split('.')[1])",message="version cannot go back to an older minor release"
	// +kubebuilder:validation:XValidation:rule="!self.matches('^v1\\\\.[0-9]+\\\\.[0-9]+$') || !oldSelf.matches('^v1\\\\.[0-9]+\\\\.[0-9]+$') || int(self.split('.')[1]) <= int(oldSelf.split('.')[1]) + 1",message="version can move up one minor release at a time (e.g. v1.35.x to v1.36.x, not to v1.37.x)"
	// +kubebuilder:validation:XValidation:rule="!self.matches('^v1\\\\.[0-9]+\\\\.[0-9]+$') || !oldSelf.matches('^v1\\\\.[0-9]+\\\\.[0-9]+$') || int(self.split('.')[1]) != int(oldSelf.split('.')[1]) || int(self.split('.')[2]) >= int(oldSelf.split('.')[2])",message="version cannot go back to an older patch release"
	Version string `json:"version"`

	// +optional
	// +kubebuilder:default={}
	ControlPlane ControlPlane `json:"controlPlane,omitzero"`

	// +optional
	// +kubebuilder:default={}
	Network Network `json:"network,omitzero"`

	// NodeGroups are the worker VMs, by group.
	//
	// +optional
	// +listType=map
	// +listMapKey=name
	// +kubebuilder:validation:MaxItems=16
	NodeGroups []NodeGroup `json:"nodeGroups,omitempty"`

	// +optional
	// +kubebuilder:default={}
	Addons Addons `json:"addons,omitzero"`

	// StorageClass of the management cluster that holds the workers' disks
	// and the tenant's persistent volumes (KubeVirt CSI). It cannot change.
	//
	// +optional
	// +kubebuilder:default=replicated
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="storageClass cannot change: the workers' disks and the tenant's volumes live in it"
	StorageClass string `json:"storageClass,omitempty"`
}

// ControlPlane is the tenant's Kamaji control plane.
//
// +kubebuilder:validation:XValidation:rule="!has(self.expose) || (has(self.expose.type) && self.expose.type == 'Ingress') == has(self.expose.host)",message="controlPlane.expose.host is required with type Ingress, and only then"
type ControlPlane struct {
	// Replicas of the API server, controller manager and scheduler.
	//
	// +optional
	// +kubebuilder:default=2
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=5
	Replicas int32 `json:"replicas,omitempty"`

	// DataStoreName is the Kamaji DataStore holding the tenant's state.
	//
	// +optional
	// +kubebuilder:default=default
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	DataStoreName string `json:"dataStoreName,omitempty"`

	// APIServerExtraArgs are passed to kube-apiserver as --name=value.
	//
	// +optional
	// +kubebuilder:validation:MaxProperties=32
	// +kubebuilder:validation:XValidation:rule="self.all(k, k.matches('^[a-z][a-z0-9-]*$') && size(k) <= 64)",message="controlPlane.apiServerExtraArgs keys are flag names without dashes, e.g. audit-log-maxage"
	// +kubebuilder:validation:XValidation:rule="!self.exists(k, k in ['etcd-servers', 'etcd-cafile', 'etcd-certfile', 'etcd-keyfile', 'service-account-key-file', 'service-account-signing-key-file', 'client-ca-file', 'tls-cert-file', 'tls-private-key-file', 'secure-port', 'service-cluster-ip-range'])",message="controlPlane.apiServerExtraArgs cannot set flags Kamaji manages (etcd, certificates, ports, service range)"
	APIServerExtraArgs map[string]string `json:"apiServerExtraArgs,omitempty"`

	// Konnectivity tunnels API server to kubelet traffic through the
	// workers' own connection, needed when the control plane cannot reach
	// the VMs directly.
	//
	// +optional
	// +kubebuilder:default=true
	Konnectivity *bool `json:"konnectivity,omitempty"`

	// +optional
	// +kubebuilder:default={type: LoadBalancer}
	Expose Expose `json:"expose,omitzero"`
}

// ExposeType says how the tenant's API server is reached.
//
// +kubebuilder:validation:Enum=ClusterIP;LoadBalancer;Ingress
type ExposeType string

const (
	ExposeClusterIP    ExposeType = "ClusterIP"
	ExposeLoadBalancer ExposeType = "LoadBalancer"
	ExposeIngress      ExposeType = "Ingress"
)

// Expose is how the tenant's API server is reached from outside the
// management cluster.
type Expose struct {
	// +optional
	// +kubebuilder:default=LoadBalancer
	Type ExposeType `json:"type,omitempty"`

	// Host is the DNS name of the ingress (type Ingress only), which
	// passes TLS through to the API server.
	//
	// +optional
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:XValidation:rule="self.matches('^([a-z0-9]([-a-z0-9]*[a-z0-9])?\\\\.)+[a-z]{2,}$')",message="controlPlane.expose.host must be a DNS name such as api.tenant1.example.com"
	Host string `json:"host,omitempty"`

	// IngressClassName picks the ingress controller (type Ingress).
	//
	// +optional
	// +kubebuilder:validation:MaxLength=253
	IngressClassName string `json:"ingressClassName,omitempty"`
}

// Network is the tenant cluster's own networks, inside its VMs; none can
// change after creation.
type Network struct {
	// +optional
	// +kubebuilder:default="10.243.0.0/16"
	// +kubebuilder:validation:MaxLength=43
	// +kubebuilder:validation:XValidation:rule="isCIDR(self) && cidr(self).ip().family() == 4 && cidr(self).prefixLength() <= 24",message="network.podCIDR must be an IPv4 network of /24 or larger, e.g. 10.243.0.0/16"
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="network.podCIDR cannot change after creation"
	PodCIDR string `json:"podCIDR,omitempty"`

	// +optional
	// +kubebuilder:default="10.95.0.0/16"
	// +kubebuilder:validation:MaxLength=43
	// +kubebuilder:validation:XValidation:rule="isCIDR(self) && cidr(self).ip().family() == 4 && cidr(self).prefixLength() <= 24",message="network.serviceCIDR must be an IPv4 network of /24 or larger, e.g. 10.95.0.0/16"
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="network.serviceCIDR cannot change after creation"
	ServiceCIDR string `json:"serviceCIDR,omitempty"`

	// +optional
	// +kubebuilder:default="cluster.local"
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:XValidation:rule="self.matches('^([a-z0-9]([-a-z0-9]*[a-z0-9])?\\\\.)*[a-z0-9]([-a-z0-9]*[a-z0-9])?$')",message="network.dnsDomain must be a DNS domain such as cluster.local"
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="network.dnsDomain cannot change after creation"
	DNSDomain string `json:"dnsDomain,omitempty"`
}

// NodeGroup is a set of identical worker VMs: a fixed number (replicas)
// or autoscaled between minReplicas and maxReplicas.
//
// +kubebuilder:validation:XValidation:rule="has(self.minReplicas) == has(self.maxReplicas)",message="set both minReplicas and maxReplicas to autoscale a node group, or neither"
// +kubebuilder:validation:XValidation:rule="!has(self.minReplicas) || !has(self.maxReplicas) || self.minReplicas <= self.maxReplicas",message="minReplicas must not be larger than maxReplicas"
// +kubebuilder:validation:XValidation:rule="!(has(self.replicas) && has(self.minReplicas))",message="replicas is for fixed-size node groups; an autoscaled one has minReplicas and maxReplicas only"
// +kubebuilder:validation:XValidation:rule="has(self.instanceType) != has(self.resources)",message="give a node group either an instanceType or resources (cpu and memory), not both"
type NodeGroup struct {
	// Name of the group, part of its VMs' names.
	//
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=20
	// +kubebuilder:validation:XValidation:rule="self.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?$')",message="a node group name is lower-case letters, digits and dashes, e.g. md0"
	Name string `json:"name"`

	// Replicas of a fixed-size group (default 1 unless autoscaled).
	//
	// +optional
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=100
	Replicas *int32 `json:"replicas,omitempty"`

	// +optional
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=100
	MinReplicas *int32 `json:"minReplicas,omitempty"`

	// +optional
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=100
	MaxReplicas *int32 `json:"maxReplicas,omitempty"`

	// InstanceType is a KubeVirt VirtualMachineClusterInstancetype name.
	//
	// +optional
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	InstanceType string `json:"instanceType,omitempty"`

	// +optional
	Resources *Resources `json:"resources,omitempty"`

	// DiskSize of each VM's root disk.
	//
	// +optional
	// +kubebuilder:default="20Gi"
	// +kubebuilder:validation:MaxLength=16
	// +kubebuilder:validation:XValidation:rule="isQuantity(self) && quantity(self).compareTo(quantity('5Gi')) >= 0 && quantity(self).compareTo(quantity('2Ti')) <= 0",message="diskSize must be a size between 5Gi and 2Ti, e.g. 20Gi"
	DiskSize string `json:"diskSize,omitempty"`

	// StorageClass of the VMs' disks; default the cluster's storageClass.
	//
	// +optional
	// +kubebuilder:validation:MaxLength=253
	StorageClass string `json:"storageClass,omitempty"`

	// +optional
	Image ImageSource `json:"image,omitzero"`

	// GPUs passed through to each VM.
	//
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=8
	GPUs []GPU `json:"gpus,omitempty"`

	// Labels of the group's Kubernetes nodes.
	//
	// +optional
	// +kubebuilder:validation:MaxProperties=32
	// +kubebuilder:validation:XValidation:rule="self.all(k, size(k) <= 317 && k.matches('^([a-z0-9.-]+/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$'))",message="labels keys must be Kubernetes label keys, e.g. example.com/role"
	Labels map[string]string `json:"labels,omitempty"`

	// Taints of the group's Kubernetes nodes.
	//
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=16
	// +kubebuilder:validation:XValidation:rule="self.all(t, has(t.effect) && t.effect in ['NoSchedule', 'PreferNoSchedule', 'NoExecute'])",message="taints need an effect: NoSchedule, PreferNoSchedule or NoExecute"
	Taints []corev1.Taint `json:"taints,omitempty"`
}

// Resources sizes a VM without an instance type.
type Resources struct {
	// +required
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=128
	CPU int32 `json:"cpu"`

	// +required
	// +kubebuilder:validation:MaxLength=16
	// +kubebuilder:validation:XValidation:rule="isQuantity(self) && quantity(self).compareTo(quantity('1Gi')) >= 0 && quantity(self).compareTo(quantity('1Ti')) <= 0",message="resources.memory must be between 1Gi and 1Ti, e.g. 4Gi"
	Memory string `json:"memory"`
}

// ImageSource is where a node group's VM disk image comes from: a
// container disk registry or an HTTP URL (CDI imports either); empty
// means Cozy's default image for the cluster's version.
//
// +kubebuilder:validation:XValidation:rule="!(has(self.url) && has(self.registry))",message="image takes a url or a registry, not both"
type ImageSource struct {
	// +optional
	// +kubebuilder:validation:MaxLength=2048
	// +kubebuilder:validation:XValidation:rule="isURL(self) && (url(self).getScheme() == 'https' || url(self).getScheme() == 'http')",message="image.url must be an http(s) URL of a disk image"
	URL string `json:"url,omitempty"`

	// Registry is a container disk reference, docker://host/repo:tag.
	//
	// +optional
	// +kubebuilder:validation:MaxLength=1024
	// +kubebuilder:validation:XValidation:rule="self.startsWith('docker://')",message="image.registry must be a docker://host/repository:tag reference"
	Registry string `json:"registry,omitempty"`
}

// GPU is a device passed through to a VM.
type GPU struct {
	// DeviceName as KubeVirt's permittedHostDevices names it, e.g.
	// nvidia.com/GA102GL_A10.
	//
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	DeviceName string `json:"deviceName"`
}

// Addons are what Cozy installs for the tenant; each is on unless
// enabled is false.
type Addons struct {
	// CNI of the tenant cluster (Cilium).
	// +optional
	CNI Addon `json:"cni,omitzero"`
	// KubevirtCSI gives the tenant volumes from the management cluster's
	// storage class.
	// +optional
	KubevirtCSI Addon `json:"kubevirtCSI,omitzero"`
	// CloudControllerManager (KubeVirt's) initialises the tenant's nodes
	// and serves its LoadBalancer Services.
	// +optional
	CloudControllerManager Addon `json:"cloudControllerManager,omitzero"`
	// ClusterAutoscaler scales node groups with minReplicas/maxReplicas.
	// +optional
	ClusterAutoscaler Addon `json:"clusterAutoscaler,omitzero"`
	// MetricsServer serves the tenant's resource metrics.
	// +optional
	MetricsServer Addon `json:"metricsServer,omitzero"`
}

// Addon toggles one add-on and overrides its chart values.
type Addon struct {
	// +optional
	Enabled *bool `json:"enabled,omitempty"`

	// Values are merged over Cozy's values for the add-on's chart.
	//
	// +optional
	// +kubebuilder:pruning:PreserveUnknownFields
	// +kubebuilder:validation:Schemaless
	// +kubebuilder:validation:Type=object
	Values *apiextensionsv1.JSON `json:"values,omitempty"`
}

// IsEnabled is the add-on's toggle with its default (on).
func (a Addon) IsEnabled() bool { return a.Enabled == nil || *a.Enabled }

// Phase summarises the cluster's state for people.
//
// +kubebuilder:validation:Enum=Provisioning;Ready;Upgrading;Degraded;Deleting
type Phase string

const (
	PhaseProvisioning Phase = "Provisioning"
	PhaseReady        Phase = "Ready"
	PhaseUpgrading    Phase = "Upgrading"
	PhaseDegraded     Phase = "Degraded"
	PhaseDeleting     Phase = "Deleting"
)

// Condition types of a TenantCluster.
const (
	ConditionControlPlaneReady = "ControlPlaneReady"
	ConditionWorkersReady      = "WorkersReady"
	ConditionAddonsReady       = "AddonsReady"
	ConditionReady             = "Ready"
)

// TenantClusterStatus is what the operator observed.
type TenantClusterStatus struct {
	// ObservedGeneration is the spec generation this status describes.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`

	// +optional
	Phase Phase `json:"phase,omitempty"`

	// Version the control plane runs.
	// +optional
	Version string `json:"version,omitempty"`

	// Endpoint of the tenant's API server.
	// +optional
	Endpoint string `json:"endpoint,omitempty"`

	// ReadyWorkers and DesiredWorkers count the worker nodes of every
	// group; Workers is "ready/desired" for the printer column.
	// +optional
	ReadyWorkers int32 `json:"readyWorkers,omitempty"`
	// +optional
	DesiredWorkers int32 `json:"desiredWorkers,omitempty"`
	// +optional
	Workers string `json:"workers,omitempty"`

	// KubeconfigSecretRef names the Secret (key "value") holding the
	// tenant's admin kubeconfig, in the TenantCluster's namespace.
	// +optional
	KubeconfigSecretRef *corev1.LocalObjectReference `json:"kubeconfigSecretRef,omitempty"`

	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// TenantClusterList is a list of TenantClusters.
//
// +kubebuilder:object:root=true
type TenantClusterList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []TenantCluster `json:"items"`
}
