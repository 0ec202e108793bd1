//go:build integration && (e2e || bench)

package talosnode_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	clientv3 "go.etcd.io/etcd/client/v3"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"cozy.dev/cozy/internal/procstat"
	"cozy.dev/cozy/internal/testing/clustertest"
	"cozy.dev/cozy/internal/testing/poll"
	"cozy.dev/cozy/internal/testing/testenv"
	"cozy.dev/cozy/internal/testing/workertest"
	"cozy.dev/cozy/operators/tenantcluster"
)

const (
	datastoreAddr  = clusterSubnet + ".1:2379" // Kamaji's etcd DataStore, beside the mirror
	datastoreQuota = 64 << 20                  // the DataStore's space, bytes
)

// TestKamajiServesATenant: cozy-operator's children for a TenantCluster
// become a running tenant through the real controllers: Cluster API's
// core and kubeadm bootstrap managers, the Kamaji control-plane provider
// (v0.20.0, ported to Kamaji v1.0.0 by hack/kamaji.sh), CAPK and Kamaji
// (built from their modules) run as pods of images served by the
// mirror, their webhooks behind Services. The provider makes the
// TenantControlPlane from the operator's KamajiControlPlane; Kamaji runs
// its kube-apiserver, controller-manager, scheduler and Konnectivity
// server as pods on the worker node from images built here, its
// state in an etcd DataStore on the nodes' LAN (client-certificate TLS,
// etcd auth on, as kamaji-etcd sets it up), its API on a ClusterIP
// Service, as the operator exposes it on a rack without a load-balancer
// pool. The provider reports the endpoint and readiness to Cluster API;
// core makes the node group's Machine, the bootstrap provider its
// user-data, CAPK its VirtualMachine with that user-data on a config
// drive; the test stands in for KubeVirt and boots Cozy's worker image
// with that config drive under QEMU in the worker node's network
// namespace (as virt-launcher runs a VM in a pod), and reports the VM
// running. Its Node registers in the tenant; its containerd pulls
// through the mirror cozy-operator's user-data names, and through the
// registries.mirrors endpoint it names for a registry the mirror does
// not stand in for; with a CNI (flannel) the Node is Ready, CAPK sets
// its provider ID, Cluster API links it to the Machine and lifts its
// uninitialized taint, and the node group counts it ready; it runs a
// pod, and the tenant's API server reaches its kubelet (logs, exec)
// through the Konnectivity agent Kamaji puts on it. The tenant's keys
// sit under its own prefix in the DataStore, readable by its own etcd
// user and no other prefix; once its children are deleted, its Cluster
// API objects, VM, pods, the Secrets Kamaji made, its keys, user and
// role are gone.
//
// Not here: the operator's controller itself (its children are applied
// as it applies them, without their owner: a TenantCluster's schema
// accepts v1.34 and newer, Kamaji v1.0.0 serves v1.30.2 at most);
// KubeVirt and CDI (the worker boots in QEMU, not under virt-launcher,
// from the image file, not a DataVolume); the tenant's CNI is the lab's
// flannel, not the Cilium Cozy gives tenants (it cannot be built here),
// and no cloud-controller-manager initialises the Node (KubeVirt's does
// for Cozy's workers).
func TestKamajiServesATenant(t *testing.T) {
	f := serveKamajiTenant(t, true)
	t.Logf("the tenant's API answered %s after its children were applied (the machine's CPU: %s); its worker's Node was Ready %s after the VM started (the machine's CPU: %s, QEMU's %s)",
		f.apiAnswers.Round(100*time.Millisecond), f.apiCPU.Round(100*time.Millisecond),
		f.nodeReady.Round(time.Second), f.nodeCPU.Round(time.Second), f.qemuCPU.Round(time.Second))
}

// tenantFigures are what serveKamajiTenant measured.
type tenantFigures struct {
	// apiAnswers: cozy-operator's children applied → the tenant's API
	// answers /version, with the CPU the whole machine spent meanwhile.
	apiAnswers, apiCPU time.Duration
	// nodeReady: the worker VM started → its Node Ready in the tenant
	// (kubeadm join, then flannel from the mirror), with the machine's
	// and QEMU's CPU meanwhile.
	nodeReady, nodeCPU, qemuCPU time.Duration
	// machineReady: the worker VM started → its Machine linked to the
	// Node (CAPK's provider ID) and counted ready by its node group.
	machineReady time.Duration
}

// serveKamajiTenant is TestKamajiServesATenant's whole run, which the
// tenant benchmark times; withOperator adds operatorTenant at its end.
func serveKamajiTenant(t *testing.T, withOperator bool) tenantFigures {
	var f tenantFigures
	kamaji := testenv.Kamaji(t)
	ctrllog.SetLogger(logr.Discard()) // controller-runtime's clients here log nothing worth reading
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	c := startCluster(t, ctx, "controlplane", "worker")
	cl := clusterClient(t, c)
	mirrorLayout(t, ctx, c.sw, mirrorAddr, filepath.Join(kamaji, "images"), nil)
	startMirrorsEndpoint(ctx, t, c.sw)

	// The DataStore: etcd on the LAN, TLS with client certificates, auth
	// on with a root user, as the kamaji-etcd chart makes it.
	pki := newDatastorePKI(t)
	dsCtx, dsExited := context.WithCancelCause(ctx)
	defer dsExited(nil)
	dataDir := t.TempDir()
	testenv.StartProcess(t, c.sw, filepath.Join(kamaji, "etcd"), []string{
		"--name=datastore", "--data-dir=" + dataDir,
		"--listen-client-urls=https://" + datastoreAddr, "--advertise-client-urls=https://" + datastoreAddr,
		"--listen-peer-urls=http://127.0.0.1:2380", "--initial-advertise-peer-urls=http://127.0.0.1:2380",
		"--initial-cluster=datastore=http://127.0.0.1:2380",
		"--client-cert-auth", "--trusted-ca-file=" + pki.file(t, "ca.crt"),
		// Small, so that the test can fill it.
		fmt.Sprintf("--quota-backend-bytes=%d", datastoreQuota),
		"--cert-file=" + pki.file(t, "server.crt"), "--key-file=" + pki.file(t, "server.key"),
	}, nil, dsExited)
	etcd := pki.client(t, c.sw.Expose(t, datastoreAddr))
	poll.Within(t, time.Minute, 200*time.Millisecond, "the DataStore's etcd", func() error {
		if err := context.Cause(dsCtx); err != nil {
			t.Fatal(err)
		}
		_, err := etcd.UserAddWithOptions(ctx, "root", "", &clientv3.UserAddOptions{NoPassword: true})
		return err
	})
	for _, step := range []func() error{
		func() error { _, err := etcd.RoleAdd(ctx, "root"); return err },
		func() error { _, err := etcd.UserGrantRole(ctx, "root", "root"); return err },
		func() error { _, err := etcd.AuthEnable(ctx); return err },
	} {
		if err := step(); err != nil {
			t.Fatalf("etcd auth: %v", err)
		}
	}

	// Kamaji's CRDs, from its module; its DataStore, whose certificates
	// it reads from Secrets.
	crds, err := testenv.LoadCRDs(ctx, []testenv.CRDSource{testenv.KamajiCRDs})
	if err != nil {
		t.Fatal(err)
	}
	for _, crd := range crds {
		if err := cl.Create(ctx, crd); err != nil {
			t.Fatal(err)
		}
	}
	for _, ns := range []string{"kamaji-system", "tenants"} {
		if err := cl.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
			t.Fatal(err)
		}
	}
	for name, data := range map[string]map[string][]byte{
		"datastore-ca":          {"ca.crt": pki.pem["ca.crt"], "ca.key": pki.pem["ca.key"]},
		"datastore-root-client": {"tls.crt": pki.pem["root.crt"], "tls.key": pki.pem["root.key"]},
	} {
		if err := cl.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "kamaji-system"}, Data: data}); err != nil {
			t.Fatal(err)
		}
	}
	ref := func(secret, key string) map[string]any {
		return map[string]any{"secretReference": map[string]any{"name": secret, "namespace": "kamaji-system", "keyPath": key}}
	}
	datastore := kamajiObject("DataStore", "", "default", map[string]any{
		"driver":    "etcd",
		"endpoints": []any{datastoreAddr},
		"tlsConfig": map[string]any{
			"certificateAuthority": map[string]any{"certificate": ref("datastore-ca", "ca.crt"), "privateKey": ref("datastore-ca", "ca.key")},
			"clientCertificate":    map[string]any{"certificate": ref("datastore-root-client", "tls.crt"), "privateKey": ref("datastore-root-client", "tls.key")},
		},
	})
	poll.Within(t, time.Minute, 200*time.Millisecond, "Kamaji's CRDs established", func() error {
		return cl.Create(ctx, datastore)
	})

	// Kamaji runs as its chart runs it: a pod of its image from the
	// mirror, with its ClusterRole, its webhooks behind a Service.
	deployKamaji(ctx, t, c, cl)
	worker := c.nodes[1]
	version := "v1.30.2"

	// Bad input: a control plane naming a DataStore that does not exist
	// is refused, with its name, before anything is made for it.
	ghost := kamajiObject("TenantControlPlane", "tenants", "ghost", map[string]any{
		"dataStore":    "gone",
		"controlPlane": map[string]any{"deployment": map[string]any{"replicas": int64(1)}, "service": map[string]any{"serviceType": "ClusterIP"}},
		"kubernetes":   map[string]any{"version": version, "kubelet": map[string]any{"cgroupfs": "systemd"}},
	})
	var refused error
	poll.Within(t, time.Minute, time.Second, "the webhooks refusing a TenantControlPlane of a missing DataStore", func() error {
		err := cl.Create(ctx, ghost.DeepCopy())
		if err == nil {
			// Before the API server called the webhooks.
			_ = cl.Delete(ctx, ghost)
			return errors.New("accepted")
		}
		if !strings.Contains(err.Error(), "gone DataStore does not exist") {
			return fmt.Errorf("refused without naming the DataStore: %w", err)
		}
		refused = err
		return nil
	})
	t.Logf("refused: %v", refused)

	// Cluster API and the Kamaji control-plane provider run beside Kamaji.
	startClusterAPI(ctx, t, c)
	mgmt := managementClient(t, c)
	missingDataStore(ctx, t, mgmt, "tenants", version)

	// The tenant: cozy-operator's children for a TenantCluster acme with
	// one control-plane replica, exposed as a ClusterIP Service (which the
	// management cluster's nodes and VMs reach; there is no load-balancer
	// pool here), Konnectivity on (the default), and one node group of
	// one worker. The Kamaji provider makes the
	// TenantControlPlane from the operator's KamajiControlPlane.
	tc := sampleTenant("acme", version)
	tc.UID = "6a1f0c52-2f57-4c38-9d2e-0e3f0a4b7c11"
	cpu0 := machineCPU(t)
	start := time.Now()
	children := applyChildren(ctx, t, mgmt, tc)
	t.Cleanup(func() {
		if t.Failed() {
			out, err := c.kubectl("-n", "tenants", "get", "clusters,kamajicontrolplanes,machinedeployments,machines,kubeadmconfigs,tenantcontrolplanes,deployments,pods,services,secrets", "-o", "wide")
			t.Logf("kubectl get -n tenants:\n%s%v", out, err)
			out, err = c.kubectl("-n", "tenants", "get", "tenantcontrolplane,kamajicontrolplane,cluster", "acme", "-o", "jsonpath={.status}")
			t.Logf("acme's status: %s%v", out, err)
		}
	})
	// Its API answers on its Service as soon as /version does (readable
	// by anyone): what a user waits for, whatever Kamaji's status says yet.
	var apiHost string
	poll.Within(t, 5*time.Minute, time.Second, "the tenant's Service", func() error {
		var svc corev1.Service
		if err := cl.Get(ctx, client.ObjectKey{Namespace: "tenants", Name: "acme"}, &svc); err != nil {
			return err
		}
		if apiHost = svc.Spec.ClusterIP; apiHost == "" || svc.Spec.Type != corev1.ServiceTypeClusterIP {
			return fmt.Errorf("Service acme: %s %q", svc.Spec.Type, apiHost)
		}
		return nil
	})
	apiAddr := net.JoinHostPort(apiHost, "6443")
	anonymous := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
		DialContext:     worker.ns.DialContext,
		TLSClientConfig: &tls.Config{InsecureSkipVerify: true}, // only the time it answers is read
	}}
	answers := func() error {
		resp, err := anonymous.Get("https://" + apiAddr + "/version")
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("/version: %s", resp.Status)
		}
		return nil
	}
	poll.Within(t, 12*time.Minute, 250*time.Millisecond, "the tenant's API answering /version", answers)
	f.apiAnswers, f.apiCPU = time.Since(start), machineCPU(t)-cpu0
	t.Logf("the tenant's API answered %s after cozy-operator's children were applied", f.apiAnswers.Round(100*time.Millisecond))
	poll.Within(t, 12*time.Minute, time.Second, "the TenantControlPlane Ready", func() error {
		u := kamajiObject("TenantControlPlane", "tenants", "acme", nil)
		if err := cl.Get(ctx, client.ObjectKeyFromObject(u), u); err != nil {
			return err
		}
		st, _, _ := unstructured.NestedString(u.Object, "status", "kubernetesResources", "version", "status")
		ver, _, _ := unstructured.NestedString(u.Object, "status", "kubernetesResources", "version", "version")
		if st != "Ready" || ver != version {
			return fmt.Errorf("status.kubernetesResources.version: %q %q", st, ver)
		}
		return nil
	})
	ready := time.Now()
	t.Logf("the TenantControlPlane was Ready %s after cozy-operator's children were applied", ready.Sub(start).Round(time.Second))
	checkClusterAPIControlPlane(ctx, t, mgmt, apiHost, answers)

	// Its control plane runs as pods on the worker, from the mirror's
	// images.
	out, err := c.kubectl("-n", "tenants", "get", "pods", "-o",
		`jsonpath={range .items[*]}{.spec.nodeName} {.status.phase} {range .spec.containers[*]}{.image} {end}{"\n"}{end}`)
	if err != nil {
		t.Fatal(err)
	}
	for _, image := range []string{"kube-apiserver:" + version, "kube-controller-manager:" + version, "kube-scheduler:" + version,
		"kas-network-proxy/proxy-server:" + tenantcluster.KonnectivityVersion} {
		if !strings.Contains(out, worker.name+" Running ") || !strings.Contains(out, "registry.k8s.io/"+image+" ") {
			t.Errorf("no pod on %s runs %s:\n%s", worker.name, image, out)
		}
	}
	// Its API server reaches kubelets only through Konnectivity: Kamaji
	// gives it an egress selector for the cluster's traffic.
	if out, err := c.kubectl("-n", "tenants", "get", "deployment", "acme", "-o",
		`jsonpath={.spec.template.spec.containers[?(@.name=="kube-apiserver")].args}`); err != nil || !strings.Contains(out, "--egress-selector-config-file=") {
		t.Errorf("the tenant's kube-apiserver has no egress selector: %s %v", out, err)
	}

	// Its API answers kubectl, from the LAN, with the admin kubeconfig
	// Kamaji wrote.
	var secret corev1.Secret
	if err := cl.Get(ctx, client.ObjectKey{Namespace: "tenants", Name: "acme-admin-kubeconfig"}, &secret); err != nil {
		t.Fatal(err)
	}
	if want := "server: https://" + apiAddr; !bytes.Contains(secret.Data["admin.conf"], []byte(want)) {
		t.Errorf("acme's admin kubeconfig has no %q", want)
	}
	// tenantKubectlIn runs kubectl with the tenant's admin kubeconfig;
	// the cleanups' own context outlives the test's.
	tenantKubectlIn := tenantKubectl(t, worker, secret.Data["admin.conf"])
	tenantKubectl := func(args ...string) (string, error) { return tenantKubectlIn(ctx, args...) }
	if out, err := tenantKubectl("get", "--raw", "/version"); err != nil || !strings.Contains(out, `"gitVersion": "`+version+`"`) {
		t.Errorf("the tenant's /version: %s %v", out, err)
	}
	// The admin kubeconfig's user is in kubeadm:cluster-admins, which
	// Kamaji binds in the tenant after it reports Ready: until then it is
	// Forbidden.
	poll.Within(t, time.Minute, 500*time.Millisecond, "the tenant's namespaces listed as its admin", func() error {
		out, err := tenantKubectl("get", "ns", "-o", "name")
		if err == nil && !strings.Contains(out, "namespace/kube-system") {
			err = fmt.Errorf("no kube-system in %q", out)
		}
		return err
	})
	t.Logf("its admin listed its namespaces %s after it was Ready", time.Since(ready).Round(100*time.Millisecond))
	// CoreDNS at the operator's pin (Talos's), not Kamaji's default.
	if out, err := tenantKubectl("-n", "kube-system", "get", "deployment", "coredns", "-o", "jsonpath={.spec.template.spec.containers[0].image}"); err != nil ||
		out != tenantcluster.CoreDNSImage+":"+tenantcluster.CoreDNSVersion {
		t.Errorf("the CoreDNS add-on in the tenant: image %q (%v), want %s:%s", out, err, tenantcluster.CoreDNSImage, tenantcluster.CoreDNSVersion)
	}

	// A worker joins it: Cluster API's core makes the node group's
	// Machine, the kubeadm bootstrap provider renders its user-data, and
	// Cozy's worker image boots with it under QEMU.
	vm, workerMachine := joinWorker(ctx, t, mgmt, worker, "tenants", "acme", version, "COZY_KAMAJI_WORKER_IMAGE")
	cpu0, start = machineCPU(t), time.Now()
	poll.Within(t, 10*time.Minute, 2*time.Second, "the worker's Node in the tenant", func() error {
		out, err := tenantKubectl("get", "node", workerMachine, "-o", `jsonpath={.status.nodeInfo.kubeletVersion} {.metadata.labels.cozy\.dev/tenant}`)
		if err != nil {
			return err
		}
		if out != version+" acme" {
			return fmt.Errorf("Node %s: kubelet and tenant label %q", workerMachine, out)
		}
		return nil
	})
	t.Logf("Node %s registered in the tenant %s after the VM started", workerMachine, time.Since(start).Round(time.Second))

	// With a CNI the Node is Ready. The worker pulls flannel through the
	// mirror the operator's user-data names (the lab's images are there).
	flannel := tenantFlannel(t, tc.Spec.Network.PodCIDR, apiHost)
	if out, err := tenantKubectl("apply", "-f", flannel); err != nil {
		t.Fatalf("flannel in the tenant: %s %v", out, err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			out, err := tenantKubectlIn(context.Background(), "get", "nodes,pods", "-A", "-o", "wide")
			t.Logf("the tenant's nodes and pods:\n%s%v", out, err)
			out, err = tenantKubectlIn(context.Background(), "get", "events", "-A")
			t.Logf("the tenant's events:\n%s%v", out, err)
		}
	})
	poll.Within(t, 10*time.Minute, time.Second, "the worker's Node Ready", func() error {
		out, err := tenantKubectl("get", "node", workerMachine, "-o", `jsonpath={.status.conditions[?(@.type=="Ready")].status} {.status.conditions[?(@.type=="Ready")].message}`)
		if err != nil {
			return err
		}
		if !strings.HasPrefix(out, "True ") {
			return fmt.Errorf("Ready: %q", out)
		}
		return nil
	})
	qemuCPU, err := procstat.CPU(vm.PID)
	if err != nil {
		t.Fatal(err)
	}
	f.nodeReady, f.nodeCPU, f.qemuCPU = time.Since(start), machineCPU(t)-cpu0, qemuCPU
	t.Logf("Node %s was Ready %s after the VM started", workerMachine, f.nodeReady.Round(time.Second))
	checkMachineProvisioned(ctx, t, mgmt, tenantKubectl, "tenants", "acme", workerMachine)
	f.machineReady = time.Since(start)
	t.Logf("CAPK linked the Node to its Machine, ready in its MachineDeployment, %s after the VM started", f.machineReady.Round(time.Second))

	// It runs a pod from the mirror (clustertest's probe, which tolerates
	// the taint nothing lifts here: the cloud provider's, as the
	// operator's kubelets run with cloud-provider external and KubeVirt's
	// cloud-controller-manager initialises Cozy's workers), with an
	// address of its Node's pod subnet.
	probeStart := time.Now()
	probes := clustertest.RunProbes(t, tenantKubectl, []string{workerMachine}, 5*time.Minute)
	nodeCIDR, err := tenantKubectl("get", "node", workerMachine, "-o", "jsonpath={.spec.podCIDR}")
	if err != nil {
		t.Fatal(err)
	}
	_, subnet, err := net.ParseCIDR(nodeCIDR)
	if err != nil || len(probes) != 1 || !subnet.Contains(net.ParseIP(probes[0].IP)) {
		t.Fatalf("the probe pods %v are not one with an address of its Node's pod subnet %q (%v)", probes, nodeCIDR, err)
	}
	t.Logf("a pod ran on it %s after it was created", time.Since(probeStart).Round(time.Second))

	// The tenant's API server reaches the worker's kubelet through
	// Konnectivity: its agent runs there, pulled through the mirror, and
	// kubectl logs and exec go through it. The kubelet runs with
	// cloud-provider external and leaves the Node's addresses to the
	// cloud-controller-manager (KubeVirt's, which does not run here): the
	// test sets them as it would, to the VM's own address, which only the
	// VM reaches (QEMU's user network), so a kubelet call that gets there
	// went through the agent.
	addresses := fmt.Sprintf(`{"status":{"addresses":[{"type":"InternalIP","address":%q},{"type":"Hostname","address":%q}]}}`, workertest.GuestIP, workerMachine)
	if out, err := tenantKubectl("patch", "node", workerMachine, "--subresource=status", "--type=merge", "-p", addresses); err != nil {
		t.Fatalf("the Node's addresses: %s %v", out, err)
	}
	poll.Within(t, 5*time.Minute, time.Second, "the Konnectivity agent running on the worker", func() error {
		out, err := tenantKubectl("-n", "kube-system", "get", "pods", "-l", "k8s-app=konnectivity-agent", "-o",
			`jsonpath={range .items[*]}{.spec.nodeName} {.status.phase} {.spec.containers[0].image}{"\n"}{end}`)
		if err != nil {
			return err
		}
		if want := workerMachine + " Running " + tenantcluster.KonnectivityAgentImage + ":" + tenantcluster.KonnectivityVersion; strings.TrimSpace(out) != want {
			return fmt.Errorf("agents %q, want %q", out, want)
		}
		return nil
	})
	poll.Within(t, 2*time.Minute, time.Second, "logs and exec through Konnectivity", func() error {
		out, err := tenantKubectl("logs", probes[0].Name)
		if err != nil {
			return err
		}
		if !strings.Contains(out, "probe up on "+workerMachine) {
			return fmt.Errorf("logs of %s: %q", probes[0].Name, out)
		}
		if out, err = tenantKubectl("exec", probes[0].Name, "--", "cat", "/www/index.html"); err != nil {
			return err
		}
		if strings.TrimSpace(out) != "probe on "+workerMachine {
			return fmt.Errorf("exec in %s: %q", probes[0].Name, out)
		}
		return nil
	})
	t.Logf("logs and exec reached the worker's kubelet through Konnectivity %s after the probe pod was created", time.Since(probeStart).Round(time.Second))

	// An image of a registry the rack's registries.mirror does not stand
	// in for comes through its registries.mirrors endpoint: the hosts.toml
	// the operator's user-data wrote for that host (the host itself does
	// not resolve, so no other way would do).
	pod := filepath.Join(t.TempDir(), "through-mirrors.yaml")
	if err := os.WriteFile(pod, []byte(`apiVersion: v1
kind: Pod
metadata: {name: through-mirrors, namespace: default}
spec:
  tolerations: [{operator: Exists}]
  containers: [{name: busybox, image: `+mirrorsImage+`, command: [sleep, "3600"]}]
`), 0o600); err != nil {
		t.Fatal(err)
	}
	if out, err := tenantKubectl("apply", "-f", pod); err != nil {
		t.Fatalf("%s %v", out, err)
	}
	poll.Within(t, 3*time.Minute, time.Second, "a pod of "+mirrorsImage+" running", func() error {
		out, err := tenantKubectl("get", "pod", "through-mirrors", "-o", `jsonpath={.status.phase} {.status.containerStatuses[0].image}`)
		if err != nil {
			return err
		}
		if out != "Running "+mirrorsImage {
			return fmt.Errorf("pod through-mirrors: %q", out)
		}
		return nil
	})
	t.Logf("a pod of %s ran, pulled through the registries.mirrors endpoint %s", mirrorsImage, mirrorsAddr)

	// Its state is in the DataStore under its own prefix, and its own
	// user may read only that.
	prefix := "/tenants_acme/"
	if n := countKeys(t, ctx, etcd, prefix); n == 0 {
		t.Errorf("no key under %s in the DataStore", prefix)
	}
	if u, err := etcd.UserGet(ctx, "tenants_acme"); err != nil || len(u.Roles) != 1 || u.Roles[0] != "tenants_acme" {
		t.Errorf("the tenant's etcd user: %v %v", u, err)
	}
	// With the client certificate Kamaji issued its API server, the tenant
	// reads its own keys and not a neighbour's (one written by root under
	// the prefix of a tenant "zeta" in the same namespace).
	if _, err := etcd.Put(ctx, "/tenants_zeta/registry/secrets/default/token", "not acme's"); err != nil {
		t.Fatal(err)
	}
	u := kamajiObject("TenantControlPlane", "tenants", "acme", nil)
	if err := cl.Get(ctx, client.ObjectKeyFromObject(u), u); err != nil {
		t.Fatal(err)
	}
	certSecret, _, _ := unstructured.NestedString(u.Object, "status", "storage", "certificate", "secretName")
	var etcdCert corev1.Secret
	if err := cl.Get(ctx, client.ObjectKey{Namespace: "tenants", Name: certSecret}, &etcdCert); err != nil {
		t.Fatalf("acme's DataStore certificate (status.storage.certificate.secretName %q): %v", certSecret, err)
	}
	asAcme := pki.clientWith(t, c.sw.Expose(t, datastoreAddr), etcdCert.Data["server.crt"], etcdCert.Data["server.key"])
	if resp, err := asAcme.Get(ctx, prefix, clientv3.WithPrefix(), clientv3.WithCountOnly()); err != nil || resp.Count == 0 {
		t.Errorf("acme reading its own keys: %v %v", resp, err)
	}
	if resp, err := asAcme.Get(ctx, "/tenants_zeta/registry/secrets/default/token"); err == nil {
		t.Errorf("acme read a key of another tenant's prefix: %v", resp.Kvs)
	}
	if _, err := etcd.Delete(ctx, "/tenants_zeta/", clientv3.WithPrefix()); err != nil {
		t.Fatal(err)
	}

	// Bad input: the DataStore under it cannot be deleted (Kamaji's
	// webhook refuses while a TenantControlPlane uses it), nor the
	// Secrets that DataStore names (hack/kamaji.sh's fix: v1.0.0 let
	// them go).
	if err := cl.Delete(ctx, kamajiObject("DataStore", "", "default", nil)); err == nil || !strings.Contains(err.Error(), "used by") {
		t.Errorf("deleting the DataStore acme uses: %v, want refused", err)
	} else {
		t.Logf("refused: %v", err)
	}
	for _, name := range []string{"datastore-ca", "datastore-root-client"} {
		err := cl.Delete(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "kamaji-system"}})
		if err == nil || !strings.Contains(err.Error(), "cannot be deleted (default)") {
			t.Errorf("deleting the DataStore's Secret %s: %v, want refused", name, err)
		} else {
			t.Logf("refused: %v", err)
		}
	}
	fullDataStore(ctx, t, etcd, tenantKubectl)

	// Deleted: its pods, the Secrets Kamaji made for it, its keys, user
	// and role are gone.
	var secrets corev1.SecretList
	if err := cl.List(ctx, &secrets, client.InNamespace("tenants")); err != nil {
		t.Fatal(err)
	}
	var kamajiSecrets []string
	for _, s := range secrets.Items {
		for _, o := range s.OwnerReferences {
			if o.Kind == "TenantControlPlane" && o.Name == "acme" {
				kamajiSecrets = append(kamajiSecrets, s.Name)
			}
		}
	}
	if len(kamajiSecrets) < 5 {
		t.Errorf("Secrets owned by the TenantControlPlane: %v", kamajiSecrets)
	}
	// Deleted as the garbage collector deletes a TenantCluster's
	// children, all at once: Cluster API takes the Cluster's Machines
	// and its KamajiControlPlane, the provider's TenantControlPlane goes
	// with it, and Kamaji takes down what it made.
	start = time.Now()
	deleteChildren(ctx, t, mgmt, children)
	poll.Within(t, 5*time.Minute, time.Second, "the TenantControlPlane gone", func() error {
		u := kamajiObject("TenantControlPlane", "tenants", "acme", nil)
		if err := cl.Get(ctx, client.ObjectKeyFromObject(u), u); !apierrors.IsNotFound(err) {
			return fmt.Errorf("still there (%v), finalizers %v", err, u.GetFinalizers())
		}
		return nil
	})
	t.Logf("the TenantControlPlane was gone %s after the children's deletion", time.Since(start).Round(time.Second))
	clusterAPIGone(ctx, t, mgmt, "tenants", "acme")
	poll.Within(t, 3*time.Minute, time.Second, "its pods and Secrets gone", func() error {
		var pods corev1.PodList
		var secrets corev1.SecretList
		if err := cl.List(ctx, &pods, client.InNamespace("tenants")); err != nil {
			return err
		}
		if err := cl.List(ctx, &secrets, client.InNamespace("tenants")); err != nil {
			return err
		}
		var left []string
		for _, p := range pods.Items {
			left = append(left, "pod/"+p.Name)
		}
		for _, s := range secrets.Items {
			if slices.Contains(kamajiSecrets, s.Name) {
				left = append(left, "secret/"+s.Name)
			}
		}
		if len(left) > 0 {
			return fmt.Errorf("left: %s", strings.Join(left, " "))
		}
		return nil
	})
	if n := countKeys(t, ctx, etcd, prefix); n != 0 {
		t.Errorf("%d keys under %s after the deletion", n, prefix)
	}
	if _, err := etcd.UserGet(ctx, "tenants_acme"); err == nil {
		t.Error("the tenant's etcd user outlived it")
	}
	if _, err := etcd.RoleGet(ctx, "tenants_acme"); err == nil {
		t.Error("the tenant's etcd role outlived it")
	}
	if withOperator {
		operatorTenant(ctx, t, c, mgmt, worker)
		if n := countKeys(t, ctx, etcd, "/tenants_beta/"); n != 0 {
			t.Errorf("%d keys under /tenants_beta/ after the TenantCluster's deletion", n)
		}
	}
	return f
}

// fullDataStore fills the DataStore to its quota (keys of its root user
// outside any tenant's prefix): the tenant's API then refuses writes
// with etcd's own reason and still serves reads; once the space is
// freed (the filler deleted, the history compacted and defragmented,
// etcd's NOSPACE alarm disarmed, as an operator would), writes go
// through again and nothing written before is lost.
func fullDataStore(ctx context.Context, t *testing.T, etcd *clientv3.Client, tenantKubectl func(args ...string) (string, error)) {
	t.Helper()
	value := strings.Repeat("x", 1<<20)
	var filled error
	for i := 0; i < 2*datastoreQuota>>20 && filled == nil; i++ {
		_, filled = etcd.Put(ctx, fmt.Sprintf("/filler/%03d", i), value)
	}
	if filled == nil || !strings.Contains(filled.Error(), "database space exceeded") {
		t.Fatalf("filling the DataStore: %v", filled)
	}
	before, err := tenantKubectl("get", "ns", "-o", "name")
	if err != nil {
		t.Fatalf("the tenant's namespaces with its DataStore full: %v", err)
	}
	_, err = tenantKubectl("create", "namespace", "while-full")
	if err == nil || !strings.Contains(err.Error(), "database space exceeded") {
		t.Fatalf("a write to the tenant with its DataStore full: %v, want etcd's \"database space exceeded\"", err)
	}
	t.Logf("with the DataStore full, the tenant read its namespaces and refused a write: %v", err)

	resp, err := etcd.Delete(ctx, "/filler/", clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := etcd.Compact(ctx, resp.Header.Revision, clientv3.WithCompactPhysical()); err != nil {
		t.Fatal(err)
	}
	if _, err := etcd.Defragment(ctx, etcd.Endpoints()[0]); err != nil {
		t.Fatal(err)
	}
	if _, err := etcd.AlarmDisarm(ctx, &clientv3.AlarmMember{}); err != nil {
		t.Fatal(err)
	}
	poll.Within(t, time.Minute, time.Second, "a write to the tenant once its DataStore has room", func() error {
		_, err := tenantKubectl("create", "namespace", "after-full")
		return err
	})
	after, err := tenantKubectl("get", "ns", "-o", "name")
	if err != nil {
		t.Fatal(err)
	}
	for _, ns := range strings.Fields(before) {
		if !strings.Contains(after, ns+"\n") {
			t.Errorf("namespace %s lost while the DataStore was full: %q", ns, after)
		}
	}
}

// machineCPU is the CPU the machine has spent busy so far.
func machineCPU(t *testing.T) time.Duration {
	t.Helper()
	d, err := procstat.MachineCPU()
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// deployKamaji runs Kamaji's manager as a Deployment in kamaji-system
// from the image hack/kamaji.sh built (in the mirror), as its chart
// would with the values Cozy's platform gives it: the ClusterRole from
// its module, a ServiceAccount, the webhook server's certificate in a
// Secret (a throwaway CA in place of cert-manager), the webhooks behind
// the Service kamaji-webhook-service, telemetry off, the DataStore
// "default". It returns once the API server calls its webhooks.
func deployKamaji(ctx context.Context, t *testing.T, c *procCluster, cl client.Client) {
	t.Helper()
	const ns, name, service = "kamaji-system", "kamaji", "kamaji-webhook-service"
	role, err := testenv.KamajiClusterRole(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	certs := webhookCerts(t, service+"."+ns+".svc")
	kamaji := manager{namespace: ns, account: name, role: name, image: testenv.KamajiImage,
		args: []string{"manager",
			"--datastore=default", "--disable-telemetry", "--leader-elect=false",
			"--health-probe-bind-address=:8081", "--metrics-bind-address=0",
			"--tmp-directory=/tmp/kamaji", "--webhook-ca-path=/tmp/k8s-webhook-server/serving-certs/ca.crt",
			"--pod-namespace=" + ns, "--serviceaccount-name=" + name, "--webhook-service-name=" + service,
			"--migrate-image=" + testenv.KamajiImage},
		health: 8081, webhookPort: testenv.KamajiWebhookPort, certSecret: name + "-webhook-server-cert", scratch: "/tmp/kamaji"}
	objs := []client.Object{
		role,
		&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: kamaji.certSecret, Namespace: ns}, Data: certs},
		&corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Name: service, Namespace: ns},
			Spec: corev1.ServiceSpec{Selector: map[string]string{"app.kubernetes.io/name": name}, Ports: []corev1.ServicePort{{
				Name: "webhook", Port: 443, TargetPort: intstr.FromInt32(testenv.KamajiWebhookPort)}}},
		},
	}
	for _, o := range append(objs, kamaji.objects()...) {
		if err := cl.Create(ctx, o); err != nil {
			t.Fatalf("create %T %s: %v", o, o.GetName(), err)
		}
	}
	kamaji.logOnFailure(t, c)
	poll.Within(t, 5*time.Minute, time.Second, "Kamaji's pod ready", func() error { return kamaji.ready(c) })
	hooks, err := testenv.KamajiWebhooks(ctx, ns, service, certs["ca.crt"])
	if err != nil {
		t.Fatal(err)
	}
	for _, h := range hooks {
		if err := cl.Create(ctx, h); err != nil {
			t.Fatal(err)
		}
	}
}

// kamajiObject is a Kamaji object (kamaji.clastix.io/v1alpha1).
func kamajiObject(kind, namespace, name string, spec map[string]any) *unstructured.Unstructured {
	u := &unstructured.Unstructured{Object: map[string]any{}}
	u.SetAPIVersion("kamaji.clastix.io/v1alpha1")
	u.SetKind(kind)
	u.SetNamespace(namespace)
	u.SetName(name)
	if spec != nil {
		u.Object["spec"] = spec
	}
	return u
}

func countKeys(t *testing.T, ctx context.Context, etcd *clientv3.Client, prefix string) int64 {
	t.Helper()
	resp, err := etcd.Get(ctx, prefix, clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		t.Fatalf("count the keys under %s: %v", prefix, err)
	}
	return resp.Count
}

// datastorePKI is the DataStore's CA (RSA: Kamaji signs each tenant's
// etcd client certificate with it and reads only PKCS #1 keys), etcd's
// serving certificate and the root user's client certificate, as PEM.
type datastorePKI struct {
	pem map[string][]byte
	dir string
}

func newDatastorePKI(t *testing.T) *datastorePKI {
	t.Helper()
	p := &datastorePKI{pem: map[string][]byte{}, dir: t.TempDir()}
	now := time.Now()
	caKey := p.key(t, "ca.key")
	caTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "datastore-ca"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	p.cert(t, "ca.crt", caTmpl, caTmpl, caKey, caKey)
	host, _, _ := net.SplitHostPort(datastoreAddr)
	for i, leaf := range []struct {
		name  string
		tmpl  x509.Certificate
		usage x509.ExtKeyUsage
	}{
		{"server", x509.Certificate{Subject: pkix.Name{CommonName: "datastore"}, IPAddresses: []net.IP{net.ParseIP(host), net.IPv4(127, 0, 0, 1)}}, x509.ExtKeyUsageServerAuth},
		{"root", x509.Certificate{Subject: pkix.Name{CommonName: "root"}}, x509.ExtKeyUsageClientAuth},
	} {
		tmpl := leaf.tmpl
		tmpl.SerialNumber = big.NewInt(int64(i + 2))
		tmpl.NotBefore, tmpl.NotAfter = now.Add(-time.Hour), now.Add(24*time.Hour)
		tmpl.KeyUsage = x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{leaf.usage}
		p.cert(t, leaf.name+".crt", &tmpl, caTmpl, p.key(t, leaf.name+".key"), caKey)
	}
	return p
}

func (p *datastorePKI) key(t *testing.T, name string) *rsa.PrivateKey {
	t.Helper()
	k, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	p.pem[name] = pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(k)})
	return k
}

func (p *datastorePKI) cert(t *testing.T, name string, tmpl, parent *x509.Certificate, key, parentKey *rsa.PrivateKey) {
	t.Helper()
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, &key.PublicKey, parentKey)
	if err != nil {
		t.Fatal(err)
	}
	p.pem[name] = pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
}

// file writes name's PEM into a file of the test's, for etcd's flags.
func (p *datastorePKI) file(t *testing.T, name string) string {
	t.Helper()
	path := filepath.Join(p.dir, name)
	if err := os.WriteFile(path, p.pem[name], 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// client is an etcd client at addr (host loopback) as the root user.
func (p *datastorePKI) client(t *testing.T, addr string) *clientv3.Client {
	t.Helper()
	return p.clientWith(t, addr, p.pem["root.crt"], p.pem["root.key"])
}

// clientWith is an etcd client at addr as the user certPEM names.
func (p *datastorePKI) clientWith(t *testing.T, addr string, certPEM, keyPEM []byte) *clientv3.Client {
	t.Helper()
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(p.pem["ca.crt"])
	c, err := clientv3.New(clientv3.Config{Endpoints: []string{"https://" + addr}, DialTimeout: 5 * time.Second,
		TLS: &tls.Config{Certificates: []tls.Certificate{cert}, RootCAs: pool, MinVersion: tls.VersionTLS12}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}
