//go:build integration

package workerimage_test

import (
	"context"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"cozy.dev/cozy/images"
	"cozy.dev/cozy/images/registry"
	"cozy.dev/cozy/internal/testing/netnstest"
	"cozy.dev/cozy/internal/testing/poll"
	"cozy.dev/cozy/internal/testing/prereq"
	"cozy.dev/cozy/internal/testing/syncbuf"
	"cozy.dev/cozy/internal/testing/testenv"
	"cozy.dev/cozy/internal/testing/workertest"
	"cozy.dev/cozy/operators/tenantcluster"
	"cozy.dev/cozy/tenant/workerimage"
)

const (
	version = "v1.36.3"
	// QEMU's user network puts its gateway, which forwards to the host's
	// loopback (here: the test's namespace's), at 10.0.2.2.
	apiAddr = "10.0.2.2"
	token   = "abcdef.0123456789abcdef"
	node    = "acme-md-0-x7k2p"
)

// TestWorkerJoinsWithKubeadm builds Cozy's worker image twice (the same
// digest both times) and pushes it into Cozy's registry, where
// cozy-operator's machine template for a node group points. Against a
// control plane of real processes set up by kubeadm's own phases, as
// Kamaji does for a tenant (PKI, the kubeadm and kubelet ConfigMaps,
// cluster-info), the real Cluster API kubeadm bootstrap provider renders
// the user-data of a worker Machine whose KubeadmConfig is cloned from
// the operator's template, and the image boots under TCG with that
// user-data on a config drive, the cloud-init disk KubeVirt gives the VMs
// CAPK makes (cloudInitConfigDrive). The VM's `kubeadm join` must pass its
// preflight checks, its kubelet must TLS-bootstrap, and the Node must
// register with the version of the image and the group's label.
// Everything runs in a network namespace of its own; the VM reaches the
// API server through QEMU's user network.
func TestWorkerJoinsWithKubeadm(t *testing.T) {
	for _, tool := range []string{"qemu-system-x86_64", "xorriso", "qemu-img"} {
		if _, err := exec.LookPath(tool); err != nil {
			prereq.Missing(t, "%s is not installed (hack/install-deps.sh)", tool)
		}
	}
	assets := testenv.AssetsDir(t)
	for _, b := range []string{"kubeadm", "kube-controller-manager"} {
		if _, err := os.Stat(filepath.Join(assets, b)); err != nil {
			prereq.Missing(t, "KUBEBUILDER_ASSETS=%s has no %s: rebuild with hack/envtest-assets.sh", assets, b)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Minute)
	defer cancel()

	// Two builds, one digest.
	var layouts []string
	for i := range 2 {
		out := filepath.Join(t.TempDir(), "image")
		cmd := exec.CommandContext(ctx, "../../hack/worker-image.sh", version, out)
		cmd.Stderr = testWriter{t}
		if b, err := cmd.Output(); err != nil || strings.TrimSpace(string(b)) != out {
			t.Fatalf("build %d: %v (%q)", i, err, b)
		}
		layouts = append(layouts, out)
	}
	idx0, _ := os.ReadFile(filepath.Join(layouts[0], "index.json"))
	idx1, _ := os.ReadFile(filepath.Join(layouts[1], "index.json"))
	if len(idx0) == 0 || string(idx0) != string(idx1) {
		t.Fatalf("two builds differ:\n%s\n%s", idx0, idx1)
	}
	t.Logf("two builds, one index: %s", idx0)
	target := mirrorIntoRegistry(ctx, t, layouts[0])
	disk := filepath.Join(layouts[0], "disk", workerimage.DiskName(version))

	// The operator's default disk for the group is the image just pushed.
	repo := strings.TrimSuffix(target, ":"+version)
	group := desiredGroup(t, tenantcluster.WorkerImages{Repository: repo, Insecure: true})
	dvts, _, _ := unstructured.NestedSlice(group.MachineTemplate.Object, "spec", "template", "spec", "virtualMachineTemplate", "spec", "dataVolumeTemplates")
	if len(dvts) != 1 {
		t.Fatalf("the operator's machine template has %d data volumes", len(dvts))
	}
	if url, _, _ := unstructured.NestedString(dvts[0].(map[string]any), "spec", "source", "registry", "url"); url != "docker://"+target {
		t.Errorf("the operator's machine template imports %q, want the pushed image docker://%s", url, target)
	}

	ns := netnstest.New(t, "worker")
	ns.IP(t, "addr", "add", apiAddr+"/32", "dev", "lo")
	dir := t.TempDir()
	superAdmin := controlPlane(ctx, t, ns, assets, dir)

	userData := bootstrapUserData(ctx, t, ns, dir, superAdmin, group.BootstrapTemplate)
	if hash := caHash(t, filepath.Join(dir, "pki", "ca.crt")); !strings.Contains(userData, hash) {
		t.Errorf("the provider's user-data does not name the CA hash %s", hash)
	}
	vm := workertest.Boot(ctx, t, ns, dir, disk, workertest.ConfigDrive(t, dir, node, namespace, workertest.FirmwareUUID, userData))

	// The test's own process is outside the namespace: kubectl inside it
	// reads the Node.
	kubectl := func(args ...string) (string, error) {
		out, err := ns.Command(ctx, filepath.Join(assets, "kubectl"), append([]string{"--kubeconfig", superAdmin}, args...)...).CombinedOutput()
		return strings.TrimSpace(string(out)), err
	}
	start := time.Now()
	var info string
	poll.Until(t, ctx, 2*time.Second, "the worker's Node "+node, func() error {
		select {
		case err := <-vm.Exited:
			t.Fatalf("the VM exited: %v", err)
		default:
		}
		out, err := kubectl("get", "node", node, "-o", `jsonpath={.status.nodeInfo.kubeletVersion} {.metadata.labels.cozy\.dev/tenant} {.status.nodeInfo.containerRuntimeVersion} {.status.nodeInfo.kernelVersion}`)
		if err != nil {
			return fmt.Errorf("%v: %s", err, out)
		}
		info = out
		return nil
	})
	t.Logf("Node %s registered %v after the VM started: kubelet, tenant label, runtime, kernel: %s", node, time.Since(start).Round(time.Second), info)
	if f := strings.Fields(info); len(f) < 2 || f[0] != version || f[1] != cluster {
		t.Errorf("Node %s: %q, want kubelet %s and the node group's label cozy.dev/tenant=%s", node, info, version, cluster)
	}
	vm.WaitJoined(ctx, t)
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// controlPlane starts etcd, kube-apiserver and kube-controller-manager in
// ns with the PKI and kubeconfigs kubeadm makes, runs the upload-config
// and bootstrap-token phases of `kubeadm init` against them, and returns
// the super-admin kubeconfig.
func controlPlane(ctx context.Context, t *testing.T, ns *netnstest.NS, assets, dir string) string {
	t.Helper()
	pki := filepath.Join(dir, "pki")
	config := filepath.Join(dir, "kubeadm.yaml")
	// Two copies of one configuration: the PKI is made under the test's
	// directory, while the ClusterConfiguration uploaded for joining nodes
	// names /etc/kubernetes/pki, where kubeadm join puts the CA and the
	// kubelet's configuration expects it.
	kubeadmConfig := func(certs string) string {
		return `apiVersion: kubeadm.k8s.io/v1beta4
kind: InitConfiguration
localAPIEndpoint: {advertiseAddress: ` + apiAddr + `, bindPort: 6443}
nodeRegistration: {name: cp}
bootstrapTokens: [{token: ` + token + `, ttl: 1h}]
---
apiVersion: kubeadm.k8s.io/v1beta4
kind: ClusterConfiguration
kubernetesVersion: ` + version + `
certificatesDir: ` + certs + `
controlPlaneEndpoint: ` + apiAddr + `:6443
networking: {serviceSubnet: 10.96.0.0/12, dnsDomain: cluster.local}
`
	}
	uploaded := filepath.Join(dir, "cluster.yaml")
	if err := os.WriteFile(config, []byte(kubeadmConfig(pki)), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(uploaded, []byte(kubeadmConfig("/etc/kubernetes/pki")), 0o600); err != nil {
		t.Fatal(err)
	}
	kubeadm := func(args ...string) {
		t.Helper()
		cmd := ns.Command(ctx, filepath.Join(assets, "kubeadm"), args...)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("kubeadm %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	kubeadm("init", "phase", "certs", "all", "--config", config)
	kubeadm("init", "phase", "kubeconfig", "super-admin", "--config", config, "--kubeconfig-dir", dir)
	kubeadm("init", "phase", "kubeconfig", "controller-manager", "--config", config, "--kubeconfig-dir", dir)

	start := func(name string, args ...string) {
		t.Helper()
		var out syncbuf.Buffer
		cmd := ns.Command(ctx, filepath.Join(assets, name), args...)
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			cmd.Process.Kill()
			cmd.Wait()
			if t.Failed() {
				t.Logf("%s:\n%s", name, tail(out.String(), 60))
			}
		})
	}
	start("etcd", "--data-dir", filepath.Join(dir, "etcd"), "--listen-client-urls", "http://127.0.0.1:2379",
		"--advertise-client-urls", "http://127.0.0.1:2379", "--listen-peer-urls", "http://127.0.0.1:2380", "--unsafe-no-fsync")
	p := func(f string) string { return filepath.Join(pki, f) }
	start("kube-apiserver", "--advertise-address="+apiAddr, "--bind-address=0.0.0.0", "--secure-port=6443",
		"--etcd-servers=http://127.0.0.1:2379", "--allow-privileged=true", "--authorization-mode=Node,RBAC",
		"--enable-admission-plugins=NodeRestriction", "--enable-bootstrap-token-auth=true",
		"--client-ca-file="+p("ca.crt"), "--tls-cert-file="+p("apiserver.crt"), "--tls-private-key-file="+p("apiserver.key"),
		"--kubelet-client-certificate="+p("apiserver-kubelet-client.crt"), "--kubelet-client-key="+p("apiserver-kubelet-client.key"),
		"--service-account-issuer=https://kubernetes.default.svc.cluster.local", "--service-account-key-file="+p("sa.pub"),
		"--service-account-signing-key-file="+p("sa.key"), "--service-cluster-ip-range=10.96.0.0/12",
		"--requestheader-client-ca-file="+p("front-proxy-ca.crt"), "--requestheader-allowed-names=front-proxy-client",
		"--requestheader-username-headers=X-Remote-User", "--requestheader-group-headers=X-Remote-Group",
		"--requestheader-extra-headers-prefix=X-Remote-Extra-",
		"--proxy-client-cert-file="+p("front-proxy-client.crt"), "--proxy-client-key-file="+p("front-proxy-client.key"))
	superAdmin := filepath.Join(dir, "super-admin.conf")
	poll.Until(t, ctx, time.Second, "the API server", func() error {
		return ns.Command(ctx, filepath.Join(assets, "kubectl"), "--kubeconfig", superAdmin, "get", "--raw", "/readyz").Run()
	})
	// The controller-manager gives up on an API server that does not
	// answer within seconds: it starts once that one is ready.
	cmConf := filepath.Join(dir, "controller-manager.conf")
	start("kube-controller-manager", "--kubeconfig="+cmConf, "--authentication-kubeconfig="+cmConf,
		"--authorization-kubeconfig="+cmConf, "--bind-address=127.0.0.1", "--leader-elect=false",
		"--controllers=*,bootstrapsigner,tokencleaner", "--client-ca-file="+p("ca.crt"), "--root-ca-file="+p("ca.crt"),
		"--cluster-signing-cert-file="+p("ca.crt"), "--cluster-signing-key-file="+p("ca.key"),
		"--service-account-private-key-file="+p("sa.key"), "--use-service-account-credentials=true")

	kubeadm("init", "phase", "upload-config", "kubeadm", "--config", uploaded, "--kubeconfig", superAdmin)
	kubeadm("init", "phase", "upload-config", "kubelet", "--config", uploaded, "--kubeconfig", superAdmin)
	kubeadm("init", "phase", "bootstrap-token", "--config", config, "--kubeconfig", superAdmin)
	// The controller-manager's bootstrap signer signs cluster-info with
	// the token, which kubeadm join checks before trusting the API server.
	poll.Until(t, ctx, time.Second, "cluster-info signed for the token", func() error {
		out, err := ns.Command(ctx, filepath.Join(assets, "kubectl"), "--kubeconfig", superAdmin,
			"-n", "kube-public", "get", "configmap", "cluster-info", "-o", "jsonpath={.data}").Output()
		if err != nil {
			return err
		}
		if id, _, _ := strings.Cut(token, "."); !strings.Contains(string(out), "jws-kubeconfig-"+id) {
			return fmt.Errorf("no signature yet: %s", out)
		}
		return nil
	})
	return superAdmin
}

// caHash is kubeadm's --discovery-token-ca-cert-hash of the CA.
func caHash(t *testing.T, caFile string) string {
	t.Helper()
	data, err := os.ReadFile(caFile)
	if err != nil {
		t.Fatal(err)
	}
	block, _ := pem.Decode(data)
	if block == nil {
		t.Fatalf("%s: no PEM", caFile)
	}
	cert, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(cert.RawSubjectPublicKeyInfo)
	return "sha256:" + hex.EncodeToString(sum[:])
}

func tail(s string, n int) string {
	lines := strings.Split(s, "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// mirrorIntoRegistry pushes the layout as `cozyctl images mirror --from
// DIR` does (all of a layout, without a rack) into Cozy's registry on
// loopback, reads the image back by its manifest digest, and returns its
// name in the registry.
func mirrorIntoRegistry(ctx context.Context, t *testing.T, layout string) string {
	t.Helper()
	reg, err := registry.Listen("127.0.0.1:0", t.TempDir(), slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	rctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- reg.Serve(rctx) }()
	defer func() { stop(); <-done }()
	src, err := images.OpenLayout(layout)
	if err != nil {
		t.Fatal(err)
	}
	addr := reg.Addr().String()
	rs, err := images.Mirror(ctx, images.MirrorOptions{Registry: addr, Insecure: true, Source: src, Refs: src.Refs()})
	if err != nil || len(rs) != 1 || rs[0].Status != images.StatusCopied {
		t.Fatalf("mirror %s: %+v, %v", layout, rs, err)
	}
	ref, err := name.ParseReference(rs[0].Target, name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	desc, err := remote.Get(ref, remote.WithContext(ctx))
	if err != nil || desc.Digest.String() != rs[0].Digest {
		t.Fatalf("pull %s: %v, %v; want %s", rs[0].Target, desc, err, rs[0].Digest)
	}
	t.Logf("mirrored as %s@%s", rs[0].Target, rs[0].Digest)
	return rs[0].Target
}
