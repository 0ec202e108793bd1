// Package workertest joins a tenant worker the way Cluster API does, for
// integration tests: the real kubeadm bootstrap provider renders a
// Machine's user-data from cozy-operator's KubeadmConfigTemplate, and
// Cozy's worker image boots under QEMU with it on a config drive or a
// NoCloud seed, as KubeVirt would attach it.
package workertest

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/utils/ptr"
	bootstrapv1 "sigs.k8s.io/cluster-api/api/bootstrap/kubeadm/v1beta2"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"cozy.dev/cozy/internal/testing/netnstest"
	"cozy.dev/cozy/internal/testing/poll"
	"cozy.dev/cozy/internal/testing/syncbuf"
)

// Scheme knows the kinds RenderUserData writes.
func Scheme(t testing.TB) *runtime.Scheme {
	t.Helper()
	scheme := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{clientgoscheme.AddToScheme, clusterv1.AddToScheme, bootstrapv1.AddToScheme} {
		if err := add(scheme); err != nil {
			t.Fatal(err)
		}
	}
	return scheme
}

// Machine is a worker Machine of a tenant cluster, and what the control
// plane provider would have written for its cluster.
type Machine struct {
	Namespace, Cluster, Name, Version string
	// Endpoint is the tenant API's address and port, the Cluster's
	// controlPlaneEndpoint.
	Host string
	Port int32
	// CACert, CAKey and Kubeconfig are the tenant's CA and an admin
	// kubeconfig, which the control plane provider copies into the
	// Cluster's -ca and -kubeconfig Secrets. Without CACert the -ca
	// Secret is the control plane's own (Kamaji's NAME-ca holds tls.crt
	// and tls.key for Cluster API, and its provider leaves it be).
	CACert, CAKey, Kubeconfig []byte
	// BootstrapTemplate is cozy-operator's KubeadmConfigTemplate for the
	// Machine's node group.
	BootstrapTemplate *unstructured.Unstructured
}

// RenderUserData writes, through c (into a management cluster where the
// kubeadm bootstrap provider's manager runs), what Cluster API and the
// control plane provider would have for m: the -ca and -kubeconfig
// Secrets, the Cluster (its infrastructure provisioned, its control plane
// initialised), the Machine and its KubeadmConfig cloned from the
// template. It waits for the provider's cloud-config and returns it. The
// provider does the rest: a bootstrap token in the tenant cluster, the
// CA hash, the join configuration.
func RenderUserData(ctx context.Context, t *testing.T, c client.Client, m Machine) string {
	t.Helper()
	create := func(obj client.Object) {
		t.Helper()
		if err := c.Create(ctx, obj); err != nil {
			t.Fatalf("create %T %s: %v", obj, obj.GetName(), err)
		}
	}
	labels := map[string]string{clusterv1.ClusterNameLabel: m.Cluster}
	if m.CACert != nil {
		create(&corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Name: m.Cluster + "-ca", Namespace: m.Namespace, Labels: labels},
			Type:       clusterv1.ClusterSecretType,
			Data:       map[string][]byte{corev1.TLSCertKey: m.CACert, corev1.TLSPrivateKeyKey: m.CAKey},
		})
	}
	create(&corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: m.Cluster + "-kubeconfig", Namespace: m.Namespace, Labels: labels},
		Type:       clusterv1.ClusterSecretType,
		Data:       map[string][]byte{"value": m.Kubeconfig},
	})
	cl := &clusterv1.Cluster{
		ObjectMeta: metav1.ObjectMeta{Name: m.Cluster, Namespace: m.Namespace},
		Spec:       clusterv1.ClusterSpec{ControlPlaneEndpoint: clusterv1.APIEndpoint{Host: m.Host, Port: m.Port}},
	}
	create(cl)
	cl.Status.Initialization.InfrastructureProvisioned = ptr.To(true)
	cl.Status.Initialization.ControlPlaneInitialized = ptr.To(true)
	cl.Status.Conditions = []metav1.Condition{{
		Type: clusterv1.ClusterControlPlaneInitializedCondition, Status: metav1.ConditionTrue,
		Reason: clusterv1.ClusterControlPlaneInitializedReason, LastTransitionTime: metav1.Now(),
	}}
	if err := c.Status().Update(ctx, cl); err != nil {
		t.Fatal(err)
	}

	// A Machine of the node group, as its MachineSet would make it, with
	// the KubeadmConfig cloned from the operator's template.
	machine := &clusterv1.Machine{
		ObjectMeta: metav1.ObjectMeta{Name: m.Name, Namespace: m.Namespace, Labels: labels},
		Spec: clusterv1.MachineSpec{
			ClusterName: m.Cluster, Version: m.Version,
			Bootstrap: clusterv1.Bootstrap{ConfigRef: clusterv1.ContractVersionedObjectReference{
				APIGroup: bootstrapv1.GroupVersion.Group, Kind: "KubeadmConfig", Name: m.Name}},
			InfrastructureRef: clusterv1.ContractVersionedObjectReference{
				APIGroup: "infrastructure.cluster.x-k8s.io", Kind: "KubevirtMachine", Name: m.Name},
		},
	}
	create(machine)
	spec, found, err := unstructured.NestedMap(m.BootstrapTemplate.Object, "spec", "template", "spec")
	if err != nil || !found {
		t.Fatalf("the operator's KubeadmConfigTemplate has no spec.template.spec: %v", err)
	}
	kc := &unstructured.Unstructured{Object: map[string]any{"spec": spec}}
	kc.SetAPIVersion(bootstrapv1.GroupVersion.String())
	kc.SetKind("KubeadmConfig")
	kc.SetName(m.Name)
	kc.SetNamespace(m.Namespace)
	kc.SetLabels(labels)
	kc.SetOwnerReferences([]metav1.OwnerReference{{
		APIVersion: clusterv1.GroupVersion.String(), Kind: "Machine", Name: machine.Name, UID: machine.UID, Controller: ptr.To(true),
	}})
	create(kc)

	start := time.Now()
	var cfg bootstrapv1.KubeadmConfig
	poll.Until(t, ctx, time.Second, "the bootstrap provider's data Secret", func() error {
		if err := c.Get(ctx, client.ObjectKey{Namespace: m.Namespace, Name: m.Name}, &cfg); err != nil {
			return err
		}
		if cfg.Status.DataSecretName == "" {
			var why []string
			for _, cond := range cfg.Status.Conditions {
				why = append(why, cond.Type+"="+string(cond.Status)+" "+cond.Reason+" "+cond.Message)
			}
			return fmt.Errorf("no data Secret yet: %v", why)
		}
		return nil
	})
	var data corev1.Secret
	if err := c.Get(ctx, client.ObjectKey{Namespace: m.Namespace, Name: cfg.Status.DataSecretName}, &data); err != nil {
		t.Fatal(err)
	}
	if f := string(data.Data["format"]); f != string(bootstrapv1.CloudConfig) {
		t.Fatalf("data Secret %s: format %q, want cloud-config", data.Name, f)
	}
	joinArgs := cfg.Spec.JoinConfiguration.NodeRegistration.KubeletExtraArgs
	if !slices.ContainsFunc(joinArgs, func(a bootstrapv1.Arg) bool { return a.Name == "node-labels" }) {
		t.Errorf("KubeadmConfig %s: kubelet arguments %v lack the group's node-labels", m.Name, joinArgs)
	}
	t.Logf("the kubeadm bootstrap provider rendered %s's user-data (%d bytes) in %v",
		m.Name, len(data.Data["value"]), time.Since(start).Round(time.Second))
	return string(data.Data["value"])
}

// Seed makes the seed KubeVirt would attach for machine of namespace: an
// ISO 9660 volume labelled cidata with meta-data (CAPK names the VM, and
// so the host, after the Machine) and the user-data.
func Seed(t testing.TB, dir, machine, namespace, userData string) string {
	t.Helper()
	return iso(t, dir, "cidata", map[string]string{
		"user-data": userData,
		"meta-data": "instance-id: " + machine + "." + namespace + "\nlocal-hostname: " + machine + "\n",
	})
}

// ConfigDrive makes the config drive KubeVirt attaches to the VM vm of
// namespace for a cloudInitConfigDrive volume (CAPK's VMs have one): an
// ISO 9660 volume labelled config-2 with openstack/latest/meta_data.json
// (its instance_id, hostname and uuid, as virt-launcher writes them) and
// user_data.
func ConfigDrive(t testing.TB, dir, vm, namespace, uuid, userData string) string {
	t.Helper()
	meta, err := json.Marshal(map[string]string{"instance_id": vm + "." + namespace, "hostname": vm, "uuid": uuid})
	if err != nil {
		t.Fatal(err)
	}
	return iso(t, dir, "config-2", map[string]string{
		"openstack/latest/user_data":      userData,
		"openstack/latest/meta_data.json": string(meta),
	})
}

// iso writes files into an ISO 9660 volume labelled label in dir, with
// xorriso as virt-launcher makes it, and returns its path.
func iso(t testing.TB, dir, label string, files map[string]string) string {
	t.Helper()
	src := filepath.Join(dir, label)
	for name, data := range files {
		p := filepath.Join(src, filepath.FromSlash(name))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(data), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	out := filepath.Join(dir, label+".iso")
	if b, err := exec.Command("xorriso", "-as", "mkisofs", "-quiet", "-o", out, "-V", label, "-J", "-r", src).CombinedOutput(); err != nil {
		t.Fatalf("xorriso: %v\n%s", err, b)
	}
	return out
}

// VM is a worker VM that Boot started.
type VM struct {
	// Serial is the file its serial console writes.
	Serial string
	// Exited receives QEMU's exit, if it ends before the test.
	Exited <-chan error
	// PID is QEMU's process, whose CPU time is the VM's.
	PID int
}

// FirmwareUUID is the worker VM's SMBIOS UUID, which KubeVirt also
// writes as a config drive's uuid.
const FirmwareUUID = "1f0e2d3c-4b5a-4697-8877-665544332211"

// GuestIP is the worker VM's address: the first QEMU's user network
// (net 10.0.2.0/24) hands out. Nothing outside the VM reaches it.
const GuestIP = "10.0.2.15"

// Boot starts the worker image's disk (read-only, as a containerDisk's
// base) with seed under TCG in ns, its network QEMU's user network,
// which reaches what ns reaches, until the test ends; if the test fails,
// its serial log is logged.
func Boot(ctx context.Context, t testing.TB, ns *netnstest.NS, dir, disk, seed string) VM {
	t.Helper()
	serial := filepath.Join(dir, "serial.log")
	var qemuOut syncbuf.Buffer
	qemu := ns.Command(ctx, "qemu-system-x86_64", "-accel", "tcg", "-machine", "pc", "-cpu", "max",
		"-m", "2048", "-smp", "2", "-display", "none", "-no-user-config", "-nodefaults",
		"-serial", "file:"+serial,
		"-drive", "file="+disk+",if=virtio,format=qcow2,readonly=on",
		"-drive", "file="+seed+",if=virtio,format=raw,readonly=on",
		"-netdev", "user,id=n0,net=10.0.2.0/24", "-device", "virtio-net-pci,netdev=n0",
		"-uuid", FirmwareUUID)
	qemu.Stdout, qemu.Stderr = &qemuOut, &qemuOut
	if err := qemu.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	done := make(chan struct{})
	go func() { exited <- qemu.Wait(); close(done) }()
	t.Cleanup(func() {
		qemu.Process.Kill()
		<-done
		if t.Failed() {
			log, _ := os.ReadFile(serial)
			t.Logf("VM serial log:\n%s\nQEMU: %s", log, qemuOut.String())
		}
	})
	return VM{Serial: serial, Exited: exited, PID: qemu.Process.Pid}
}

// WaitJoined waits for the worker agent's report that kubeadm join
// succeeded (its success line, then the agent's), and fails the test if
// the serial log shows a failed command.
func (vm VM) WaitJoined(ctx context.Context, t testing.TB) {
	t.Helper()
	poll.Until(t, ctx, 2*time.Second, "kubeadm join's success in the serial log", func() error {
		log, _ := os.ReadFile(vm.Serial)
		for _, want := range []string{"This node has joined the cluster", "cozy-worker: seed applied"} {
			if !strings.Contains(string(log), want) {
				return fmt.Errorf("no %q yet", want)
			}
		}
		return nil
	})
	log, _ := os.ReadFile(vm.Serial)
	for _, bad := range []string{"runcmd 1 failed", "FATAL"} {
		if strings.Contains(string(log), bad) {
			t.Errorf("serial log has %q", bad)
		}
	}
}
