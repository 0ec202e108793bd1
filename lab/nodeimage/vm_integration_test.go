//go:build integration

package nodeimage_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/siderolabs/talos/pkg/machinery/client"
	clientconfig "github.com/siderolabs/talos/pkg/machinery/client/config"
	"google.golang.org/grpc"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"cozy.dev/cozy/bootstrap/rack"
	"cozy.dev/cozy/bootstrap/talosapi"
	"cozy.dev/cozy/bootstrap/talosconfig"
	"cozy.dev/cozy/internal/testing/cozyctl"
	"cozy.dev/cozy/internal/testing/netnstest"
	"cozy.dev/cozy/internal/testing/poll"
	"cozy.dev/cozy/internal/testing/prereq"
	"cozy.dev/cozy/internal/testing/syncbuf"
	"cozy.dev/cozy/internal/testing/testenv"
	"cozy.dev/cozy/lab/nodeimage"
)

// The rack of the test: one control plane VM on a private bridge.
const (
	subnet   = "10.76.0"
	serverIP = subnet + ".1"
	vmIP     = subnet + ".10"
	vmMAC    = "52:54:00:76:00:0a"
	vmUUID   = "7a6b5c4d-3e2f-4a1b-8c9d-0e1f2a3b4c5d"
	diskSize = 4 << 30
)

const rackYAML = `apiVersion: cozy.dev/v1alpha1
kind: Rack
metadata: {name: vmtest}
network:
  interface: br0
  subnet: ` + subnet + `.0/24
  dhcp: {mode: full, range: ` + subnet + `.100-` + subnet + `.199}
machines:
  - hostname: cp1
    role: controlplane
    mac: "` + vmMAC + `"
    install: {disk: /dev/vda}
    interfaces:
      - {mac: "` + vmMAC + `", addresses: [` + vmIP + `/24]}
`

// TestNodeVM PXE-boots the node image in a QEMU VM (TCG, SeaBIOS, a
// blank qcow2 disk, 3 GiB) from `cozyctl pxe serve --rack` in full DHCP
// mode, finds it in maintenance mode with the VM's hardware through
// Talos's client, applies a config from Cozy's generator, and finds it
// configured after a real reboot of the VM (netbooted again, config read
// from its disk). It bootstraps etcd and kube-apiserver inside the VM and
// reads /version through the node's kubeconfig; then a Shutdown through
// the API powers the VM off. The node runs API-only (cozy.api_only, as
// the lab under TCG) on one vCPU: with two, a cold CI run's reboot once
// hung in the kernel's i8042 probe, and the node services are shown by
// the process tier (lab/talosnode's TestClusterRunsPods).
func TestNodeVM(t *testing.T) {
	for _, bin := range []string{"qemu-system-x86_64", "qemu-img"} {
		if _, err := exec.LookPath(bin); err != nil {
			prereq.Missing(t, "%s is not installed (see hack/install-deps.sh)", bin)
		}
	}
	inputs := nodeimage.Options{
		KernelDir:     testenv.BuiltDir(t, "COZY_BOOT_ASSETS", "hack/boot-assets.sh", "vmlinuz"),
		KubernetesDir: testenv.AssetsDir(t),
		RuntimeDir:    testenv.BuiltDir(t, "COZY_NODE_ASSETS", "hack/node-assets.sh", "bin/containerd"),
	}
	if _, err := os.Stat("/bin/busybox"); err != nil {
		prereq.Missing(t, "static busybox (Debian busybox-static): %v", err)
	}
	ns := netnstest.New(t, "nodevm")
	dir := t.TempDir()
	logDir := dir
	if d := os.Getenv("COZY_TEST_ARTIFACTS"); d != "" {
		logDir = filepath.Join(d, "nodeimage-vm")
		if err := os.MkdirAll(logDir, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	serial := filepath.Join(logDir, "cp1-serial.log")
	_ = os.Remove(serial) // QEMU appends: a log from an earlier run would confuse the boot count

	start := time.Now()
	img := buildImage(t, dir, inputs)
	t.Logf("node image %s: initramfs %d MiB, built in %s", img.Key, fileSize(t, img.Initrd)>>20, time.Since(start).Round(time.Millisecond))

	ns.IP(t, "link", "add", "br0", "type", "bridge")
	ns.IP(t, "addr", "add", serverIP+"/24", "dev", "br0")
	ns.IP(t, "link", "set", "br0", "up")
	ns.IP(t, "tuntap", "add", "tap0", "mode", "tap")
	ns.IP(t, "link", "set", "tap0", "master", "br0", "up")

	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	rackFile := filepath.Join(dir, "rack.yaml")
	if err := os.WriteFile(rackFile, []byte(rackYAML), 0o644); err != nil {
		t.Fatal(err)
	}
	serverLog := &syncbuf.Buffer{}
	srv := ns.Command(ctx, cozyctl.Path(t), "pxe", "serve", "--rack", rackFile, "--state-dir", filepath.Join(dir, "pxe"),
		"--kernel", img.Kernel, "--initrd", img.Initrd, "--cmdline", img.Cmdline+" "+nodeimage.APIOnlyArg+" "+nodeimage.TCGArgs)
	srv.Stderr = serverLog
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		_ = srv.Process.Signal(syscall.SIGTERM)
		_ = srv.Wait()
		if t.Failed() {
			t.Logf("--- netboot server log (tail):\n%s", tail(serverLog.String(), 6000))
		}
	}()

	disk := filepath.Join(dir, "cp1.qcow2")
	if out, err := exec.Command("qemu-img", "create", "-q", "-f", "qcow2", disk, fmt.Sprint(diskSize)).CombinedOutput(); err != nil {
		t.Fatalf("qemu-img create: %v: %s", err, out)
	}
	qemuErr := &syncbuf.Buffer{}
	qemu := ns.Command(ctx, "qemu-system-x86_64",
		"-accel", "tcg", // KVM breaks real-mode firmware on these machines (DESIGN.md)
		"-machine", "pc", "-m", "3072", "-smp", "1", "-uuid", vmUUID,
		"-display", "none", "-monitor", "none", "-serial", "file:"+serial,
		"-netdev", "tap,id=n0,ifname=tap0,script=no,downscript=no",
		"-device", "virtio-net-pci,netdev=n0,mac="+vmMAC,
		"-drive", "file="+disk+",format=qcow2,if=virtio",
		"-boot", "order=n") // no -no-reboot: a reboot netboots again
	qemu.Stderr = qemuErr
	vmStart := time.Now()
	if err := qemu.Start(); err != nil {
		t.Fatal(err)
	}
	qemuDone := make(chan error, 1)
	go func() { qemuDone <- qemu.Wait() }()
	defer func() {
		select {
		case <-qemuDone:
		default:
			_ = qemu.Process.Kill()
			<-qemuDone
		}
		if t.Failed() {
			b, _ := os.ReadFile(serial)
			t.Logf("--- serial console (tail):\n%s\n--- qemu stderr:\n%s", tail(string(b), 6000), qemuErr.String())
		}
	}()

	endpoint := talosapi.Endpoint(mustAddr(vmIP), 0)
	dial := grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
		return ns.DialContext(ctx, "tcp", addr)
	})

	// Maintenance mode, with the VM's hardware.
	var facts talosapi.Facts
	poll.Until(t, ctx, time.Second, "the node in maintenance mode", eachTry(ctx, func(ctx context.Context) error {
		c, err := maintenanceClient(ctx, endpoint, dial)
		if err != nil {
			return err
		}
		defer c.Close()
		facts, err = talosapi.ReadFacts(ctx, c)
		if err == nil && facts.Stage != "maintenance" {
			return fmt.Errorf("stage %s", facts.Stage)
		}
		return err
	}))
	t.Logf("maintenance API answered %s after the VM started", time.Since(vmStart).Round(time.Second))
	if facts.UUID != vmUUID {
		t.Errorf("SMBIOS UUID %q, want the VM's %s", facts.UUID, vmUUID)
	}
	if !hasDisk(facts, "/dev/vda", diskSize) {
		t.Errorf("disks %+v, want /dev/vda of %d bytes (the qcow2's size)", facts.Disks, diskSize)
	}
	if !hasLink(facts, vmMAC) {
		t.Errorf("links %+v, want one with the VM's MAC %s", facts.Links, vmMAC)
	}

	// Apply a config from Cozy's generator: the node installs it to its
	// disk and the VM reboots into configured mode.
	r, err := rack.Parse([]byte(rackYAML), "rack.yaml", dir)
	if err != nil {
		t.Fatal(err)
	}
	bundle, _, err := talosconfig.LoadOrCreateSecrets(filepath.Join(dir, talosconfig.SecretsFile), nil)
	if err != nil {
		t.Fatal(err)
	}
	gen := &talosconfig.Generator{Rack: r, Secrets: bundle}
	machineConfig, err := gen.MachineConfig(&r.Machines[0])
	if err != nil {
		t.Fatal(err)
	}
	tc, err := gen.Talosconfig()
	if err != nil {
		t.Fatal(err)
	}
	applied := time.Now()
	func() {
		c, err := maintenanceClient(ctx, endpoint, dial)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if err := talosapi.Apply(ctx, c, machineConfig); err != nil {
			t.Fatalf("apply the machine config: %v", err)
		}
	}()
	var version string
	poll.Until(t, ctx, time.Second, "the node in configured mode", eachTry(ctx, func(ctx context.Context) error {
		c, err := secureClient(ctx, tc, endpoint, dial)
		if err != nil {
			return err
		}
		defer c.Close()
		f, err := talosapi.ReadFacts(ctx, c)
		if err == nil && f.Stage != "running" {
			return fmt.Errorf("stage %s", f.Stage)
		}
		version = f.Version
		return err
	}))
	t.Logf("configured mode (Talos %s) %s after the config was applied, %s after the VM started",
		version, time.Since(applied).Round(time.Second), time.Since(vmStart).Round(time.Second))
	if version == "" {
		t.Error("Version gave no tag in configured mode")
	}
	log, _ := os.ReadFile(serial)
	for _, line := range []string{"cozy-node: ", "rebooting", "boot 1 of this disk", "boot 2 of this disk", "level=INFO msg=\"configured mode\""} {
		if !bytes.Contains(log, []byte(line)) {
			t.Errorf("serial console lacks %q: the VM did not reboot into configured mode", line)
		}
	}
	script := "path=/ipxe/" + strings.ReplaceAll(vmMAC, ":", "-") + ".ipxe"
	if n := countLines(serverLog.String(), script, "agent=iPXE"); n < 2 {
		t.Errorf("iPXE fetched the VM's script %d times, want 2: the reboot did not netboot", n)
	}

	// Bootstrap: etcd and kube-apiserver from the initramfs, data on vda.
	bootstrapped := time.Now()
	var kubeconfig []byte
	func() {
		c, err := secureClient(ctx, tc, endpoint, dial)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if err := talosapi.Bootstrap(ctx, c); err != nil {
			t.Fatalf("Bootstrap: %v", err)
		}
		if kubeconfig, err = c.Kubeconfig(ctx); err != nil {
			t.Fatalf("Kubeconfig: %v", err)
		}
	}()
	poll.Until(t, ctx, time.Second, "an etcd member", eachTry(ctx, func(ctx context.Context) error {
		c, err := secureClient(ctx, tc, endpoint, dial)
		if err != nil {
			return err
		}
		defer c.Close()
		members, err := talosapi.EtcdMembers(ctx, c)
		if err == nil && len(members) != 1 {
			return fmt.Errorf("members %v", members)
		}
		return err
	}))
	t.Logf("etcd member %s after Bootstrap", time.Since(bootstrapped).Round(time.Second))
	poll.Until(t, ctx, time.Second, "kube-apiserver /version", eachTry(ctx, func(ctx context.Context) error {
		rc, err := clientcmd.RESTConfigFromKubeConfig(kubeconfig)
		if err != nil {
			return err
		}
		rc.Dial = ns.DialContext
		rc.Timeout = 10 * time.Second
		cs, err := kubernetes.NewForConfig(rc)
		if err != nil {
			return err
		}
		v, err := cs.Discovery().ServerVersion()
		if err == nil {
			t.Logf("kube-apiserver %s", v.GitVersion)
		}
		return err
	}))
	t.Logf("kube-apiserver answered %s after Bootstrap", time.Since(bootstrapped).Round(time.Second))

	// Shutdown powers the VM off: QEMU exits by itself.
	func() {
		c, err := secureClient(ctx, tc, endpoint, dial)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if err := c.Shutdown(ctx); err != nil {
			t.Fatalf("Shutdown: %v", err)
		}
	}()
	select {
	case err := <-qemuDone:
		if err != nil {
			t.Errorf("QEMU after the VM powered off: %v", err)
		}
		qemuDone <- err // for the deferred cleanup
	case <-time.After(2 * time.Minute):
		t.Error("the VM did not power off after Shutdown")
	}
}

// buildImage builds cozy-talos-node statically, as make build does, and
// the image from it and o's inputs, in dir.
func buildImage(t *testing.T, dir string, o nodeimage.Options) *nodeimage.Image {
	t.Helper()
	node := filepath.Join(dir, "cozy-talos-node")
	cmd := exec.Command("go", "build", "-trimpath", "-ldflags=-s -w", "-o", node, "cozy.dev/cozy/cmd/cozy-talos-node")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build cozy-talos-node: %v\n%s", err, out)
	}
	o.NodeBinary, o.CacheDir = node, filepath.Join(dir, "images")
	img, err := nodeimage.Build(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	return img
}

func maintenanceClient(ctx context.Context, endpoint string, dial grpc.DialOption) (*client.Client, error) {
	// talosapi.Maintenance's client, dialing inside the namespace.
	return client.New(ctx, client.WithEndpoints(endpoint),
		client.WithTLSConfig(&tls.Config{InsecureSkipVerify: true}), //nolint:gosec // maintenance mode
		client.WithGRPCDialOptions(dial))
}

func secureClient(ctx context.Context, tc *clientconfig.Config, endpoint string, dial grpc.DialOption) (*client.Client, error) {
	// talosapi.Secure's client, dialing inside the namespace.
	return client.New(ctx, client.WithConfig(tc), client.WithEndpoints(endpoint), client.WithGRPCDialOptions(dial))
}

// eachTry gives every try of f its own 10 s deadline within ctx, so that
// one hung attempt does not use up the wait.
func eachTry(ctx context.Context, f func(context.Context) error) func() error {
	return func() error {
		tryCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		return f(tryCtx)
	}
}

func hasDisk(f talosapi.Facts, path string, size uint64) bool {
	for _, d := range f.Disks {
		if d.DevPath == path && d.Size == size {
			return true
		}
	}
	return false
}

func hasLink(f talosapi.Facts, mac string) bool {
	for _, l := range f.Links {
		if l.MAC == mac {
			return true
		}
	}
	return false
}

func countLines(log string, subs ...string) int {
	n := 0
	for _, line := range strings.Split(log, "\n") {
		all := true
		for _, s := range subs {
			all = all && strings.Contains(line, s)
		}
		if all {
			n++
		}
	}
	return n
}

func mustAddr(s string) netip.Addr { return netip.MustParseAddr(s) }

func fileSize(t *testing.T, path string) int64 {
	t.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Size()
}

func tail(s string, n int) string {
	if len(s) > n {
		s = s[len(s)-n:]
	}
	return s
}
