//go:build integration

package talosnode_test

import (
	"context"
	stdx509 "crypto/x509"
	"encoding/base64"
	"encoding/pem"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/siderolabs/talos/pkg/machinery/api/machine"
	"github.com/siderolabs/talos/pkg/machinery/client"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/yaml"

	"cozy.dev/cozy/internal/testing/poll"
	"cozy.dev/cozy/internal/testing/testenv"
	"cozy.dev/cozy/lab/talosnode"
)

// TestBootstrap drives a control plane as bootstrap does: apply the
// config, bootstrap etcd, fetch the kubeconfig and reach the real
// kube-apiserver through it; then kills and restarts the node's process
// and resets it.
func TestBootstrap(t *testing.T) {
	assets := testenv.AssetsDir(t)
	addr := loopbackAddress(t)
	stateDir := t.TempDir()
	n := startNodeProcess(t, addr, stateDir, assets)
	logs := []string{n.log}
	cl := newCluster(t, addr)
	tc := cl.talosconfig(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()

	waitMaintenance(t, n)
	applied := cl.machineConfig(t, "cp1")
	if _, err := insecureClient(t, n.endpoint()).ApplyConfiguration(ctx, &machine.ApplyConfigurationRequest{
		Data: applied, Mode: machine.ApplyConfigurationRequest_REBOOT,
	}); err != nil {
		t.Fatalf("ApplyConfiguration: %v", err)
	}
	waitConfigured(t, n, tc)

	c := configClient(t, tc, n.endpoint())
	if _, err := c.EtcdMemberList(ctx, &machine.EtcdMemberListRequest{}); codeOf(err) != "Unavailable" {
		t.Errorf("EtcdMemberList before bootstrap: %v, want Unavailable", err)
	}
	if pids := controlPlanePIDs(t, stateDir); len(pids) != 0 {
		t.Errorf("etcd or kube-apiserver runs before bootstrap: %v", pids)
	}

	if err := c.Bootstrap(ctx, &machine.BootstrapRequest{}); err != nil {
		t.Fatalf("Bootstrap: %v", err)
	}
	assertBootstrapRefused(ctx, t, c)

	poll.Within(t, 2*time.Minute, 100*time.Millisecond, "etcd lists its member", func() error {
		resp, err := configClient(t, tc, n.endpoint()).EtcdMemberList(ctx, &machine.EtcdMemberListRequest{})
		if err != nil {
			return err
		}
		ms := resp.GetMessages()[0].GetMembers()
		if len(ms) != 1 {
			return fmt.Errorf("%d members", len(ms))
		}
		wantPeer := "https://" + net.JoinHostPort(addr.String(), "2380")
		if ms[0].GetHostname() != "cp1" || !slices.Equal(ms[0].GetPeerUrls(), []string{wantPeer}) || ms[0].GetId() == 0 {
			return fmt.Errorf("member %v, want cp1 at %s", ms[0], wantPeer)
		}
		return nil
	})

	kubeconfig, err := c.Kubeconfig(ctx)
	if err != nil {
		t.Fatalf("Kubeconfig: %v", err)
	}
	assertTalosKubeconfig(t, kubeconfig, addr)
	waitAPIServer(t, kubeconfig)

	t.Run("a killed node's etcd and kube-apiserver die with it", func(t *testing.T) {
		n.kill(t)
		poll.Within(t, 30*time.Second, 100*time.Millisecond, "etcd and kube-apiserver gone", func() error {
			if pids := controlPlanePIDs(t, stateDir); len(pids) > 0 {
				return fmt.Errorf("still running: %v", pids)
			}
			return nil
		})
	})

	parent := t
	t.Run("restarted from its disk, the node runs them again", func(t *testing.T) {
		n = startNodeProcess(parent, addr, stateDir, assets) // runs until the end of the whole test
		logs = append(logs, n.log)
		waitConfigured(t, n, tc)
		waitAPIServer(t, kubeconfig)
		assertBootstrapRefused(ctx, t, configClient(t, tc, n.endpoint()))
	})

	t.Run("reset wipes the disk and goes back to maintenance", func(t *testing.T) {
		// Graceful, the last control plane would leave etcd, which
		// refuses to remove its only member (as on Talos, whose docs say
		// to reset the last control plane with --graceful=false); nothing
		// is reset.
		c := configClient(t, tc, n.endpoint())
		if err := c.Reset(ctx, true, true); err == nil || !strings.Contains(err.Error(), "failed to leave cluster") ||
			!strings.Contains(err.Error(), "not enough started members") {
			t.Fatalf("a graceful Reset of the only control plane: %v, want etcd's refusal", err)
		}
		waitAPIServer(t, kubeconfig)
		if err := c.Reset(ctx, false, true); err != nil {
			t.Fatalf("Reset: %v", err)
		}
		waitMaintenance(t, n)
		if pids := controlPlanePIDs(t, stateDir); len(pids) > 0 {
			t.Errorf("etcd or kube-apiserver survived the reset: %v", pids)
		}
		for _, f := range []string{talosnode.ConfigFile, talosnode.BootstrappedFile, talosnode.EtcdDir} {
			if _, err := os.Stat(filepath.Join(stateDir, f)); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("%s survived the reset (stat: %v)", f, err)
			}
		}
	})

	// The node ran with --debug (every request logged) through an apply,
	// a bootstrap, a restart and a reset: none of its logs, nor etcd's
	// or kube-apiserver's, holds a secret of the machine config.
	t.Run("no log holds a secret of the machine config", func(t *testing.T) {
		for _, name := range []string{"etcd.log", "kube-apiserver.log"} {
			logs = append(logs, filepath.Join(stateDir, talosnode.LogDir, name))
		}
		needles := configSecrets(t, applied)
		for _, path := range logs {
			log, err := os.ReadFile(path)
			if err != nil {
				t.Errorf("%s: %v", path, err)
				continue
			}
			for what, needle := range needles {
				if strings.Contains(string(log), needle) {
					t.Errorf("%s (%d bytes) holds %s", filepath.Base(path), len(log), what)
				}
			}
		}
		t.Logf("%d logs searched for %d secrets", len(logs), len(needles))
	})
}

// configSecrets finds a machine config's secrets (every string of 16
// characters or more under a key named like key, token or secret: the CA
// keys, the tokens, the encryption and cluster secrets) and returns what
// would betray each in a log: its value and, for a base64 PEM key, a
// line of the decoded PEM, by a name that does not.
func configSecrets(t *testing.T, cfg []byte) map[string]string {
	t.Helper()
	out := map[string]string{}
	var walk func(path string, v any)
	walk = func(path string, v any) {
		switch v := v.(type) {
		case map[string]any:
			for k, c := range v {
				walk(path+"."+k, c)
			}
		case []any:
			for i, c := range v {
				walk(fmt.Sprintf("%s[%d]", path, i), c)
			}
		case string:
			leaf := strings.ToLower(path[strings.LastIndex(path, ".")+1:])
			if len(v) < 16 || !(leaf == "key" || strings.Contains(leaf, "token") || strings.Contains(leaf, "secret")) {
				return
			}
			out[path] = v
			if raw, err := base64.StdEncoding.DecodeString(v); err == nil {
				if block, _ := pem.Decode(raw); block != nil {
					lines := strings.Split(string(raw), "\n")
					out[path+" (decoded)"] = lines[1] // the first line of the key's body
				}
			}
		}
	}
	for _, doc := range strings.Split(string(cfg), "\n---\n") {
		var m map[string]any
		if err := yaml.Unmarshal([]byte(doc), &m); err != nil {
			t.Fatalf("the machine config: %v", err)
		}
		walk("", m)
	}
	if len(out) < 8 {
		t.Fatalf("found only %d secrets in the machine config: %v", len(out), slices.Collect(maps.Keys(out)))
	}
	return out
}

func assertBootstrapRefused(ctx context.Context, t *testing.T, c *client.Client) {
	t.Helper()
	err := c.Bootstrap(ctx, &machine.BootstrapRequest{})
	if codeOf(err) != "AlreadyExists" || !strings.Contains(err.Error(), "etcd data directory is not empty") {
		t.Errorf("second Bootstrap: %v, want AlreadyExists: etcd data directory is not empty", err)
	}
}

// assertTalosKubeconfig checks the kubeconfig is Talos's: admin@<cluster>
// with a system:masters certificate, for the control-plane endpoint.
func assertTalosKubeconfig(t *testing.T, data []byte, addr netip.Addr) {
	t.Helper()
	kc, err := clientcmd.Load(data)
	if err != nil {
		t.Fatalf("kubeconfig does not load: %v", err)
	}
	if kc.CurrentContext != "admin@lab" {
		t.Errorf("current context %q, want admin@lab", kc.CurrentContext)
	}
	kctx := kc.Contexts[kc.CurrentContext]
	if kctx == nil || kctx.Cluster != "lab" || kctx.AuthInfo != "admin@lab" {
		t.Fatalf("context %+v", kctx)
	}
	if want := "https://" + net.JoinHostPort(addr.String(), "6443"); kc.Clusters["lab"].Server != want {
		t.Errorf("server %q, want %q", kc.Clusters["lab"].Server, want)
	}
	block, _ := pem.Decode(kc.AuthInfos["admin@lab"].ClientCertificateData)
	if block == nil {
		t.Fatal("no client certificate")
	}
	crt, err := stdx509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(crt.Subject.Organization, []string{"system:masters"}) {
		t.Errorf("client certificate organization %v, want system:masters", crt.Subject.Organization)
	}
}

// waitAPIServer waits until kube-apiserver answers /version through the
// kubeconfig.
func waitAPIServer(t *testing.T, kubeconfig []byte) {
	t.Helper()
	poll.Within(t, 2*time.Minute, 100*time.Millisecond, "kube-apiserver answers /version", func() error {
		rc, err := clientcmd.RESTConfigFromKubeConfig(kubeconfig)
		if err != nil {
			return err
		}
		rc.Timeout = 5 * time.Second
		dc, err := discovery.NewDiscoveryClientForConfig(rc)
		if err != nil {
			return err
		}
		v, err := dc.ServerVersion()
		if err != nil {
			return err
		}
		if !strings.HasPrefix(v.GitVersion, "v1.") {
			return fmt.Errorf("version %q", v.GitVersion)
		}
		return nil
	})
}

// nodeProcess is a node running as its own process (the test binary,
// re-executed as cozy-talos-node).
type nodeProcess struct {
	addr netip.Addr
	cmd  *exec.Cmd
	done chan struct{}
	log  string // its stdout and stderr
}

func (p *nodeProcess) endpoint() string {
	return net.JoinHostPort(p.addr.String(), strconv.Itoa(talosnode.DefaultAPIPort))
}

func startNodeProcess(t *testing.T, addr netip.Addr, stateDir, assets string) *nodeProcess {
	t.Helper()
	logPath := filepath.Join(t.TempDir(), "node.log")
	out, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0],
		"--address", addr.String(),
		"--state-dir", stateDir,
		"--mac", "52:54:00:00:00:01", "--mac", "52:54:00:ff:00:01",
		"--uuid", "4c4c4544-0000-1000-8000-000000000001",
		"--disk", "vda:20GiB:virtio:QEMU HARDDISK:disk-01",
		"--etcd", filepath.Join(assets, "etcd"),
		"--kube-apiserver", filepath.Join(assets, "kube-apiserver"),
		"--reboot-delay", "200ms",
		"--debug",
	)
	cmd.Env = append(os.Environ(), runNodeEnv+"=1")
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &nodeProcess{addr: addr, cmd: cmd, done: make(chan struct{}), log: logPath}
	go func() {
		_ = cmd.Wait()
		out.Close()
		close(p.done)
	}()
	t.Cleanup(func() {
		p.kill(t)
		if t.Failed() {
			if log, err := os.ReadFile(logPath); err == nil {
				t.Logf("node process log:\n%s", log)
			}
			for _, name := range []string{"etcd.log", "kube-apiserver.log"} {
				if log, err := os.ReadFile(filepath.Join(stateDir, talosnode.LogDir, name)); err == nil {
					t.Logf("%s (last 3000 bytes):\n%s", name, log[max(0, len(log)-3000):])
				}
			}
		}
		// Pdeathsig should have ended etcd and kube-apiserver with the node;
		// make sure nothing outlives the test even if it did not.
		for _, pid := range controlPlanePIDs(t, stateDir) {
			t.Errorf("process %d outlived its node; killing it", pid)
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	})
	return p
}

// kill ends the node's process with SIGKILL: no cleanup of its own.
func (p *nodeProcess) kill(t *testing.T) {
	t.Helper()
	select {
	case <-p.done:
		return
	default:
	}
	_ = p.cmd.Process.Kill()
	select {
	case <-p.done:
	case <-time.After(time.Minute):
		t.Errorf("node process %d did not exit after SIGKILL", p.cmd.Process.Pid)
	}
}

// controlPlanePIDs finds etcd and kube-apiserver processes of the node
// whose disk is stateDir, by their command lines.
func controlPlanePIDs(t *testing.T, stateDir string) []int {
	t.Helper()
	entries, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	var pids []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		cmdline, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil {
			continue
		}
		if strings.Contains(string(cmdline), "--data-dir="+filepath.Join(stateDir, talosnode.EtcdDir)) ||
			strings.Contains(string(cmdline), "--cert-dir="+filepath.Join(stateDir, talosnode.PKIDir)) {
			// A zombie has no cmdline, so this is a live process.
			pids = append(pids, pid)
		}
	}
	return pids
}
