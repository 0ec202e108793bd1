// Package tenantcluster holds cozy-operator's TenantCluster controller.
// This file is its pure core: builders that compute, from a
// TenantCluster, the Cluster API objects it should own (Cluster, Kamaji
// control plane, KubeVirt cluster, and per node group a machine template,
// a kubeadm config template, a MachineDeployment and a
// MachineHealthCheck). They read nothing but their arguments, so golden
// files pin what they produce.
package tenantcluster

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"

	"github.com/siderolabs/talos/pkg/machinery/constants"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	kubevirtv1 "kubevirt.io/api/core/v1"
	cdiv1 "kubevirt.io/containerized-data-importer-api/pkg/apis/core/v1beta1"
	bootstrapv1 "sigs.k8s.io/cluster-api/api/bootstrap/kubeadm/v1beta2"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	"cozy.dev/cozy/internal/imageref"
	v1 "cozy.dev/cozy/operators/api/v1alpha1"
)

// Labels on every child, so the controller finds its own.
const (
	LabelTenantCluster = "tenancy.cozy.dev/tenant-cluster"
	LabelNodeGroup     = "tenancy.cozy.dev/node-group"
)

// API groups and kinds of the providers Cozy does not import as Go
// packages (their modules do not build against CAPI v1.14; DESIGN.md).
const (
	kamajiGroup          = "controlplane.cluster.x-k8s.io"
	kamajiVersion        = "v1alpha2"
	kindKamajiCP         = "KamajiControlPlane"
	capkGroup            = "infrastructure.cluster.x-k8s.io"
	capkVersion          = "v1alpha1"
	kindKubevirtCluster  = "KubevirtCluster"
	kindKubevirtTemplate = "KubevirtMachineTemplate"
	kindKubeadmTemplate  = "KubeadmConfigTemplate"
)

// Autoscaler annotations (cluster-autoscaler's clusterapi provider).
const (
	annotationMinSize  = "cluster.x-k8s.io/cluster-api-autoscaler-node-group-min-size"
	annotationMaxSize  = "cluster.x-k8s.io/cluster-api-autoscaler-node-group-max-size"
	annotationCapacity = "capacity.cluster-autoscaler.kubernetes.io/"
)

// Children are a TenantCluster's desired Cluster API objects.
type Children struct {
	Cluster      *unstructured.Unstructured
	ControlPlane *unstructured.Unstructured
	Infra        *unstructured.Unstructured
	Groups       []GroupChildren
}

// GroupChildren are one node group's objects.
type GroupChildren struct {
	Name               string
	MachineTemplate    *unstructured.Unstructured
	BootstrapTemplate  *unstructured.Unstructured
	MachineDeployment  *unstructured.Unstructured
	MachineHealthCheck *unstructured.Unstructured
}

// All lists the objects in the order they are applied: templates before
// what refers to them.
func (c Children) All() []*unstructured.Unstructured {
	out := []*unstructured.Unstructured{c.Infra, c.ControlPlane, c.Cluster}
	for _, g := range c.Groups {
		out = append(out, g.MachineTemplate, g.BootstrapTemplate, g.MachineDeployment, g.MachineHealthCheck)
	}
	return out
}

// Desired builds every child, the control plane at the TenantCluster's
// version and the node groups at workerVersion.
func Desired(tc *v1.TenantCluster, workerVersion string, w WorkerImages) (Children, error) {
	return DesiredAt(tc, Versions{ControlPlane: tc.Spec.Version, Groups: map[string]string{newGroupKey: workerVersion}}, w)
}

// DesiredAt builds every child at the versions plan chose: during an
// upgrade the controller holds the node groups at their old version until
// the control plane has finished. A node group that names no image boots
// w's for its version.
func DesiredAt(tc *v1.TenantCluster, v Versions, w WorkerImages) (Children, error) {
	dns, err := dnsServiceIP(tc.Spec.Network.ServiceCIDR)
	if err != nil {
		return Children{}, err
	}
	c := Children{
		Cluster:      desiredCluster(tc),
		ControlPlane: desiredKamajiControlPlane(tc, v.ControlPlane, dns),
		Infra:        desiredKubevirtCluster(tc),
	}
	for _, g := range tc.Spec.NodeGroups {
		version := v.Group(g.Name)
		mt, err := desiredMachineTemplate(tc, g, version, w)
		if err != nil {
			return Children{}, fmt.Errorf("node group %s: %w", g.Name, err)
		}
		bt := desiredBootstrapTemplate(tc, g, w)
		md, err := desiredMachineDeployment(tc, g, version, mt.GetName(), bt.GetName())
		if err != nil {
			return Children{}, fmt.Errorf("node group %s: %w", g.Name, err)
		}
		c.Groups = append(c.Groups, GroupChildren{
			Name: g.Name, MachineTemplate: mt, BootstrapTemplate: bt,
			MachineDeployment: md, MachineHealthCheck: desiredMachineHealthCheck(tc, g),
		})
	}
	return c, nil
}

// meta is the metadata every child shares: the TenantCluster's namespace,
// its labels, and the TenantCluster as controlling owner.
func meta(tc *v1.TenantCluster, name string, extra map[string]string) metav1.ObjectMeta {
	labels := map[string]string{
		clusterv1.ClusterNameLabel: tc.Name,
		LabelTenantCluster:         tc.Name,
	}
	maps.Copy(labels, extra)
	return metav1.ObjectMeta{
		Name:      name,
		Namespace: tc.Namespace,
		Labels:    labels,
		OwnerReferences: []metav1.OwnerReference{{
			APIVersion:         v1.GroupVersion.String(),
			Kind:               "TenantCluster",
			Name:               tc.Name,
			UID:                tc.UID,
			Controller:         ptr.To(true),
			BlockOwnerDeletion: ptr.To(true),
		}},
	}
}

func groupLabels(g v1.NodeGroup) map[string]string {
	return map[string]string{LabelNodeGroup: g.Name}
}

func toUnstructured(obj runtime.Object, apiVersion, kind string) *unstructured.Unstructured {
	m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(obj)
	if err != nil {
		panic(fmt.Sprintf("convert %s: %v", kind, err)) // our own types: cannot fail
	}
	delete(m, "status")
	unstructured.RemoveNestedField(m, "metadata", "creationTimestamp")
	u := &unstructured.Unstructured{Object: m}
	u.SetAPIVersion(apiVersion)
	u.SetKind(kind)
	return u
}

func desiredCluster(tc *v1.TenantCluster) *unstructured.Unstructured {
	n := tc.Spec.Network
	cl := &clusterv1.Cluster{
		ObjectMeta: meta(tc, tc.Name, nil),
		Spec: clusterv1.ClusterSpec{
			ClusterNetwork: clusterv1.ClusterNetwork{
				Pods:          clusterv1.NetworkRanges{CIDRBlocks: []string{n.PodCIDR}},
				Services:      clusterv1.NetworkRanges{CIDRBlocks: []string{n.ServiceCIDR}},
				ServiceDomain: n.DNSDomain,
			},
			ControlPlaneRef:   clusterv1.ContractVersionedObjectReference{APIGroup: kamajiGroup, Kind: kindKamajiCP, Name: tc.Name},
			InfrastructureRef: clusterv1.ContractVersionedObjectReference{APIGroup: capkGroup, Kind: kindKubevirtCluster, Name: tc.Name},
		},
	}
	return toUnstructured(cl, clusterv1.GroupVersion.String(), "Cluster")
}

// desiredKamajiControlPlane: Kamaji runs the control plane as pods in the
// management cluster. No kube-proxy add-on (the tenant's Cilium replaces
// it); the API server reaches kubelets by internal address first, and the
// kubelets use the systemd cgroup driver, as the CAPK images do.
func desiredKamajiControlPlane(tc *v1.TenantCluster, version, dnsServiceIP string) *unstructured.Unstructured {
	cp := tc.Spec.ControlPlane
	u := &unstructured.Unstructured{}
	u.SetAPIVersion(kamajiGroup + "/" + kamajiVersion)
	u.SetKind(kindKamajiCP)
	setMeta(u, meta(tc, tc.Name, nil))

	// CoreDNS's Service at the tenth address of the service range, as
	// kubeadm puts it, named rather than left to Kamaji: v1.0.0 defaults
	// it to 10.96.0.10 whatever the range, and its webhook then refuses
	// the control plane (TestKamajiServesATenant); newer Kamaji computes
	// this same address.
	addons := map[string]any{"coreDNS": map[string]any{"dnsServiceIPs": []any{dnsServiceIP},
		"imageRepository": coreDNSRepository, "imageTag": CoreDNSVersion}}
	if cp.Konnectivity == nil || *cp.Konnectivity {
		addons["konnectivity"] = konnectivityAddon()
	}
	network := map[string]any{"serviceType": string(cp.Expose.Type)}
	if cp.Expose.Type == v1.ExposeIngress {
		// Kamaji's ingress mode puts a ClusterIP Service behind the host.
		network["serviceType"] = string(v1.ExposeClusterIP)
		ingress := map[string]any{"hostname": cp.Expose.Host}
		if cp.Expose.IngressClassName != "" {
			ingress["className"] = cp.Expose.IngressClassName
		}
		network["ingress"] = ingress
		network["certSANs"] = []any{cp.Expose.Host}
	}
	spec := map[string]any{
		"version":       version,
		"replicas":      int64(cp.Replicas),
		"dataStoreName": cp.DataStoreName,
		"addons":        addons,
		"network":       network,
		"kubelet": map[string]any{
			"cgroupfs":              "systemd",
			"preferredAddressTypes": []any{"InternalIP", "ExternalIP", "Hostname"},
		},
	}
	if args := extraArgs(cp.APIServerExtraArgs); len(args) > 0 {
		spec["apiServer"] = map[string]any{"extraArgs": args}
	}
	u.Object["spec"] = spec
	return u
}

// Konnectivity: its server runs beside each tenant API server (Kamaji
// puts it in the control-plane pod) and its agent on every worker.
// Pinned, not left to Kamaji: v1.0.0 defaults to v0.0.32, whose module
// the proxy refuses, and newer Kamaji derives a version from the
// tenant's, which a mirror cannot know before the tenant exists; the
// images must be in an air-gapped rack's mirror (`images list` names
// them, hack/kamaji.sh builds them). One version for every tenant: its
// server serves a v1.30 API server (TestKamajiServesATenant), and the
// protocol an API server speaks to it (konnectivity-client's
// client.proto) gained only a message between server and agent (DRAIN)
// from v1.30's client (v0.29.0) to v1.36's (v0.34.0).
const (
	KonnectivityVersion     = "v0.34.0"
	KonnectivityServerImage = "registry.k8s.io/kas-network-proxy/proxy-server"
	KonnectivityAgentImage  = "registry.k8s.io/kas-network-proxy/proxy-agent"
	konnectivityPort        = 8132
)

// The CoreDNS every tenant runs (Kamaji's CoreDNS add-on): the version
// the management cluster's own Talos runs (its DefaultCoreDNSVersion), so
// that one image in the rack's mirror serves both and `images list` can
// name it. Left to Kamaji, it would be its kubeadm library's choice
// (v1.11.1 for Kamaji v1.0.0), which no mirror Cozy fills holds. The
// repository is named too: Kamaji v1.0.0 takes the tag only with it, and
// kubeadm, which Kamaji renders the add-on with, appends the image's name
// (registry.k8s.io/coredns + coredns).
const (
	CoreDNSImage      = coreDNSRepository + "/coredns"
	CoreDNSVersion    = constants.DefaultCoreDNSVersion
	coreDNSRepository = "registry.k8s.io/coredns"
)

// konnectivityAddon is the KamajiControlPlane's konnectivity add-on. Its
// port is named because the CRD defaults it only when the whole server
// block is left out. The agent tolerates every taint: without it on a
// Node, the tenant's API server reaches no kubelet there (no logs, exec,
// port-forward or metrics), and a node group's own taints, or the ones a
// Node carries until it is initialised, would keep it off (Kamaji's
// default tolerates CriticalAddonsOnly alone).
func konnectivityAddon() map[string]any {
	return map[string]any{
		"server": map[string]any{"image": KonnectivityServerImage, "version": KonnectivityVersion, "port": int64(konnectivityPort)},
		"agent": map[string]any{"image": KonnectivityAgentImage, "version": KonnectivityVersion,
			"tolerations": []any{map[string]any{"operator": "Exists"}}},
	}
}

// dnsServiceIP is the tenth address of the service range cidr, which
// the TenantCluster's schema holds to an IPv4 network of /24 or larger.
func dnsServiceIP(cidr string) (string, error) {
	p, err := netip.ParsePrefix(cidr)
	if err != nil || !p.Addr().Is4() || p.Bits() > 24 {
		return "", fmt.Errorf("network.serviceCIDR %q is not an IPv4 network of /24 or larger", cidr)
	}
	a := p.Masked().Addr().As4()
	a[3] += 10
	return netip.AddrFrom4(a).String(), nil
}

// extraArgs turns the map into --name=value flags, sorted for a stable
// output.
func extraArgs(m map[string]string) []any {
	var out []any
	for _, k := range slices.Sorted(maps.Keys(m)) {
		out = append(out, "--"+k+"="+m[k])
	}
	return out
}

// desiredKubevirtCluster: the infrastructure is the management cluster
// itself; Kamaji, not CAPK, serves the API endpoint, which the
// managed-by annotation tells CAPK.
func desiredKubevirtCluster(tc *v1.TenantCluster) *unstructured.Unstructured {
	u := &unstructured.Unstructured{}
	u.SetAPIVersion(capkGroup + "/" + capkVersion)
	u.SetKind(kindKubevirtCluster)
	m := meta(tc, tc.Name, nil)
	m.Annotations = map[string]string{clusterv1.ManagedByAnnotation: "kamaji"}
	setMeta(u, m)
	u.Object["spec"] = map[string]any{}
	return u
}

func setMeta(u *unstructured.Unstructured, m metav1.ObjectMeta) {
	mm, err := runtime.DefaultUnstructuredConverter.ToUnstructured(&m)
	if err != nil {
		panic(err)
	}
	delete(mm, "creationTimestamp")
	u.Object["metadata"] = mm
}

// hashName names an immutable template by its content, so a change makes
// a new template and the MachineDeployment rolls to it.
func hashName(base string, spec any) string {
	data, err := json.Marshal(spec)
	if err != nil {
		panic(err)
	}
	sum := sha256.Sum256(data)
	return base + "-" + hex.EncodeToString(sum[:])[:10]
}

func storageClass(tc *v1.TenantCluster, g v1.NodeGroup) string {
	if g.StorageClass != "" {
		return g.StorageClass
	}
	return tc.Spec.StorageClass
}

// diskImage is the group's root disk; the default image is Cozy's worker
// image for the version the group runs, which lags the TenantCluster's
// during an upgrade: the workers' VMs must not change while the control
// plane moves.
func diskImage(g v1.NodeGroup, version string, w WorkerImages) (cdiv1.DataVolumeSource, error) {
	switch {
	case g.Image.URL != "":
		return cdiv1.DataVolumeSource{HTTP: &cdiv1.DataVolumeSourceHTTP{URL: g.Image.URL}}, nil
	case g.Image.Registry != "":
		return cdiv1.DataVolumeSource{Registry: &cdiv1.DataVolumeSourceRegistry{URL: ptr.To(g.Image.Registry)}}, nil
	case w.Ref(version) == "":
		return cdiv1.DataVolumeSource{}, errors.New("no image: the group names none and there is no worker image repository")
	}
	return cdiv1.DataVolumeSource{Registry: &cdiv1.DataVolumeSourceRegistry{URL: ptr.To("docker://" + w.Ref(version))}}, nil
}

// vmSpec is a worker VM: always running, its root disk imported by CDI
// into the group's storage class (block, RWX, so it can live-migrate),
// bridged onto the pod network with KubeVirt's live-migration annotation,
// evicted by live migration.
func vmSpec(tc *v1.TenantCluster, g v1.NodeGroup, version string, w WorkerImages) (kubevirtv1.VirtualMachineSpec, error) {
	disk, err := resource.ParseQuantity(g.DiskSize)
	if err != nil {
		return kubevirtv1.VirtualMachineSpec{}, fmt.Errorf("diskSize %q: %w", g.DiskSize, err)
	}
	source, err := diskImage(g, version, w)
	if err != nil {
		return kubevirtv1.VirtualMachineSpec{}, err
	}
	const rootDisk = "root"
	spec := kubevirtv1.VirtualMachineSpec{
		RunStrategy: ptr.To(kubevirtv1.RunStrategyAlways),
		DataVolumeTemplates: []kubevirtv1.DataVolumeTemplateSpec{{
			ObjectMeta: metav1.ObjectMeta{Name: rootDisk},
			Spec: cdiv1.DataVolumeSpec{
				Source: &source,
				Storage: &cdiv1.StorageSpec{
					StorageClassName: ptr.To(storageClass(tc, g)),
					AccessModes:      []corev1.PersistentVolumeAccessMode{corev1.ReadWriteMany},
					VolumeMode:       ptr.To(corev1.PersistentVolumeBlock),
					Resources:        corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: disk}},
				},
			},
		}},
		Template: &kubevirtv1.VirtualMachineInstanceTemplateSpec{
			ObjectMeta: metav1.ObjectMeta{
				Labels:      map[string]string{LabelTenantCluster: tc.Name, LabelNodeGroup: g.Name},
				Annotations: map[string]string{kubevirtv1.AllowPodBridgeNetworkLiveMigrationAnnotation: "true"},
			},
			Spec: kubevirtv1.VirtualMachineInstanceSpec{
				EvictionStrategy: ptr.To(kubevirtv1.EvictionStrategyLiveMigrate),
				Domain: kubevirtv1.DomainSpec{
					Devices: kubevirtv1.Devices{
						Disks: []kubevirtv1.Disk{{Name: rootDisk, DiskDevice: kubevirtv1.DiskDevice{Disk: &kubevirtv1.DiskTarget{Bus: kubevirtv1.DiskBusVirtio}}}},
						Interfaces: []kubevirtv1.Interface{{
							Name:                   "default",
							InterfaceBindingMethod: kubevirtv1.InterfaceBindingMethod{Bridge: &kubevirtv1.InterfaceBridge{}},
						}},
					},
				},
				Networks: []kubevirtv1.Network{{Name: "default", NetworkSource: kubevirtv1.NetworkSource{Pod: &kubevirtv1.PodNetwork{}}}},
				Volumes: []kubevirtv1.Volume{{
					Name:         rootDisk,
					VolumeSource: kubevirtv1.VolumeSource{DataVolume: &kubevirtv1.DataVolumeSource{Name: rootDisk}},
				}},
			},
		},
	}
	for i, gpu := range g.GPUs {
		spec.Template.Spec.Domain.Devices.GPUs = append(spec.Template.Spec.Domain.Devices.GPUs,
			kubevirtv1.GPU{Name: fmt.Sprintf("gpu%d", i), DeviceName: gpu.DeviceName})
	}
	if g.InstanceType != "" {
		spec.Instancetype = &kubevirtv1.InstancetypeMatcher{Kind: "VirtualMachineClusterInstancetype", Name: g.InstanceType}
		return spec, nil
	}
	mem, err := resource.ParseQuantity(g.Resources.Memory)
	if err != nil {
		return kubevirtv1.VirtualMachineSpec{}, fmt.Errorf("resources.memory %q: %w", g.Resources.Memory, err)
	}
	spec.Template.Spec.Domain.CPU = &kubevirtv1.CPU{Cores: uint32(g.Resources.CPU)}
	spec.Template.Spec.Domain.Memory = &kubevirtv1.Memory{Guest: &mem}
	return spec, nil
}

func desiredMachineTemplate(tc *v1.TenantCluster, g v1.NodeGroup, version string, w WorkerImages) (*unstructured.Unstructured, error) {
	vm, err := vmSpec(tc, g, version, w)
	if err != nil {
		return nil, err
	}
	vmMap, err := runtime.DefaultUnstructuredConverter.ToUnstructured(&vm)
	if err != nil {
		return nil, err
	}
	spec := map[string]any{
		"template": map[string]any{
			"spec": map[string]any{
				"virtualMachineTemplate": map[string]any{"spec": vmMap},
				// Kamaji workers have no SSH key from CAPK.
				"virtualMachineBootstrapCheck": map[string]any{"checkStrategy": "none"},
			},
		},
	}
	u := &unstructured.Unstructured{}
	u.SetAPIVersion(capkGroup + "/" + capkVersion)
	u.SetKind(kindKubevirtTemplate)
	setMeta(u, meta(tc, hashName(tc.Name+"-"+g.Name, spec), groupLabels(g)))
	u.Object["spec"] = spec
	return u, nil
}

// desiredBootstrapTemplate: the kubeadm join of a worker. The kubelet
// leaves node initialisation to KubeVirt's cloud-controller-manager
// (cloud-provider: external) and carries the group's labels and taints;
// containerd pulls through the rack's mirrors, if it has any.
func desiredBootstrapTemplate(tc *v1.TenantCluster, g v1.NodeGroup, w WorkerImages) *unstructured.Unstructured {
	args := []bootstrapv1.Arg{{Name: "cloud-provider", Value: ptr.To("external")}}
	if len(g.Labels) > 0 {
		var labels []string
		for _, k := range slices.Sorted(maps.Keys(g.Labels)) {
			labels = append(labels, k+"="+g.Labels[k])
		}
		args = append(args, bootstrapv1.Arg{Name: "node-labels", Value: ptr.To(strings.Join(labels, ","))})
	}
	nr := bootstrapv1.NodeRegistrationOptions{KubeletExtraArgs: args}
	if len(g.Taints) > 0 {
		nr.Taints = ptr.To(slices.Clone(g.Taints))
	} else {
		nr.Taints = &[]corev1.Taint{} // no control-plane default taints on workers
	}
	spec := bootstrapv1.KubeadmConfigTemplateSpec{
		Template: bootstrapv1.KubeadmConfigTemplateResource{
			Spec: bootstrapv1.KubeadmConfigSpec{
				JoinConfiguration: bootstrapv1.JoinConfiguration{NodeRegistration: nr},
				Files:             mirrorFiles(w.Mirror, w.Mirrors),
			},
		},
	}
	t := &bootstrapv1.KubeadmConfigTemplate{
		ObjectMeta: meta(tc, hashName(tc.Name+"-"+g.Name, spec), groupLabels(g)),
		Spec:       spec,
	}
	return toUnstructured(t, bootstrapv1.GroupVersion.String(), kindKubeadmTemplate)
}

// mirrorFiles are containerd's hosts.toml, one per registry host the
// rack mirrors, as its Talos nodes' RegistryMirrorConfigs say it
// (bootstrap/talosconfig), sorted by host: for each host registries.mirror
// covers, the mirror's path already naming the registry (override_path);
// for each of registries.mirrors, its endpoints in order, containerd
// adding /v2/... ("*" is containerd's _default). Without them a worker on
// a rack without the internet pulls not even its pods' sandbox image.
// containerd reads /etc/containerd/certs.d at each pull, so writing them
// after it started is in time.
func mirrorFiles(mirror string, mirrors map[string][]string) []bootstrapv1.File {
	content := map[string]string{}
	if mirror != "" {
		for _, h := range imageref.MirrorHosts {
			content[h] = fmt.Sprintf("# the rack's registries.mirror, written by cozy-operator\n[host.%q]\n  capabilities = [\"pull\", \"resolve\"]\n  override_path = true\n",
				imageref.MirrorEndpoint(mirror, h))
		}
	}
	for h, endpoints := range mirrors {
		var b strings.Builder
		b.WriteString("# the rack's registries.mirrors, written by cozy-operator\n")
		for _, ep := range endpoints {
			fmt.Fprintf(&b, "[host.%q]\n  capabilities = [\"pull\", \"resolve\"]\n", ep)
		}
		if h == "*" {
			h = "_default"
		}
		content[h] = b.String()
	}
	var files []bootstrapv1.File
	for _, h := range slices.Sorted(maps.Keys(content)) {
		files = append(files, bootstrapv1.File{
			Path: "/etc/containerd/certs.d/" + h + "/hosts.toml", Owner: "root:root", Permissions: "0644",
			Content: content[h],
		})
	}
	return files
}

func desiredMachineDeployment(tc *v1.TenantCluster, g v1.NodeGroup, version, machineTemplate, bootstrapTemplate string) (*unstructured.Unstructured, error) {
	selector := map[string]string{clusterv1.ClusterNameLabel: tc.Name, LabelNodeGroup: g.Name}
	m := meta(tc, tc.Name+"-"+g.Name, groupLabels(g))
	md := &clusterv1.MachineDeployment{
		ObjectMeta: m,
		Spec: clusterv1.MachineDeploymentSpec{
			ClusterName: tc.Name,
			Selector:    metav1.LabelSelector{MatchLabels: selector},
			Template: clusterv1.MachineTemplateSpec{
				ObjectMeta: clusterv1.ObjectMeta{Labels: maps.Clone(selector)},
				Spec: clusterv1.MachineSpec{
					ClusterName: tc.Name,
					Version:     version,
					Bootstrap: clusterv1.Bootstrap{ConfigRef: clusterv1.ContractVersionedObjectReference{
						APIGroup: bootstrapv1.GroupVersion.Group, Kind: kindKubeadmTemplate, Name: bootstrapTemplate,
					}},
					InfrastructureRef: clusterv1.ContractVersionedObjectReference{
						APIGroup: capkGroup, Kind: kindKubevirtTemplate, Name: machineTemplate,
					},
				},
			},
			Rollout: clusterv1.MachineDeploymentRolloutSpec{Strategy: clusterv1.MachineDeploymentRolloutStrategy{
				Type: clusterv1.RollingUpdateMachineDeploymentStrategyType,
				RollingUpdate: clusterv1.MachineDeploymentRolloutStrategyRollingUpdate{
					MaxSurge:       ptr.To(intstr.FromInt32(1)),
					MaxUnavailable: ptr.To(intstr.FromInt32(0)),
				},
			}},
		},
	}
	if g.MinReplicas != nil {
		// The autoscaler owns replicas; the operator never sets them.
		md.Annotations = map[string]string{
			annotationMinSize: fmt.Sprint(*g.MinReplicas),
			annotationMaxSize: fmt.Sprint(*g.MaxReplicas),
		}
		// What one node brings, so the autoscaler can scale up from zero.
		if g.Resources != nil {
			md.Annotations[annotationCapacity+"cpu"] = fmt.Sprint(g.Resources.CPU)
			md.Annotations[annotationCapacity+"memory"] = g.Resources.Memory
		}
		md.Annotations[annotationCapacity+"ephemeral-disk"] = g.DiskSize
		if n := len(g.GPUs); n > 0 {
			md.Annotations[annotationCapacity+"gpu-count"] = fmt.Sprint(n)
		}
		if len(g.Labels) > 0 {
			var l []string
			for _, k := range slices.Sorted(maps.Keys(g.Labels)) {
				l = append(l, k+"="+g.Labels[k])
			}
			md.Annotations[annotationCapacity+"labels"] = strings.Join(l, ",")
		}
		if len(g.Taints) > 0 {
			var ts []string
			for _, t := range g.Taints {
				ts = append(ts, t.Key+"="+t.Value+":"+string(t.Effect))
			}
			md.Annotations[annotationCapacity+"taints"] = strings.Join(ts, ",")
		}
	} else {
		md.Spec.Replicas = ptr.To(ptr.Deref(g.Replicas, 1))
	}
	return toUnstructured(md, clusterv1.GroupVersion.String(), "MachineDeployment"), nil
}

// desiredMachineHealthCheck replaces a worker whose node never joins or
// stays NotReady/Unknown for five minutes.
func desiredMachineHealthCheck(tc *v1.TenantCluster, g v1.NodeGroup) *unstructured.Unstructured {
	mhc := &clusterv1.MachineHealthCheck{
		ObjectMeta: meta(tc, tc.Name+"-"+g.Name, groupLabels(g)),
		Spec: clusterv1.MachineHealthCheckSpec{
			ClusterName: tc.Name,
			Selector:    metav1.LabelSelector{MatchLabels: map[string]string{clusterv1.ClusterNameLabel: tc.Name, LabelNodeGroup: g.Name}},
			Checks: clusterv1.MachineHealthCheckChecks{
				NodeStartupTimeoutSeconds: ptr.To[int32](600),
				UnhealthyNodeConditions: []clusterv1.UnhealthyNodeCondition{
					{Type: corev1.NodeReady, Status: corev1.ConditionUnknown, TimeoutSeconds: ptr.To[int32](300)},
					{Type: corev1.NodeReady, Status: corev1.ConditionFalse, TimeoutSeconds: ptr.To[int32](300)},
				},
			},
		},
	}
	return toUnstructured(mhc, clusterv1.GroupVersion.String(), "MachineHealthCheck")
}
