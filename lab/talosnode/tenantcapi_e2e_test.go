//go:build integration && (e2e || bench)

package talosnode_test

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	ggcrv1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"cozy.dev/cozy/internal/testing/clustertest"
	"cozy.dev/cozy/internal/testing/netnstest"
	"cozy.dev/cozy/internal/testing/poll"
	"cozy.dev/cozy/internal/testing/testenv"
	"cozy.dev/cozy/internal/testing/workertest"
	v1 "cozy.dev/cozy/operators/api/v1alpha1"
	"cozy.dev/cozy/operators/tenantcluster"
	"cozy.dev/cozy/platform/render"
	"cozy.dev/cozy/tenant/workerimage"
)

// The images of Cluster API's managers, as hack/kamaji.sh packs them
// under their releases' names.
const (
	capiCoreImage      = "registry.k8s.io/cluster-api/cluster-api-controller:v1.14.2"
	capiBootstrapImage = "registry.k8s.io/cluster-api/kubeadm-bootstrap-controller:v1.14.2"
	kamajiCPImage      = "docker.io/clastix/cluster-api-control-plane-provider-kamaji:v0.20.0"
	capkImage          = "quay.io/capk/capk-manager:v0.11.2"
)

// startClusterAPI runs what turns cozy-operator's children into a
// tenant: Cluster API's core and kubeadm bootstrap managers
// (hack/capi-controllers.sh), the Kamaji control-plane provider
// (hack/kamaji.sh's port of v0.20.0 to Kamaji v1.0.0) and CAPK, as the
// platform runs them: a Deployment each of the images hack/kamaji.sh
// packs, pulled from the mirror, in the namespace the platform gives it,
// its release's ServiceAccount bound to the ClusterRole its module
// declares (config/rbac), plus the RBAC the platform renders for them;
// leader election off (one replica). Core's webhooks are served behind
// the Service capi-webhook-service, with a throwaway CA's certificate in
// place of cert-manager's, and registered failing closed, its conversion
// webhook too (CAPK reads Clusters and Machines as v1beta1); the other
// managers' servers (which cannot be turned off) get the same
// certificate, their webhooks not registered. Their CRDs come from their
// modules, and KubeVirt's VirtualMachine and VirtualMachineInstance and
// CDI's kinds, which CAPK reads, from theirs (KubeVirt and CDI
// themselves do not run). It returns once all four are ready.
func startClusterAPI(ctx context.Context, t *testing.T, c *procCluster) {
	t.Helper()
	var sources []testenv.CRDSource
	for _, src := range testenv.UpstreamCRDs() {
		switch src.Module {
		case "sigs.k8s.io/cluster-api", "sigs.k8s.io/cluster-api-provider-kubevirt", "github.com/clastix/cluster-api-control-plane-provider-kamaji":
			sources = append(sources, src)
		}
	}
	for _, src := range testenv.PlatformCRDs() {
		if src.Module == "kubevirt.io/containerized-data-importer" {
			sources = append(sources, src)
		}
	}
	crds, err := testenv.LoadCRDs(ctx, sources)
	if err != nil {
		t.Fatal(err)
	}
	vmCRDs, err := testenv.KubeVirtVMCRDs(ctx)
	if err != nil {
		t.Fatal(err)
	}
	const service = "capi-webhook-service"
	const core = "cozy-capi-core"
	certs := webhookCerts(t, service+"."+core+".svc")
	cl := clusterClient(t, c)
	for _, crd := range append(crds, vmCRDs...) {
		if crd.Spec.Group == "cluster.x-k8s.io" && len(crd.Spec.Versions) > 1 {
			testenv.ConvertThrough(crd, core, service, certs["ca.crt"])
		}
		if err := cl.Create(ctx, crd); err != nil {
			t.Fatal(err)
		}
	}

	// Established before the managers start and the children come.
	established(ctx, t, cl, "the Cluster API kinds",
		"cluster.x-k8s.io/v1beta2 MachineList", "bootstrap.cluster.x-k8s.io/v1beta2 KubeadmConfigList",
		"controlplane.cluster.x-k8s.io/v1alpha2 KamajiControlPlaneList", "infrastructure.cluster.x-k8s.io/v1alpha1 KubevirtClusterList",
		"kubevirt.io/v1 VirtualMachineList", "cdi.kubevirt.io/v1beta1 DataVolumeList")

	// Each manager in the namespace the platform's Cluster API operator
	// installs it in (charts/platform, cluster-api-providers), under its
	// release's ServiceAccount name, so that the platform's own RBAC for
	// them applies as rendered.
	managers := []struct {
		manager
		module, version, roleFile string
	}{
		{manager{namespace: core, account: "capi-manager", image: capiCoreImage,
			args: []string{"--leader-elect=false", "--diagnostics-address=0", "--health-addr=:9440"}, health: 9440},
			"sigs.k8s.io/cluster-api", "v1.14.2", "core/config/rbac/role.yaml"},
		{manager{namespace: "cozy-capi-kubeadm-bootstrap", account: "capi-kubeadm-bootstrap-manager", image: capiBootstrapImage,
			args: []string{"--leader-elect=false", "--diagnostics-address=0", "--health-addr=:9440"}, health: 9440},
			"sigs.k8s.io/cluster-api", "v1.14.2", "bootstrap/kubeadm/config/rbac/role.yaml"},
		{manager{namespace: "cozy-capi-kamaji", account: "capi-kamaji-controller-manager", image: kamajiCPImage,
			args: []string{"--leader-elect=false", "--diagnostics-address=0", "--health-probe-bind-address=:8081"}, health: 8081},
			"github.com/clastix/cluster-api-control-plane-provider-kamaji", "v0.20.0", "config/rbac/role.yaml"},
		{manager{namespace: "cozy-capi-kubevirt", account: "capk-manager", image: capkImage,
			args: []string{"--leader-elect=false", "--diagnostics-address=0", "--health-addr=:9440", "--feature-gates=MachinePool=false"}, health: 9440},
			"sigs.k8s.io/cluster-api-provider-kubevirt", "v0.11.2", "config/rbac/role.yaml"},
	}
	objs := []client.Object{&corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: service, Namespace: core},
		Spec: corev1.ServiceSpec{Selector: map[string]string{"app.kubernetes.io/name": managers[0].account}, Ports: []corev1.ServicePort{{
			Name: "webhook", Port: 443, TargetPort: intstr.FromInt32(testenv.CAPIWebhookPort)}}},
	}}
	for i := range managers {
		m := &managers[i]
		role, err := testenv.ModuleClusterRole(ctx, m.module, m.version, m.namespace+"-"+m.account, m.roleFile)
		if err != nil {
			t.Fatal(err)
		}
		m.role, m.webhookPort, m.certSecret = role.Name, testenv.CAPIWebhookPort, "webhook-server-cert"
		objs = append(append(objs,
			&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: m.namespace}},
			&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: m.certSecret, Namespace: m.namespace}, Data: certs},
			role), m.objects()...)
	}
	objs = append(objs, platformRBAC(t, c, "cluster-api-providers")...)
	slices.SortStableFunc(objs, func(a, b client.Object) int { // namespaces first
		_, an := a.(*corev1.Namespace)
		_, bn := b.(*corev1.Namespace)
		switch {
		case an && !bn:
			return -1
		case bn && !an:
			return 1
		}
		return 0
	})
	for _, o := range objs {
		if err := cl.Create(ctx, o); err != nil {
			t.Fatalf("create %T %s: %v", o, o.GetName(), err)
		}
	}
	for _, m := range managers {
		m.logOnFailure(t, c)
	}
	poll.Within(t, 5*time.Minute, time.Second, "Cluster API's managers ready", func() error {
		for _, m := range managers {
			if err := m.ready(c); err != nil {
				return err
			}
		}
		return nil
	})
	// Core's webhooks, now that its pod answers behind the Service.
	hooks, err := testenv.CAPIServiceWebhooks(ctx, core, service, certs["ca.crt"])
	if err != nil {
		t.Fatal(err)
	}
	for _, h := range hooks {
		if err := cl.Create(ctx, h); err != nil {
			t.Fatalf("register %s: %v", h.GetName(), err)
		}
	}
	// A ready pod is not yet a routed Service: the API server reaches the
	// webhooks once the node's kube-proxy has the pod behind it, so wait
	// for a dry-run Cluster to get through them.
	poll.Within(t, 2*time.Minute, time.Second, "the API server calling Cluster API core's webhooks", func() error {
		probe := &unstructured.Unstructured{}
		probe.SetAPIVersion("cluster.x-k8s.io/v1beta2")
		probe.SetKind("Cluster")
		probe.SetNamespace("default")
		probe.SetName("webhook-probe")
		if err := cl.Create(ctx, probe, client.DryRunAll); err != nil && strings.Contains(err.Error(), "failed calling webhook") {
			return err
		}
		return nil
	})
}

// established waits until the API server lists each of lists ("GROUP/VERSION
// KindList"): their CRDs are established.
func established(ctx context.Context, t *testing.T, cl client.Client, what string, lists ...string) {
	t.Helper()
	poll.Within(t, time.Minute, 500*time.Millisecond, what+" established", func() error {
		for _, k := range lists {
			var list unstructured.UnstructuredList
			apiVersion, kind, _ := strings.Cut(k, " ")
			list.SetAPIVersion(apiVersion)
			list.SetKind(kind)
			if err := cl.List(ctx, &list); err != nil {
				return err
			}
		}
		return nil
	})
}

// platformRBAC is the ClusterRoles and ClusterRoleBindings the platform
// renders for this cluster's rack in component.
func platformRBAC(t *testing.T, c *procCluster, component string) []client.Object {
	t.Helper()
	layout, err := render.Render(c.rack)
	if err != nil {
		t.Fatal(err)
	}
	objs, err := layout.Objects()
	if err != nil {
		t.Fatal(err)
	}
	var out []client.Object
	for _, o := range objs {
		if (o.GetKind() == "ClusterRole" || o.GetKind() == "ClusterRoleBinding") && strings.Contains(o.File, "/components/"+component+"/") {
			out = append(out, o.Unstructured)
		}
	}
	if len(out) == 0 {
		t.Fatalf("the platform renders no RBAC in %s", component)
	}
	return out
}

// manager is a controller-runtime manager as its release runs it: the
// ServiceAccount account in namespace bound to the ClusterRole role, and
// a one-replica Deployment named account of image (non-root, user 65532)
// with args, the Secret certSecret mounted where controller-runtime reads
// its webhook server's certificate, serving webhooks on webhookPort,
// ready when /readyz on health answers; scratch, if set, an emptyDir
// mounted there.
type manager struct {
	namespace, account, role, image string
	args                            []string
	health, webhookPort             int32
	certSecret, scratch             string
}

// objects are the manager's ServiceAccount, ClusterRoleBinding and
// Deployment.
func (m manager) objects() []client.Object {
	labels := map[string]string{"app.kubernetes.io/name": m.account}
	mounts := []corev1.VolumeMount{{Name: "certs", MountPath: "/tmp/k8s-webhook-server/serving-certs", ReadOnly: true}}
	volumes := []corev1.Volume{{Name: "certs", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: m.certSecret}}}}
	if m.scratch != "" {
		mounts = append(mounts, corev1.VolumeMount{Name: "scratch", MountPath: m.scratch})
		volumes = append(volumes, corev1.Volume{Name: "scratch", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}})
	}
	return []client.Object{
		&corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: m.account, Namespace: m.namespace}},
		&rbacv1.ClusterRoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: m.role},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: m.role},
			Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: m.account, Namespace: m.namespace}},
		},
		&appsv1.Deployment{
			ObjectMeta: metav1.ObjectMeta{Name: m.account, Namespace: m.namespace},
			Spec: appsv1.DeploymentSpec{
				Selector: &metav1.LabelSelector{MatchLabels: labels},
				Template: corev1.PodTemplateSpec{
					ObjectMeta: metav1.ObjectMeta{Labels: labels},
					Spec: corev1.PodSpec{
						ServiceAccountName: m.account,
						SecurityContext:    &corev1.PodSecurityContext{RunAsNonRoot: ptr.To(true), RunAsUser: ptr.To(int64(65532))},
						Containers: []corev1.Container{{
							Name: "manager", Image: m.image, Args: m.args,
							Ports: []corev1.ContainerPort{{Name: "webhook", ContainerPort: m.webhookPort}},
							ReadinessProbe: &corev1.Probe{ProbeHandler: corev1.ProbeHandler{
								HTTPGet: &corev1.HTTPGetAction{Path: "/readyz", Port: intstr.FromInt32(m.health)}}},
							VolumeMounts: mounts,
						}},
						Volumes: volumes,
					},
				},
			},
		},
	}
}

// ready says why the manager's one pod is not ready, if it is not.
func (m manager) ready(c *procCluster) error {
	out, err := c.kubectl("-n", m.namespace, "get", "pods", "-l", "app.kubernetes.io/name="+m.account, "-o",
		`jsonpath={range .items[*]}{.spec.nodeName} {.status.phase} {.status.containerStatuses[0].ready} {.status.containerStatuses[0].restartCount}{"\n"}{end}`)
	if err != nil {
		return err
	}
	if f := strings.Fields(out); len(f) != 4 || f[2] != "true" {
		return fmt.Errorf("%s's pods: %q", m.account, out)
	}
	return nil
}

// logOnFailure logs the tail of the manager's log when the test has
// failed, as it ends.
func (m manager) logOnFailure(t *testing.T, c *procCluster) {
	t.Cleanup(func() {
		if t.Failed() {
			out, err := c.kubectl("-n", m.namespace, "logs", "deploy/"+m.account, "--tail=80")
			t.Logf("%s's log:\n%s%v", m.account, out, err)
		}
	})
}

// webhookCerts is a webhook server certificate for host, signed by a
// throwaway CA, as a kubernetes.io/tls Secret's data (tls.crt, tls.key,
// ca.crt): what cert-manager would give the manager.
func webhookCerts(t *testing.T, host string) map[string][]byte {
	t.Helper()
	dir := testenv.WebhookCertDir(t, host)
	certs := map[string][]byte{}
	for _, f := range []string{"tls.crt", "tls.key", "ca.crt"} {
		data, err := os.ReadFile(filepath.Join(dir, f))
		if err != nil {
			t.Fatal(err)
		}
		certs[f] = data
	}
	return certs
}

// managementClient is a client of the cluster's API that knows Cluster
// API's kinds, TenantClusters and CRDs.
func managementClient(t *testing.T, c *procCluster) client.Client {
	t.Helper()
	scheme := workertest.Scheme(t)
	for _, add := range []func(*runtime.Scheme) error{v1.AddToScheme, apiextensionsv1.AddToScheme} {
		if err := add(scheme); err != nil {
			t.Fatal(err)
		}
	}
	cl, err := client.New(restConfig(t, c), client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	return cl
}

// applyChildren applies cozy-operator's children for tc
// (tenantcluster.Desired at its version, workers pulling through the
// mirror) as the operator applies them: server-side, under its field
// owner. tc itself is not stored: its CRD accepts Kubernetes v1.34 and
// newer, and Kamaji v1.0.0 serves v1.30.2 at most; so the children go
// without their owner reference to it (the garbage collector would
// delete them at once), and the test deletes them as the collector would.
func applyChildren(ctx context.Context, t *testing.T, cl client.Client, tc *v1.TenantCluster) tenantcluster.Children {
	t.Helper()
	children, err := tenantcluster.Desired(tc, tc.Spec.Version, tenantcluster.WorkerImages{
		Repository: mirrorAddr + "/cozy.dev/tenant-worker", Insecure: true, Mirror: "http://" + mirrorAddr,
		Mirrors: map[string][]string{mirrorsHost: {"http://" + mirrorsAddr}},
	})
	if err != nil {
		t.Fatalf("the operator's children: %v", err)
	}
	for _, u := range children.All() {
		u = u.DeepCopy()
		u.SetOwnerReferences(nil)
		err := cl.Apply(ctx, client.ApplyConfigurationFromUnstructured(u), client.FieldOwner("cozy-operator"), client.ForceOwnership)
		if err != nil {
			t.Fatalf("apply %s %s: %v", u.GetKind(), u.GetName(), err)
		}
	}
	return children
}

// A registry none of the rack's registries.mirror stands in for, which
// the workers reach through the rack's registries.mirrors: an endpoint on
// the LAN serving its images at their own paths, as a pull-through cache
// or a private registry's address does.
const (
	mirrorsHost  = "registry.cozy.test"
	mirrorsAddr  = clusterSubnet + ".1:5001"
	mirrorsImage = mirrorsHost + "/probe/busybox:1.35.0"
)

// startMirrorsEndpoint serves mirrorsHost's endpoint on the LAN with one
// image, mirrorsImage: the lab's busybox with a label added to its
// config, so that it is an image of its own (an image ID no other name
// has) whose config only that endpoint serves.
func startMirrorsEndpoint(ctx context.Context, t *testing.T, ns *netnstest.NS) {
	t.Helper()
	serveRegistry(t, ns, mirrorsAddr)
	opts := []remote.Option{remote.WithContext(ctx), remote.WithTransport(&http.Transport{DialContext: ns.DialContext}),
		remote.WithPlatform(ggcrv1.Platform{OS: "linux", Architecture: "amd64"})}
	src, err := name.ParseReference(mirrorAddr+"/"+clustertest.Busybox, name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	dst, err := name.ParseReference(mirrorsAddr+"/"+strings.TrimPrefix(mirrorsImage, mirrorsHost+"/"), name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	img, err := remote.Image(src, opts...)
	if err != nil {
		t.Fatalf("%s: %v", src, err)
	}
	cfg, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	cfg = cfg.DeepCopy()
	cfg.Config.Labels = map[string]string{"cozy.dev/pulled-through": "registries.mirrors"}
	if img, err = mutate.ConfigFile(img, cfg); err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(dst, img, opts...); err != nil {
		t.Fatalf("%s to %s: %v", src, dst, err)
	}
}

// deleteChildren deletes a tenant's children all at once, as the garbage
// collector deletes a TenantCluster's.
func deleteChildren(ctx context.Context, t *testing.T, cl client.Client, children tenantcluster.Children) {
	t.Helper()
	for _, u := range children.All() {
		if err := cl.Delete(ctx, u.DeepCopy()); err != nil && !apierrors.IsNotFound(err) {
			t.Fatalf("delete %s %s: %v", u.GetKind(), u.GetName(), err)
		}
	}
}

// joinWorker stands in for KubeVirt and CDI, which cannot run here, for
// the VirtualMachine CAPK makes for the tenant's one worker Machine. It
// waits for that VM and the Secret its config drive names (the user-data
// the kubeadm bootstrap provider rendered for the Machine, which CAPK
// copies), then does what virt-controller, virt-handler and
// virt-launcher would: boots Cozy's worker image (what the VM's
// DataVolume imports) under QEMU in the worker node's network namespace,
// as virt-launcher runs it in a pod of a management node, with that
// config drive as KubeVirt writes it; records a running
// VirtualMachineInstance owned by the VM, Ready, at the address the
// guest has on QEMU's user network; and marks the VM ready. The VM's
// user network reaches the tenant's ClusterIP Service through the
// node's kube-proxy, and the mirror on the LAN. Once the VM is deleted
// (and the VMI with it, by the garbage collector), QEMU is stopped, as
// virt-launcher's pod would be. It returns the VM and its name, which
// the worker takes as its host name. The image's OCI layout comes from
// the environment variable imageEnv.
func joinWorker(ctx context.Context, t *testing.T, cl client.Client, worker *clusterNode, namespace, cluster, version, imageEnv string) (workertest.VM, string) {
	t.Helper()
	images := testenv.BuiltDir(t, imageEnv, "hack/worker-image.sh "+version, "index.json", "disk/"+workerimage.DiskName(version))
	var vm *unstructured.Unstructured
	var userDataSecret string
	poll.Within(t, 5*time.Minute, time.Second, "the VirtualMachine CAPK makes for the worker", func() error {
		vms, err := clusterObjects(ctx, cl, "kubevirt.io/v1", "VirtualMachineList", namespace, cluster)
		if err != nil {
			return err
		}
		if len(vms) != 1 {
			return fmt.Errorf("%d VirtualMachines", len(vms))
		}
		vm = &vms[0]
		volumes, _, _ := unstructured.NestedSlice(vm.Object, "spec", "template", "spec", "volumes")
		for _, v := range volumes {
			if name, ok, _ := unstructured.NestedString(v.(map[string]any), "cloudInitConfigDrive", "secretRef", "name"); ok {
				userDataSecret = name
			}
		}
		if userDataSecret == "" {
			return fmt.Errorf("VirtualMachine %s has no config drive with a user-data Secret: volumes %v", vm.GetName(), volumes)
		}
		return nil
	})
	name := vm.GetName()
	var secret corev1.Secret
	poll.Within(t, time.Minute, time.Second, "the VM's user-data Secret "+userDataSecret, func() error {
		return cl.Get(ctx, client.ObjectKey{Namespace: namespace, Name: userDataSecret}, &secret)
	})
	userData := secret.Data["userdata"]
	if len(userData) == 0 {
		t.Fatalf("the VM's user-data Secret %s holds no userdata", userDataSecret)
	}
	dir := t.TempDir()
	booted := workertest.Boot(ctx, t, worker.ns, dir, filepath.Join(images, "disk", workerimage.DiskName(version)),
		workertest.ConfigDrive(t, dir, name, namespace, workertest.FirmwareUUID, string(userData)))

	// What KubeVirt reports of a VM whose domain runs.
	labels, _, _ := unstructured.NestedStringMap(vm.Object, "spec", "template", "metadata", "labels")
	spec, _, _ := unstructured.NestedMap(vm.Object, "spec", "template", "spec")
	vmi := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
		"spec": spec,
		"status": map[string]any{
			"phase": "Running", "nodeName": worker.name,
			"conditions": []any{
				map[string]any{"type": "Ready", "status": "True"},
				map[string]any{"type": "LiveMigratable", "status": "False", "reason": "NotMigratable",
					"message": "the test's stand-in for KubeVirt does not migrate"},
			},
			"interfaces": []any{map[string]any{"name": "default", "ipAddress": workertest.GuestIP, "ipAddresses": []any{workertest.GuestIP}}},
		},
	}}
	vmi.SetName(name)
	vmi.SetNamespace(namespace)
	vmi.SetLabels(labels)
	vmi.SetOwnerReferences([]metav1.OwnerReference{{APIVersion: "kubevirt.io/v1", Kind: "VirtualMachine", Name: name, UID: vm.GetUID(),
		Controller: ptr.To(true), BlockOwnerDeletion: ptr.To(true)}})
	if err := cl.Create(ctx, vmi); err != nil {
		t.Fatalf("the VirtualMachineInstance %s: %v", name, err)
	}
	ready := client.RawPatch(types.MergePatchType, []byte(`{"status":{"created":true,"ready":true,"printableStatus":"Running","conditions":[{"type":"Ready","status":"True"}]}}`))
	if err := cl.Status().Patch(ctx, vm, ready); err != nil {
		t.Fatalf("the VirtualMachine %s's status: %v", name, err)
	}

	// stopped is closed once the VMI is gone and QEMU was told to stop.
	stopped := make(chan struct{})
	go func() {
		for ctx.Err() == nil {
			if _, err := object(ctx, cl, "kubevirt.io/v1", "VirtualMachineInstance", namespace, name); apierrors.IsNotFound(err) {
				close(stopped)
				if p, err := os.FindProcess(booted.PID); err == nil {
					p.Kill()
				}
				return
			}
			time.Sleep(time.Second)
		}
	}()
	t.Cleanup(func() {
		select {
		case <-stopped:
			return
		default:
		}
		select {
		case err := <-booted.Exited:
			t.Errorf("the worker VM exited while its VirtualMachineInstance was there: %v", err)
		default:
		}
	})
	return booted, name
}

// checkMachineProvisioned checks that, with the worker VM running and
// its Node Ready, Cluster API takes the Node for the Machine's: CAPK
// reports the KubevirtMachine ready with the provider ID
// kubevirt://NAME and sets that ID on the tenant's Node (no cloud
// provider does that for KubeVirt VMs, CAPK says), core links the Machine
// to the Node (nodeRef, phase Running) and lifts Cluster API's
// uninitialized taint from it, and the node group's MachineDeployment
// counts the Machine ready: what the operator's WorkersReady reads.
func checkMachineProvisioned(ctx context.Context, t *testing.T, cl client.Client, tenantKubectl func(...string) (string, error), namespace, cluster, name string) {
	t.Helper()
	providerID := "kubevirt://" + name
	list := func(apiVersion, kind string) ([]unstructured.Unstructured, error) {
		return clusterObjects(ctx, cl, apiVersion, kind, namespace, cluster)
	}
	poll.Within(t, 5*time.Minute, 2*time.Second, "the worker's Machine provisioned and its Node linked", func() error {
		km, err := object(ctx, cl, "infrastructure.cluster.x-k8s.io/v1alpha1", "KubevirtMachine", namespace, name)
		if err != nil {
			return err
		}
		if ready, _, _ := unstructured.NestedBool(km.Object, "status", "ready"); !ready {
			return fmt.Errorf("KubevirtMachine %s not ready: %v", name, km.Object["status"])
		}
		if id, _, _ := unstructured.NestedString(km.Object, "spec", "providerID"); id != providerID {
			return fmt.Errorf("KubevirtMachine %s: providerID %q, want %q", name, id, providerID)
		}
		node, err := tenantKubectl("get", "node", name, "-o", `jsonpath={.spec.providerID}{range .spec.taints[*]} {.key}{end}`)
		if err != nil {
			return err
		}
		if f := strings.Fields(node); len(f) == 0 || f[0] != providerID {
			return fmt.Errorf("Node %s: providerID and taints %q, want the providerID %s", name, node, providerID)
		}
		if strings.Contains(node, "node.cluster.x-k8s.io/uninitialized") {
			return fmt.Errorf("Node %s keeps Cluster API's uninitialized taint: %q", name, node)
		}
		machines, err := list("cluster.x-k8s.io/v1beta2", "MachineList")
		if err != nil {
			return err
		}
		if len(machines) != 1 {
			return fmt.Errorf("%d Machines", len(machines))
		}
		m := machines[0].Object
		nodeRef, _, _ := unstructured.NestedString(m, "status", "nodeRef", "name")
		phase, _, _ := unstructured.NestedString(m, "status", "phase")
		if nodeRef != name || phase != "Running" {
			return fmt.Errorf("Machine %s: nodeRef %q, phase %q", machines[0].GetName(), nodeRef, phase)
		}
		mds, err := list("cluster.x-k8s.io/v1beta2", "MachineDeploymentList")
		if err != nil {
			return err
		}
		if len(mds) != 1 {
			return fmt.Errorf("%d MachineDeployments", len(mds))
		}
		if r, _, _ := unstructured.NestedInt64(mds[0].Object, "status", "readyReplicas"); r != 1 {
			return fmt.Errorf("MachineDeployment %s: readyReplicas %d", mds[0].GetName(), r)
		}
		return nil
	})
}

// clusterObjects lists the objects of apiVersion/listKind in namespace
// that carry Cluster API's label for cluster.
func clusterObjects(ctx context.Context, cl client.Client, apiVersion, listKind, namespace, cluster string) ([]unstructured.Unstructured, error) {
	var list unstructured.UnstructuredList
	list.SetAPIVersion(apiVersion)
	list.SetKind(listKind)
	err := cl.List(ctx, &list, client.InNamespace(namespace), client.MatchingLabels{"cluster.x-k8s.io/cluster-name": cluster})
	return list.Items, err
}

// object fetches apiVersion/kind namespace/name as unstructured.
func object(ctx context.Context, cl client.Client, apiVersion, kind, namespace, name string) (*unstructured.Unstructured, error) {
	u := &unstructured.Unstructured{}
	u.SetAPIVersion(apiVersion)
	u.SetKind(kind)
	err := cl.Get(ctx, client.ObjectKey{Namespace: namespace, Name: name}, u)
	return u, err
}

// checkClusterAPIControlPlane checks what the Kamaji provider reports
// to Cluster API once the tenant's control plane is Ready: the
// KamajiControlPlane ready and initialised, the Cluster's endpoint the
// tenant's Service, the infrastructure and the control plane marked
// provisioned and initialised in the Cluster (by the provider's patch of
// the KubevirtCluster, and core), the kubeconfig Secret Cluster API's
// controllers read. Then bad input: a KamajiControlPlane setting what
// Kamaji v1.0.0 cannot carry is refused by name, and the running tenant
// keeps serving; taken out again, the refusal clears.
func checkClusterAPIControlPlane(ctx context.Context, t *testing.T, cl client.Client, apiHost string, answers func() error) {
	t.Helper()
	const ns, name = "tenants", "acme"
	poll.Within(t, 3*time.Minute, time.Second, "Cluster API's view of the control plane", func() error {
		kcp, err := object(ctx, cl, kcpAPI, "KamajiControlPlane", ns, name)
		if err != nil {
			return err
		}
		ready, _, _ := unstructured.NestedBool(kcp.Object, "status", "ready")
		initialized, _, _ := unstructured.NestedBool(kcp.Object, "status", "initialization", "controlPlaneInitialized")
		if !ready || !initialized {
			return fmt.Errorf("KamajiControlPlane: ready %v, initialised %v", ready, initialized)
		}
		cluster, err := object(ctx, cl, "cluster.x-k8s.io/v1beta2", "Cluster", ns, name)
		if err != nil {
			return err
		}
		host, _, _ := unstructured.NestedString(cluster.Object, "spec", "controlPlaneEndpoint", "host")
		port, _, _ := unstructured.NestedInt64(cluster.Object, "spec", "controlPlaneEndpoint", "port")
		if host != apiHost || port != 6443 {
			return fmt.Errorf("the Cluster's controlPlaneEndpoint: %s:%d, want %s:6443", host, port, apiHost)
		}
		infra, _, _ := unstructured.NestedBool(cluster.Object, "status", "initialization", "infrastructureProvisioned")
		cpInit, _, _ := unstructured.NestedBool(cluster.Object, "status", "initialization", "controlPlaneInitialized")
		if !infra || !cpInit {
			return fmt.Errorf("the Cluster: infrastructure provisioned %v, control plane initialised %v", infra, cpInit)
		}
		var secret corev1.Secret
		return cl.Get(ctx, client.ObjectKey{Namespace: ns, Name: name + "-kubeconfig"}, &secret)
	})

	patch := func(body string) {
		t.Helper()
		kcp, err := object(ctx, cl, kcpAPI, "KamajiControlPlane", ns, name)
		if err != nil {
			t.Fatal(err)
		}
		if err := cl.Patch(ctx, kcp, client.RawPatch(types.MergePatchType, []byte(body)), client.FieldOwner("someone")); err != nil {
			t.Fatalf("patch the KamajiControlPlane with %s: %v", body, err)
		}
	}
	patch(`{"spec":{"network":{"advertiseAddress":"10.77.0.250"}}}`)
	poll.Within(t, 2*time.Minute, time.Second, "the provider refusing spec.network.advertiseAddress", func() error {
		kcp, err := object(ctx, cl, kcpAPI, "KamajiControlPlane", ns, name)
		if err != nil {
			return err
		}
		if status, msg := tenantControlPlaneCreated(kcp); status != "False" || !strings.Contains(msg, "spec.network.advertiseAddress is not supported") {
			return fmt.Errorf("TenantControlPlaneCreated %s: %q", status, msg)
		}
		return nil
	})
	kcp, _ := object(ctx, cl, kcpAPI, "KamajiControlPlane", ns, name)
	_, msg := tenantControlPlaneCreated(kcp)
	t.Logf("refused: TenantControlPlaneCreated False: %s", msg)
	if err := answers(); err != nil {
		t.Errorf("the tenant's API while its KamajiControlPlane was refused: %v", err)
	}
	patch(`{"spec":{"network":{"advertiseAddress":null}}}`)
	poll.Within(t, 2*time.Minute, time.Second, "the refusal cleared", func() error {
		kcp, err := object(ctx, cl, kcpAPI, "KamajiControlPlane", ns, name)
		if err != nil {
			return err
		}
		if status, msg := tenantControlPlaneCreated(kcp); status != "True" {
			return fmt.Errorf("TenantControlPlaneCreated %s: %q", status, msg)
		}
		return nil
	})
}

// kcpAPI is the KamajiControlPlane's apiVersion.
const kcpAPI = "controlplane.cluster.x-k8s.io/v1alpha2"

// tenantControlPlaneCreated is the status and message of the Kamaji
// provider's TenantControlPlaneCreated condition on kcp, which
// cozy-operator reads into the TenantCluster's ControlPlaneReady when
// False (TestComputeStatus).
func tenantControlPlaneCreated(kcp *unstructured.Unstructured) (string, string) {
	conds, _, _ := unstructured.NestedSlice(kcp.Object, "status", "conditions")
	for _, c := range conds {
		m, _ := c.(map[string]any)
		if m["type"] == "TenantControlPlaneCreated" {
			s, _ := m["status"].(string)
			msg, _ := m["message"].(string)
			return s, msg
		}
	}
	return "", ""
}

// missingDataStore is bad input through the whole chain: cozy-operator's
// children for a TenantCluster naming a DataStore that does not exist.
// Kamaji's webhook refuses the provider's TenantControlPlane, and the
// provider says so in the KamajiControlPlane's TenantControlPlaneCreated
// condition, which the operator shows in the TenantCluster's
// ControlPlaneReady (TestComputeStatus's "DataStore does not exist"
// case holds this message). Its children are then deleted and leave
// nothing behind.
func missingDataStore(ctx context.Context, t *testing.T, cl client.Client, namespace, version string) {
	t.Helper()
	tc := &v1.TenantCluster{
		ObjectMeta: metav1.ObjectMeta{Name: "ghost", Namespace: namespace, UID: "0b6c1f4e-6a54-4f4b-9a0e-3c1d2e5f7a81"},
		Spec: v1.TenantClusterSpec{
			Version:      version,
			ControlPlane: v1.ControlPlane{Replicas: 1, DataStoreName: "gone", Expose: v1.Expose{Type: v1.ExposeClusterIP}},
			Network:      v1.Network{PodCIDR: "10.243.0.0/16", ServiceCIDR: "10.95.0.0/16", DNSDomain: "cluster.local"},
		},
	}
	children := applyChildren(ctx, t, cl, tc)
	var msg string
	poll.Within(t, 2*time.Minute, time.Second, "the provider reporting the missing DataStore", func() error {
		kcp, err := object(ctx, cl, kcpAPI, "KamajiControlPlane", namespace, tc.Name)
		if err != nil {
			return err
		}
		var status string
		if status, msg = tenantControlPlaneCreated(kcp); status != "False" || !strings.Contains(msg, "gone DataStore does not exist") {
			return fmt.Errorf("TenantControlPlaneCreated %s: %q", status, msg)
		}
		return nil
	})
	t.Logf("a TenantCluster of a missing DataStore: TenantControlPlaneCreated False: %s", msg)
	deleteChildren(ctx, t, cl, children)
	clusterAPIGone(ctx, t, cl, namespace, tc.Name)
}

// clusterAPIGone waits until the tenant's Cluster API objects are gone:
// its Cluster, KamajiControlPlane, KubevirtCluster, Machines,
// KubeadmConfigs, KubevirtMachines, VirtualMachines and their instances,
// and the Secrets labelled with its cluster name (the bootstrap data and
// CAPK's copy of it for the VM among them).
func clusterAPIGone(ctx context.Context, t *testing.T, cl client.Client, namespace, cluster string) {
	t.Helper()
	poll.Within(t, 5*time.Minute, time.Second, "the tenant's Cluster API objects gone", func() error {
		var left []string
		for _, k := range []struct{ apiVersion, kind string }{
			{"cluster.x-k8s.io/v1beta2", "Cluster"},
			{"controlplane.cluster.x-k8s.io/v1alpha2", "KamajiControlPlane"},
			{"infrastructure.cluster.x-k8s.io/v1alpha1", "KubevirtCluster"},
		} {
			if _, err := object(ctx, cl, k.apiVersion, k.kind, namespace, cluster); !apierrors.IsNotFound(err) {
				left = append(left, fmt.Sprintf("%s (%v)", k.kind, err))
			}
		}
		for _, k := range []struct{ apiVersion, kind string }{
			{"cluster.x-k8s.io/v1beta2", "MachineList"},
			{"bootstrap.cluster.x-k8s.io/v1beta2", "KubeadmConfigList"},
			{"infrastructure.cluster.x-k8s.io/v1alpha1", "KubevirtMachineList"},
			{"kubevirt.io/v1", "VirtualMachineList"},
			{"kubevirt.io/v1", "VirtualMachineInstanceList"},
			{"v1", "SecretList"},
		} {
			items, err := clusterObjects(ctx, cl, k.apiVersion, k.kind, namespace, cluster)
			if err != nil {
				return err
			}
			for _, u := range items {
				left = append(left, strings.TrimSuffix(k.kind, "List")+"/"+u.GetName())
			}
		}
		if len(left) > 0 {
			return fmt.Errorf("left: %s", strings.Join(left, " "))
		}
		return nil
	})
}
