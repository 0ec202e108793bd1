package talosnode

import (
	"flag"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/siderolabs/talos/pkg/machinery/config/config"
	"github.com/siderolabs/talos/pkg/machinery/config/configloader"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"cozy.dev/cozy/bootstrap/rack"
	"cozy.dev/cozy/bootstrap/talosconfig"
)

var update = flag.Bool("update", false, "rewrite the golden files")

// servicesRack is a rack whose configs exercise what the node services
// read: flannel with kube-proxy, a registry mirror, node labels, taints
// and kubelet settings.
const servicesRack = `apiVersion: cozy.dev/v1alpha1
kind: Rack
metadata:
  name: svc
cluster:
  endpoint: https://10.9.0.10:6443
network:
  interface: eth0
  subnet: 10.9.0.0/24
registries:
  mirrors:
    registry.k8s.io: [http://10.9.0.1:5000]
patches:
  - patch:
      cluster:
        network: {cni: {name: flannel}}
        proxy: {disabled: false}
      machine:
        nodeLabels: {rack.example.com/row: "a"}
        nodeTaints: {dedicated: "storage:NoSchedule"}
        kubelet:
          extraArgs: {max-pods: "150"}
          nodeIP: {validSubnets: [10.9.0.0/24]}
machines:
  - hostname: cp1
    role: controlplane
    mac: 52:54:00:09:00:11
    install: {disk: /dev/vda}
    interfaces:
      - mac: 52:54:00:09:00:11
        addresses: [10.9.0.11/24]
  - hostname: w1
    role: worker
    mac: 52:54:00:09:00:21
    install: {disk: /dev/vda}
    interfaces:
      - mac: 52:54:00:09:00:21
        addresses: [10.9.0.21/24]
`

// servicesConfigs are the machine configs of servicesRack, from the
// fixed test secrets, so what is rendered from them is stable.
func servicesConfigs(t *testing.T) map[string]config.Config {
	t.Helper()
	return servicesConfigsEdited(t, "", "")
}

// servicesConfigsEdited is servicesConfigs with old replaced by new in
// the cluster's secrets.
func servicesConfigsEdited(t *testing.T, old, new string) map[string]config.Config {
	t.Helper()
	r, err := rack.Parse([]byte(servicesRack), "rack.yaml", t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	secretsFile := filepath.Join(t.TempDir(), "secrets.yaml")
	data, err := os.ReadFile("../../bootstrap/talosconfig/testdata/secrets.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if old != "" {
		if !strings.Contains(string(data), old) {
			t.Fatalf("the test secrets hold no %q", old)
		}
		data = []byte(strings.Replace(string(data), old, new, 1))
	}
	if err := os.WriteFile(secretsFile, data, 0o600); err != nil {
		t.Fatal(err)
	}
	b, _, err := talosconfig.LoadOrCreateSecrets(secretsFile, nil)
	if err != nil {
		t.Fatal(err)
	}
	gen := &talosconfig.Generator{Rack: r, Secrets: b}
	out := map[string]config.Config{}
	for i := range r.Machines {
		data, err := gen.MachineConfig(&r.Machines[i])
		if err != nil {
			t.Fatal(err)
		}
		mc, err := configloader.NewFromBytes(data)
		if err != nil {
			t.Fatal(err)
		}
		out[r.Machines[i].Hostname] = mc
	}
	return out
}

func golden(t *testing.T, name string, got []byte) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if *update {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test -update)", err)
	}
	if string(want) != string(got) {
		t.Errorf("%s differs from its golden file (go test -update, then review the diff):\n%s", name, got)
	}
}

// The bootstrap manifests are Talos's, object for object: golden, and
// every document decodes into an object.
func TestBootstrapManifests(t *testing.T) {
	mcs := servicesConfigs(t)
	rendered, err := renderManifests(mcs["cp1"])
	if err != nil {
		t.Fatal(err)
	}
	golden(t, "manifests.yaml", rendered)
	objs, err := manifestObjects(rendered)
	if err != nil {
		t.Fatal(err)
	}
	var kinds []string
	for _, o := range objs {
		kinds = append(kinds, o.GetKind()+"/"+o.GetName())
	}
	for _, want := range []string{"Secret/bootstrap-token-", "DaemonSet/kube-flannel", "DaemonSet/kube-proxy", "Deployment/coredns", "Service/kube-dns", "ConfigMap/kubeconfig-in-cluster"} {
		if !slices.ContainsFunc(kinds, func(k string) bool { return strings.HasPrefix(k, want) }) {
			t.Errorf("no %s among %v", want, kinds)
		}
	}
	if strings.Contains(string(rendered), "10.96.0.10") == false {
		t.Errorf("kube-dns is not at the tenth address of the service subnet")
	}
}

// A bootstrap token of digits alone (a CI run drew 208772) still makes a
// Secret the API server takes: its stringData are strings, not numbers.
func TestBootstrapTokenOfDigits(t *testing.T) {
	mcs := servicesConfigsEdited(t, "bootstraptoken: h1ozy0.eze26p6ojregzgag", "bootstraptoken: 208772.1234567890123456")
	rendered, err := renderManifests(mcs["cp1"])
	if err != nil {
		t.Fatal(err)
	}
	objs, err := manifestObjects(rendered)
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range objs {
		if o.GetKind() != "Secret" {
			continue
		}
		var s corev1.Secret
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, &s); err != nil {
			t.Fatalf("%s: %v", o.GetName(), err)
		}
		if s.Name != "bootstrap-token-208772" || s.StringData["token-id"] != "208772" || s.StringData["token-secret"] != "1234567890123456" {
			t.Errorf("bootstrap token Secret %s: %v", s.Name, s.StringData)
		}
		return
	}
	t.Fatal("no Secret among the bootstrap manifests")
}

// The kubelet's config file is Talos's for each role; on the container
// platform it leaves the kernel alone and uses the node's cgroup.
func TestKubeletConfiguration(t *testing.T) {
	mcs := servicesConfigs(t)
	for _, tc := range []struct {
		node       string
		platform   Platform
		cgroupRoot string
	}{
		{"cp1", PlatformMetal, "/"},
		{"w1", PlatformMetal, "/"},
		{"w1", PlatformContainer, "/cozy-node-w1"},
	} {
		t.Run(tc.node+"-"+string(tc.platform), func(t *testing.T) {
			kc, err := kubeletConfiguration(mcs[tc.node], tc.platform, tc.cgroupRoot)
			if err != nil {
				t.Fatal(err)
			}
			data, err := kubeletConfigYAML(kc)
			if err != nil {
				t.Fatal(err)
			}
			golden(t, "kubelet-"+tc.node+"-"+string(tc.platform)+".yaml", data)
		})
	}
}

func TestKubeletArgs(t *testing.T) {
	mcs := servicesConfigs(t)
	args, err := kubeletArgs(mcs["w1"], "w1", netip.MustParseAddr("10.9.0.21"))
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		"--bootstrap-kubeconfig=/etc/kubernetes/bootstrap-kubeconfig", "--cert-dir=/var/lib/kubelet/pki",
		"--config=/etc/kubernetes/kubelet.yaml", "--hostname-override=w1", "--kubeconfig=/etc/kubernetes/kubeconfig-kubelet",
		"--max-pods=150", "--node-ip=10.9.0.21",
	}
	if !slices.Equal(args, want) {
		t.Errorf("args %v\nwant %v", args, want)
	}
}

func TestKubeletNodeIP(t *testing.T) {
	mcs := servicesConfigs(t)
	if ip, err := kubeletNodeIP(mcs["w1"], netip.MustParseAddr("10.9.0.21")); err != nil || ip.String() != "10.9.0.21" {
		t.Errorf("in the valid subnets: %v, %v", ip, err)
	}
	if _, err := kubeletNodeIP(mcs["w1"], netip.MustParseAddr("192.168.1.5")); err == nil || !strings.Contains(err.Error(), "validSubnets") {
		t.Errorf("outside the valid subnets: %v, want an error naming validSubnets", err)
	}
}

// containerd's hosts.toml for a mirror: the endpoint, pull and resolve,
// the registry itself as the fallback.
func TestRegistryHosts(t *testing.T) {
	mcs := servicesConfigs(t)
	files, err := registryHosts(mcs["w1"])
	if err != nil {
		t.Fatal(err)
	}
	got := string(files["registry.k8s.io/hosts.toml"])
	want := `server = "https://registry.k8s.io"

[host."http://10.9.0.1:5000"]
  capabilities = ["pull", "resolve"]
`
	if got != want {
		t.Errorf("hosts.toml:\n%s\nwant:\n%s", got, want)
	}
	for _, tc := range []struct{ in, want string }{{"*", "_default"}, {"10.0.0.1:5000", "10.0.0.1_5000_"}, {"ghcr.io", "ghcr.io"}} {
		if got := hostsDirName(tc.in); got != tc.want {
			t.Errorf("hostsDirName(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

// The Node's labels, annotations and taints follow the config; keys
// someone else set stay, and only owned ones are changed or removed.
func TestNodeSpecApply(t *testing.T) {
	spec := nodeSpec{
		labels:      map[string]string{"role": "db", "zone": "a"},
		annotations: map[string]string{},
		taints:      []corev1.Taint{{Key: "dedicated", Value: "db", Effect: corev1.TaintEffectNoSchedule}},
	}
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{
		Labels:      map[string]string{"zone": "b", "old": "x", "kubernetes.io/hostname": "n1"},
		Annotations: map[string]string{ownedLabels: `["old"]`},
	}}
	if !spec.applyTo(node) {
		t.Fatal("no change reported")
	}
	if node.Labels["role"] != "db" || node.Labels["zone"] != "b" || node.Labels["kubernetes.io/hostname"] != "n1" {
		t.Errorf("labels %v: role added, someone else's zone and hostname kept", node.Labels)
	}
	if _, ok := node.Labels["old"]; ok {
		t.Errorf("an owned label no longer in the config stayed: %v", node.Labels)
	}
	if node.Annotations[ownedLabels] != `["role"]` || node.Annotations[ownedTaints] != `["dedicated"]` {
		t.Errorf("ownership %v", node.Annotations)
	}
	if len(node.Spec.Taints) != 1 || node.Spec.Taints[0].Key != "dedicated" {
		t.Errorf("taints %v", node.Spec.Taints)
	}
	if spec.applyTo(node) {
		t.Error("a second apply changed the node")
	}
	spec.taints = nil
	spec.applyTo(node)
	if len(node.Spec.Taints) != 0 {
		t.Errorf("an owned taint no longer in the config stayed: %v", node.Spec.Taints)
	}
}

func TestMergeArgs(t *testing.T) {
	for _, tc := range []struct {
		name  string
		extra map[string][]string
		want  map[string][]string
		err   string
	}{
		{"replace", map[string][]string{"leader-elect": {"false"}}, map[string][]string{"controllers": {"*,tokencleaner"}, "leader-elect": {"false"}}, ""},
		{"additive", map[string][]string{"controllers": {"bootstrapsigner,*"}}, map[string][]string{"controllers": {"*,tokencleaner,bootstrapsigner"}, "leader-elect": {"true"}}, ""},
		{"denied", map[string][]string{"kubeconfig": {"/x"}}, nil, `extra arg "kubeconfig" is not allowed`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := map[string][]string{"controllers": {"*,tokencleaner"}, "leader-elect": {"true"}}
			err := mergeArgs(args, tc.extra, "cluster.controllerManager.extraArgs", []string{"controllers"}, []string{"kubeconfig"})
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("error %v, want %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			for k, v := range tc.want {
				if !slices.Equal(args[k], v) {
					t.Errorf("%s = %v, want %v", k, args[k], v)
				}
			}
		})
	}
}

// logTail: the last lines of a service's log for the node's own log,
// each cut short, read through the same tailOffset as the Logs API.
func TestLogTail(t *testing.T) {
	long := strings.Repeat("x", 400)
	for _, tc := range []struct {
		content string
		n       int
		want    string
	}{
		{"one\ntwo\nthree\nfour\n", 3, "two\nthree\nfour"},
		{"one\ntwo", 3, "one\ntwo"},
		{"a\n" + long + "\n", 1, strings.Repeat("x", 300) + "…"},
		{"", 3, ""},
	} {
		path := filepath.Join(t.TempDir(), "svc.log")
		if err := os.WriteFile(path, []byte(tc.content), 0o600); err != nil {
			t.Fatal(err)
		}
		if got := logTail(path, tc.n); got != tc.want {
			t.Errorf("logTail(%q, %d) = %q, want %q", tc.content, tc.n, got, tc.want)
		}
	}
	if got := logTail(filepath.Join(t.TempDir(), "missing.log"), 3); got != "" {
		t.Errorf("logTail of a missing file = %q", got)
	}
}
