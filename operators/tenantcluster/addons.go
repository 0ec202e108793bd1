package tenantcluster

import (
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	helmv2 "github.com/fluxcd/helm-controller/api/v2"
	fluxmeta "github.com/fluxcd/pkg/apis/meta"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/yaml"

	v1 "cozy.dev/cozy/operators/api/v1alpha1"
)

// Add-on names: the suffix of their objects' names and the keys of
// Observed.HelmReleases and Observed.Deployments.
const (
	AddonCilium            = "cilium"
	AddonCSINode           = "kubevirt-csi-node"
	AddonMetricsServer     = "metrics-server"
	AddonClusterAutoscaler = "cluster-autoscaler"
	AddonCCM               = "kubevirt-ccm"
	AddonCSIController     = "kubevirt-csi-controller"
)

// LabelAddon marks an add-on's objects with the add-on's name.
const LabelAddon = "tenancy.cozy.dev/addon"

// AddonConfig is where the add-ons come from: the Flux sources holding
// the charts installed into tenants, and the images of the controllers
// that run in the management cluster.
type AddonConfig struct {
	// Charts are the tenant-side add-ons' charts, by add-on.
	Charts map[string]ChartRef
	// Images of the management-side controllers.
	ClusterAutoscalerImage string
	CCMImage               string
	CSIDriverImage         string
	CSIProvisionerImage    string
	CSIAttacherImage       string
	CSILivenessProbeImage  string
}

// ChartRef is where one add-on's chart comes from. Upstream charts come
// from their projects' Helm repositories; a chart Cozy writes itself
// (kubevirt-csi-node: the CSI driver project publishes none) comes from
// the platform's own Git repository, where `cozyctl platform render`
// puts it.
type ChartRef struct {
	// Source is a HelmRepository, GitRepository or Bucket.
	Source helmv2.CrossNamespaceObjectReference
	// Chart is the chart's name in a HelmRepository, its folder in a
	// GitRepository or Bucket.
	Chart string
	// Version is a semver range for a HelmRepository chart; charts from
	// Git carry the version of the commit they come from.
	Version string
}

// TenantAddonCharts are the add-ons installed into tenants by chart.
var TenantAddonCharts = []string{AddonCilium, AddonCSINode, AddonMetricsServer}

// String is the form ParseChartRef reads.
func (c ChartRef) String() string {
	s := fmt.Sprintf("%s/%s/%s/%s", c.Source.Kind, c.Source.Namespace, c.Source.Name, c.Chart)
	if c.Version != "" {
		s += "@" + c.Version
	}
	return s
}

// ParseChartRef reads ADDON=KIND/NAMESPACE/NAME/CHART[@VERSION], the
// form of cozy-operator's --addon-chart flag, e.g.
// cilium=HelmRepository/cozy-addons/cilium/cilium@1.18.4 or
// kubevirt-csi-node=GitRepository/flux-system/flux-system/./charts/kubevirt-csi-node.
func ParseChartRef(s string) (string, ChartRef, error) {
	addon, ref, ok := strings.Cut(s, "=")
	if !ok || !slices.Contains(TenantAddonCharts, addon) {
		return "", ChartRef{}, fmt.Errorf("%q: want ADDON=KIND/NAMESPACE/NAME/CHART[@VERSION] with ADDON one of %s", s, strings.Join(TenantAddonCharts, ", "))
	}
	parts := strings.SplitN(ref, "/", 4)
	if len(parts) != 4 {
		return "", ChartRef{}, fmt.Errorf("%s: %q: want KIND/NAMESPACE/NAME/CHART[@VERSION]", addon, ref)
	}
	c := ChartRef{Source: helmv2.CrossNamespaceObjectReference{Kind: parts[0], Namespace: parts[1], Name: parts[2]}, Chart: parts[3]}
	if i := strings.LastIndex(c.Chart, "@"); i >= 0 {
		c.Chart, c.Version = c.Chart[:i], c.Chart[i+1:]
		if c.Version == "" {
			return "", ChartRef{}, fmt.Errorf("%s: %q: empty version after @", addon, ref)
		}
	}
	switch c.Source.Kind {
	case "HelmRepository", "GitRepository", "Bucket":
	default:
		return "", ChartRef{}, fmt.Errorf("%s: source kind %q: want HelmRepository, GitRepository or Bucket", addon, c.Source.Kind)
	}
	for _, f := range [][2]string{{"namespace", c.Source.Namespace}, {"name", c.Source.Name}} {
		if errs := validation.IsDNS1123Subdomain(f[1]); len(errs) > 0 {
			return "", ChartRef{}, fmt.Errorf("%s: source %s %q: %s", addon, f[0], f[1], strings.Join(errs, "; "))
		}
	}
	if c.Chart == "" || strings.ContainsAny(c.Chart, " \t\n@") {
		return "", ChartRef{}, fmt.Errorf("%s: chart %q: want a name or a folder", addon, c.Chart)
	}
	if c.Source.Kind == "HelmRepository" && strings.Contains(c.Chart, "/") {
		return "", ChartRef{}, fmt.Errorf("%s: chart %q: a HelmRepository chart is a name, not a path", addon, c.Chart)
	}
	return addon, c, nil
}

// DefaultAddonConfig is Cozy's pinned set. The HelmRepositories are the
// platform's tenant-addons component; the Git source is the one
// `cozyctl platform install` creates.
func DefaultAddonConfig() AddonConfig {
	helmRepo := func(name string) helmv2.CrossNamespaceObjectReference {
		return helmv2.CrossNamespaceObjectReference{Kind: "HelmRepository", Namespace: "cozy-addons", Name: name}
	}
	return AddonConfig{
		Charts: map[string]ChartRef{
			AddonCilium:        {Source: helmRepo("cilium"), Chart: "cilium", Version: "1.18.4"},
			AddonMetricsServer: {Source: helmRepo("metrics-server"), Chart: "metrics-server", Version: "3.13.0"},
			AddonCSINode: {
				Source: helmv2.CrossNamespaceObjectReference{Kind: "GitRepository", Namespace: "flux-system", Name: "flux-system"},
				Chart:  "./charts/kubevirt-csi-node",
			},
		},
		ClusterAutoscalerImage: "registry.k8s.io/autoscaling/cluster-autoscaler:v1.34.2",
		CCMImage:               "quay.io/kubevirt/kubevirt-cloud-controller-manager:v0.5.1",
		CSIDriverImage:         "quay.io/kubevirt/kubevirt-csi-driver:v0.4.1",
		CSIProvisionerImage:    "registry.k8s.io/sig-storage/csi-provisioner:v5.3.0",
		CSIAttacherImage:       "registry.k8s.io/sig-storage/csi-attacher:v4.10.0",
		CSILivenessProbeImage:  "registry.k8s.io/sig-storage/livenessprobe:v2.17.0",
	}
}

// KubeconfigSecret is the Secret Cluster API writes with the tenant's
// admin kubeconfig under the key "value".
func KubeconfigSecret(cluster string) string { return cluster + "-kubeconfig" }

// EnabledAddons lists the add-ons a TenantCluster asks for. The
// cluster-autoscaler runs only for clusters with an autoscaled group.
func EnabledAddons(tc *v1.TenantCluster) []string {
	a := tc.Spec.Addons
	var out []string
	if a.CNI.IsEnabled() {
		out = append(out, AddonCilium)
	}
	if a.KubevirtCSI.IsEnabled() {
		out = append(out, AddonCSINode, AddonCSIController)
	}
	if a.MetricsServer.IsEnabled() {
		out = append(out, AddonMetricsServer)
	}
	if a.CloudControllerManager.IsEnabled() {
		out = append(out, AddonCCM)
	}
	if a.ClusterAutoscaler.IsEnabled() && slices.ContainsFunc(tc.Spec.NodeGroups, func(g v1.NodeGroup) bool { return g.MinReplicas != nil }) {
		out = append(out, AddonClusterAutoscaler)
	}
	return out
}

// DesiredAddons builds the add-ons' objects: HelmReleases that install
// into the tenant through its kubeconfig Secret, and the Deployments
// (with their ServiceAccount, Role, RoleBinding and ConfigMap) that run
// in the management cluster. endpoint is the tenant API server's
// host:port as the Cluster reports it, which Cilium needs because the
// tenant has no kube-proxy.
func DesiredAddons(tc *v1.TenantCluster, cfg AddonConfig, host string, port int32) ([]*unstructured.Unstructured, error) {
	var out []*unstructured.Unstructured
	for _, name := range EnabledAddons(tc) {
		var objs []*unstructured.Unstructured
		var err error
		switch name {
		case AddonCilium:
			objs, err = helmRelease(tc, cfg, name, tc.Spec.Addons.CNI, map[string]any{
				"kubeProxyReplacement": true,
				"k8sServiceHost":       host,
				"k8sServicePort":       port,
				"ipam": map[string]any{
					"mode":     "cluster-pool",
					"operator": map[string]any{"clusterPoolIPv4PodCIDRList": []any{tc.Spec.Network.PodCIDR}},
				},
				"operator": map[string]any{"replicas": 1},
			}, nil)
		case AddonCSINode:
			objs, err = helmRelease(tc, cfg, name, tc.Spec.Addons.KubevirtCSI, map[string]any{
				// The chart is the node part only: the controller runs
				// beside the control plane, in the management cluster.
				"images": map[string]any{"driver": cfg.CSIDriverImage},
				"storageClass": map[string]any{
					"name":                  "kubevirt",
					"default":               true,
					"infraStorageClassName": tc.Spec.StorageClass,
				},
			}, dependsOnCNI(tc))
		case AddonMetricsServer:
			objs, err = helmRelease(tc, cfg, name, tc.Spec.Addons.MetricsServer, map[string]any{
				"args": []any{"--kubelet-preferred-address-types=InternalIP"},
			}, dependsOnCNI(tc))
		case AddonClusterAutoscaler:
			objs = clusterAutoscaler(tc, cfg)
		case AddonCCM:
			objs, err = cloudControllerManager(tc, cfg)
		case AddonCSIController:
			objs = csiController(tc, cfg)
		}
		if err != nil {
			return nil, fmt.Errorf("add-on %s: %w", name, err)
		}
		out = append(out, objs...)
	}
	return out, nil
}

func dependsOnCNI(tc *v1.TenantCluster) []string {
	if tc.Spec.Addons.CNI.IsEnabled() {
		return []string{AddonCilium}
	}
	return nil
}

func addonName(tc *v1.TenantCluster, addon string) string { return tc.Name + "-" + addon }

func addonMeta(tc *v1.TenantCluster, addon string) metav1.ObjectMeta {
	return meta(tc, addonName(tc, addon), map[string]string{LabelAddon: addon})
}

// helmRelease installs a chart into the tenant. Cozy's values come
// first, the TenantCluster's overrides are merged over them.
func helmRelease(tc *v1.TenantCluster, cfg AddonConfig, addon string, a v1.Addon, values map[string]any, dependsOn []string) ([]*unstructured.Unstructured, error) {
	if a.Values != nil && len(a.Values.Raw) > 0 {
		var over map[string]any
		if err := json.Unmarshal(a.Values.Raw, &over); err != nil {
			return nil, fmt.Errorf("values: %w", err)
		}
		values = mergeValues(values, over)
	}
	raw, err := json.Marshal(values)
	if err != nil {
		return nil, err
	}
	chart, ok := cfg.Charts[addon]
	if !ok {
		return nil, fmt.Errorf("no chart configured")
	}
	hr := &helmv2.HelmRelease{
		ObjectMeta: addonMeta(tc, addon),
		Spec: helmv2.HelmReleaseSpec{
			Chart: &helmv2.HelmChartTemplate{Spec: helmv2.HelmChartTemplateSpec{
				Chart:     chart.Chart,
				Version:   chart.Version,
				SourceRef: chart.Source,
			}},
			Interval:         metav1.Duration{Duration: 5 * time.Minute},
			ReleaseName:      addon,
			TargetNamespace:  "kube-system",
			StorageNamespace: "kube-system",
			KubeConfig: &fluxmeta.KubeConfigReference{SecretRef: &fluxmeta.SecretKeyReference{
				Name: KubeconfigSecret(tc.Name), Key: "value",
			}},
			Install: &helmv2.Install{Remediation: &helmv2.InstallRemediation{Retries: -1}},
			Upgrade: &helmv2.Upgrade{Remediation: &helmv2.UpgradeRemediation{Retries: -1}},
			Values:  &apiextensionsv1.JSON{Raw: raw},
		},
	}
	for _, d := range dependsOn {
		hr.Spec.DependsOn = append(hr.Spec.DependsOn, helmv2.DependencyReference{Name: addonName(tc, d)})
	}
	return []*unstructured.Unstructured{toUnstructured(hr, helmv2.GroupVersion.String(), helmv2.HelmReleaseKind)}, nil
}

// mergeValues merges over into base, maps recursively, everything else
// replaced, as Helm merges values files.
func mergeValues(base, over map[string]any) map[string]any {
	out := maps.Clone(base)
	for k, v := range over {
		if bm, ok := out[k].(map[string]any); ok {
			if om, ok := v.(map[string]any); ok {
				out[k] = mergeValues(bm, om)
				continue
			}
		}
		out[k] = v
	}
	return out
}

// The tenant's kubeconfig, mounted read-only into management-side pods.
const tenantKubeconfigDir = "/etc/kubernetes/tenant"

func tenantKubeconfigVolume(tc *v1.TenantCluster) (corev1.Volume, corev1.VolumeMount) {
	return corev1.Volume{
			Name: "tenant-kubeconfig",
			VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{
				SecretName: KubeconfigSecret(tc.Name), DefaultMode: ptr.To[int32](0o400),
				Items: []corev1.KeyToPath{{Key: "value", Path: "kubeconfig"}},
			}},
		}, corev1.VolumeMount{
			Name: "tenant-kubeconfig", MountPath: tenantKubeconfigDir, ReadOnly: true,
		}
}

// controllerObjects are a management-side controller: ServiceAccount,
// Role and RoleBinding limited to the tenant's namespace, and a
// Deployment of one replica running as that ServiceAccount.
func controllerObjects(tc *v1.TenantCluster, addon string, rules []rbacv1.PolicyRule, pod corev1.PodSpec) []*unstructured.Unstructured {
	name := addonName(tc, addon)
	sa := &corev1.ServiceAccount{ObjectMeta: addonMeta(tc, addon)}
	role := &rbacv1.Role{ObjectMeta: addonMeta(tc, addon), Rules: rules}
	rb := &rbacv1.RoleBinding{
		ObjectMeta: addonMeta(tc, addon),
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: name},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: name, Namespace: tc.Namespace}},
	}
	selector := map[string]string{LabelTenantCluster: tc.Name, LabelAddon: addon}
	pod.ServiceAccountName = name
	pod.SecurityContext = &corev1.PodSecurityContext{RunAsNonRoot: ptr.To(true), SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault}}
	for i := range pod.Containers {
		pod.Containers[i].SecurityContext = &corev1.SecurityContext{
			AllowPrivilegeEscalation: ptr.To(false),
			ReadOnlyRootFilesystem:   ptr.To(true),
			Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
		}
	}
	dep := &appsv1.Deployment{
		ObjectMeta: addonMeta(tc, addon),
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To[int32](1),
			Selector: &metav1.LabelSelector{MatchLabels: selector},
			Strategy: appsv1.DeploymentStrategy{Type: appsv1.RecreateDeploymentStrategyType},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: maps.Clone(selector)},
				Spec:       pod,
			},
		},
	}
	return []*unstructured.Unstructured{
		toUnstructured(sa, "v1", "ServiceAccount"),
		toUnstructured(role, rbacv1.SchemeGroupVersion.String(), "Role"),
		toUnstructured(rb, rbacv1.SchemeGroupVersion.String(), "RoleBinding"),
		toUnstructured(dep, appsv1.SchemeGroupVersion.String(), "Deployment"),
	}
}

// clusterAutoscaler scales this cluster's autoscaled MachineDeployments:
// Cluster API objects in the management cluster (in-cluster config,
// authoritative), nodes in the tenant (its kubeconfig), discovery limited
// to this cluster in this namespace.
func clusterAutoscaler(tc *v1.TenantCluster, cfg AddonConfig) []*unstructured.Unstructured {
	vol, mount := tenantKubeconfigVolume(tc)
	rules := []rbacv1.PolicyRule{
		{APIGroups: []string{"cluster.x-k8s.io"}, Resources: []string{"machinedeployments", "machinesets", "machinepools"}, Verbs: []string{"get", "list", "watch"}},
		// Scaling, and marking the machine to remove on a scale-down.
		{APIGroups: []string{"cluster.x-k8s.io"}, Resources: []string{"machinedeployments/scale", "machinepools/scale"}, Verbs: []string{"get", "update", "patch"}},
		{APIGroups: []string{"cluster.x-k8s.io"}, Resources: []string{"machines"}, Verbs: []string{"get", "list", "watch", "update", "patch"}},
		{APIGroups: []string{capkGroup}, Resources: []string{"kubevirtmachinetemplates"}, Verbs: []string{"get", "list", "watch"}},
	}
	pod := corev1.PodSpec{
		Containers: []corev1.Container{{
			Name:    "cluster-autoscaler",
			Image:   cfg.ClusterAutoscalerImage,
			Command: []string{"/cluster-autoscaler"},
			Args: []string{
				"--cloud-provider=clusterapi",
				"--kubeconfig=" + tenantKubeconfigDir + "/kubeconfig",
				"--clusterapi-cloud-config-authoritative",
				fmt.Sprintf("--node-group-auto-discovery=clusterapi:namespace=%s,clusterName=%s", tc.Namespace, tc.Name),
				"--balance-similar-node-groups",
			},
			VolumeMounts: []corev1.VolumeMount{mount},
		}},
		Volumes: []corev1.Volume{vol},
	}
	return controllerObjects(tc, AddonClusterAutoscaler, rules, pod)
}

// cloudControllerManager is KubeVirt's: it initialises the tenant's
// nodes from their VMs and serves the tenant's LoadBalancer Services
// with Services in the tenant's namespace here.
func cloudControllerManager(tc *v1.TenantCluster, cfg AddonConfig) ([]*unstructured.Unstructured, error) {
	cloudConfig, err := yaml.Marshal(map[string]any{
		"namespace":    tc.Namespace,
		"loadBalancer": map[string]any{"creationPollInterval": 5, "creationPollTimeout": 60},
		"instancesV2":  map[string]any{"enabled": true, "zoneAndRegionEnabled": false},
	})
	if err != nil {
		return nil, err
	}
	cm := &corev1.ConfigMap{ObjectMeta: addonMeta(tc, AddonCCM), Data: map[string]string{"cloud-config": string(cloudConfig)}}
	vol, mount := tenantKubeconfigVolume(tc)
	rules := []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"services"}, Verbs: []string{"get", "list", "watch", "create", "update", "patch", "delete"}},
		{APIGroups: []string{"discovery.k8s.io"}, Resources: []string{"endpointslices"}, Verbs: []string{"get", "list", "watch", "create", "update", "patch", "delete"}},
		{APIGroups: []string{"kubevirt.io"}, Resources: []string{"virtualmachines", "virtualmachineinstances"}, Verbs: []string{"get", "list", "watch"}},
	}
	pod := corev1.PodSpec{
		Containers: []corev1.Container{{
			Name:    "kubevirt-cloud-controller-manager",
			Image:   cfg.CCMImage,
			Command: []string{"/bin/kubevirt-cloud-controller-manager"},
			Args: []string{
				"--cloud-provider=kubevirt",
				"--cloud-config=/etc/cloud/cloud-config",
				"--kubeconfig=" + tenantKubeconfigDir + "/kubeconfig",
				"--authentication-skip-lookup=true",
				"--cluster-name=" + tc.Name,
			},
			VolumeMounts: []corev1.VolumeMount{mount, {Name: "cloud-config", MountPath: "/etc/cloud", ReadOnly: true}},
		}},
		Volumes: []corev1.Volume{vol, {Name: "cloud-config", VolumeSource: corev1.VolumeSource{
			ConfigMap: &corev1.ConfigMapVolumeSource{LocalObjectReference: corev1.LocalObjectReference{Name: addonName(tc, AddonCCM)}},
		}}},
	}
	return append([]*unstructured.Unstructured{toUnstructured(cm, "v1", "ConfigMap")},
		controllerObjects(tc, AddonCCM, rules, pod)...), nil
}

// csiController is the controller half of KubeVirt's CSI driver in split
// mode: it creates DataVolumes here and hot-plugs them into the tenant's
// VMs; the CSI sidecars watch the tenant's PVCs through its kubeconfig.
func csiController(tc *v1.TenantCluster, cfg AddonConfig) []*unstructured.Unstructured {
	vol, mount := tenantKubeconfigVolume(tc)
	kubeconfig := "--kubeconfig=" + tenantKubeconfigDir + "/kubeconfig"
	socket := corev1.VolumeMount{Name: "socket-dir", MountPath: "/csi"}
	rules := []rbacv1.PolicyRule{
		{APIGroups: []string{"cdi.kubevirt.io"}, Resources: []string{"datavolumes"}, Verbs: []string{"get", "list", "watch", "create", "delete"}},
		{APIGroups: []string{"kubevirt.io"}, Resources: []string{"virtualmachineinstances", "virtualmachines"}, Verbs: []string{"get", "list", "watch"}},
		{APIGroups: []string{"subresources.kubevirt.io"}, Resources: []string{"virtualmachineinstances/addvolume", "virtualmachineinstances/removevolume"}, Verbs: []string{"update"}},
		{APIGroups: []string{""}, Resources: []string{"persistentvolumeclaims"}, Verbs: []string{"get", "list", "watch"}},
	}
	sidecar := func(name, image string, args ...string) corev1.Container {
		return corev1.Container{Name: name, Image: image, Args: append([]string{"--csi-address=/csi/csi.sock", kubeconfig}, args...),
			VolumeMounts: []corev1.VolumeMount{socket, mount}}
	}
	pod := corev1.PodSpec{
		Containers: []corev1.Container{
			{
				Name:  "csi-driver",
				Image: cfg.CSIDriverImage,
				Args: []string{
					"--endpoint=unix:/csi/csi.sock",
					"--infra-cluster-namespace=" + tc.Namespace,
					"--infra-cluster-labels=" + LabelTenantCluster + "=" + tc.Name,
					"--tenant-cluster-kubeconfig=" + tenantKubeconfigDir + "/kubeconfig",
					"--run-node-service=false",
					"--run-controller-service=true",
				},
				VolumeMounts: []corev1.VolumeMount{socket, mount},
			},
			sidecar("csi-provisioner", cfg.CSIProvisionerImage, "--default-fstype=ext4", "--timeout=3m", "--retry-interval-max=1m"),
			sidecar("csi-attacher", cfg.CSIAttacherImage, "--timeout=3m", "--retry-interval-max=1m"),
			{Name: "csi-liveness-probe", Image: cfg.CSILivenessProbeImage, Args: []string{"--csi-address=/csi/csi.sock"}, VolumeMounts: []corev1.VolumeMount{socket}},
		},
		Volumes: []corev1.Volume{vol, {Name: "socket-dir", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}},
	}
	return controllerObjects(tc, AddonCSIController, rules, pod)
}
