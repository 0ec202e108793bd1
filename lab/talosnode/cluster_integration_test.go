//go:build integration

package talosnode_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cosi-project/runtime/pkg/resource"
	"github.com/siderolabs/talos/pkg/machinery/api/machine"
	clientconfig "github.com/siderolabs/talos/pkg/machinery/client/config"
	"github.com/siderolabs/talos/pkg/machinery/resources/k8s"

	"cozy.dev/cozy/bootstrap/rack"
	"cozy.dev/cozy/bootstrap/talosconfig"
	"cozy.dev/cozy/images"
	"cozy.dev/cozy/images/registry"
	"cozy.dev/cozy/internal/testing/clustertest"
	"cozy.dev/cozy/internal/testing/netnstest"
	"cozy.dev/cozy/internal/testing/poll"
	"cozy.dev/cozy/internal/testing/prereq"
	"cozy.dev/cozy/internal/testing/testenv"
	"cozy.dev/cozy/lab/talosnode"
)

// The process tier of a real cluster: a control plane and a worker, each
// an emulated Talos node in network and mount namespaces of its own on
// this host (the container platform), joined by a bridge in a third
// namespace that also holds the registry mirror. Everything Talos starts
// runs for real: etcd, kube-apiserver, controller-manager, scheduler,
// containerd with runc and the CNI plugins, kubelet; and the bootstrap
// manifests' CoreDNS, flannel and kube-proxy run as pods from images
// built from source and served by the mirror.

const (
	clusterSubnet = "10.77.0"
	mirrorAddr    = clusterSubnet + ".1:5000"
)

// clusterNode is one node of the process-tier cluster.
type clusterNode struct {
	name, role, ip, mac string
	ns                  *netnstest.NS
	stateDir            string
	api                 string // its Talos API, exposed on host loopback
	kubeAPI             string // its kube-apiserver, exposed on host loopback (control planes)
	cmd                 *exec.Cmd
	log                 *os.File
}

// procCluster is a process-tier cluster: its nodes, its Talos client
// config and kubectl against its first control plane.
type procCluster struct {
	nodes  []*clusterNode
	domain string
	rack   *rack.Rack
	sw     *netnstest.NS // the namespace of the bridge and the mirror
	// kubeconfig is the admin kubeconfig's file; its server is the first
	// control plane inside the cluster's network (see kubeAPI).
	kubeconfig string
	talos      *clientconfig.Config
	kubectl    clustertest.Kubectl
	// kubectlVia runs kubectl against another control plane's API.
	kubectlVia func(n *clusterNode, args ...string) (string, error)
	// kubectlCmd makes a kubectl command against a control plane's API.
	kubectlCmd func(ctx context.Context, n *clusterNode, args ...string) *exec.Cmd
}

// startCluster builds the network (a bridge in a namespace of its own,
// the mirror on its address, one veth per node with a default route
// through the bridge, from which flannel picks its interface; nothing
// routes further), starts one node per role given (controlplane or
// worker), applies their configs from a rack with flannel and every image
// through the mirror, bootstraps the first control plane and returns
// once its API server answers.
func startCluster(t *testing.T, ctx context.Context, roles ...string) *procCluster {
	t.Helper()
	assets := testenv.AssetsDir(t)
	nodeAssets := testenv.BuiltDir(t, "COZY_NODE_ASSETS", "hack/node-assets.sh", "bin/containerd")
	images := testenv.BuiltDir(t, "COZY_LAB_IMAGES", "hack/lab-images.sh", "index.json")
	runc, err := exec.LookPath("runc")
	if err != nil {
		prereq.Missing(t, "runc is not installed (Debian runc; hack/install-deps.sh)")
	}
	if d, err := time.ParseDuration(os.Getenv("COZY_TEST_HOLD")); err == nil {
		t.Cleanup(func() {
			if t.Failed() {
				t.Logf("holding the cluster for %s (COZY_TEST_HOLD)", d)
				time.Sleep(d)
			}
		})
	}
	sw := netnstest.New(t, "sw")
	sw.IP(t, "link", "add", "br0", "type", "bridge")
	sw.IP(t, "addr", "add", clusterSubnet+".1/24", "dev", "br0")
	sw.IP(t, "link", "set", "br0", "up")
	var nodes []*clusterNode
	var machines strings.Builder
	cps, workers := 0, 0
	for _, role := range roles {
		n := &clusterNode{role: role}
		if role == "controlplane" {
			cps++
			n.name, n.ip, n.mac = fmt.Sprintf("cp%d", cps), fmt.Sprintf("%s.%d", clusterSubnet, 10+cps), fmt.Sprintf("52:54:00:77:00:%02x", 0x10+cps)
		} else {
			workers++
			n.name, n.ip, n.mac = fmt.Sprintf("w%d", workers), fmt.Sprintf("%s.%d", clusterSubnet, 20+workers), fmt.Sprintf("52:54:00:77:00:%02x", 0x20+workers)
		}
		n.ns = netnstest.New(t, n.name)
		netnstest.Veth(t, n.ns, "eth0", n.ip+"/24", sw, "p-"+n.name, "")
		n.ns.IP(t, "link", "set", "eth0", "address", n.mac)
		sw.IP(t, "link", "set", "p-"+n.name, "master", "br0")
		n.ns.IP(t, "route", "add", "default", "via", clusterSubnet+".1")
		n.stateDir = t.TempDir()
		nodes = append(nodes, n)
		fmt.Fprintf(&machines, `  - hostname: %[1]s
    role: %[2]s
    mac: %[3]s
    install: {disk: /dev/vda}
    interfaces:
      - mac: %[3]s
        addresses: [%[4]s/24]
`, n.name, role, n.mac, n.ip)
	}
	startMirror(t, sw, mirrorAddr, images)
	t.Cleanup(talosnode.RemoveMountPoints) // after every node's own cleanup

	r := parseRack(t, fmt.Sprintf(`apiVersion: cozy.dev/v1alpha1
kind: Rack
metadata:
  name: proc
cluster:
  endpoint: https://%[1]s.11:6443
  kubernetesVersion: %[3]s
  cni: flannel
  allowSchedulingOnControlPlanes: false
network:
  interface: br0
  subnet: %[1]s.0/24
registries:
  mirror: http://%[2]s
# The nodes share this host's disk, which is not theirs to keep free:
# kubelet's default thresholds (15 %% of the image file system) evicted
# the probe pods when the host had 31 GB free of 252 (a cold CI run).
patches:
  - patch:
      machine:
        kubelet:
          extraConfig:
            evictionHard:
              nodefs.available: 1Gi
              imagefs.available: 1Gi
              memory.available: 100Mi
machines:
%[4]s`, clusterSubnet, mirrorAddr, kubernetesVersion(t, assets), machines.String()))
	bundle, _, err := talosconfig.LoadOrCreateSecrets(filepath.Join(t.TempDir(), talosconfig.SecretsFile), nil)
	if err != nil {
		t.Fatal(err)
	}
	gen := &talosconfig.Generator{Rack: r, Secrets: bundle}
	tc, err := gen.Talosconfig()
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range nodes {
		n.start(t, assets, nodeAssets, runc)
	}
	for i, n := range nodes {
		cfg, err := gen.MachineConfig(&r.Machines[i])
		if err != nil {
			t.Fatal(err)
		}
		poll.Within(t, time.Minute, 100*time.Millisecond, n.name+" in maintenance mode", func() error {
			_, err := insecureClient(t, n.api).ApplyConfiguration(ctx, &machine.ApplyConfigurationRequest{Data: cfg, Mode: machine.ApplyConfigurationRequest_REBOOT})
			return err
		})
	}
	cp := nodes[0]
	poll.Within(t, 2*time.Minute, 100*time.Millisecond, "bootstrap cp1", func() error {
		return configClient(t, tc, cp.api).Bootstrap(ctx, &machine.BootstrapRequest{})
	})
	var kubeconfig []byte
	poll.Within(t, time.Minute, 100*time.Millisecond, "kubeconfig", func() (err error) {
		kubeconfig, err = configClient(t, tc, cp.api).Kubeconfig(ctx)
		return err
	})
	kc := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(kc, kubeconfig, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, n := range nodes {
		if n.role == "controlplane" {
			n.kubeAPI = n.ns.Expose(t, net.JoinHostPort(n.ip, "6443"))
		}
	}
	c := &procCluster{nodes: nodes, domain: r.Cluster.DNSDomain, rack: r, sw: sw, kubeconfig: kc, talos: tc}
	c.kubectlCmd = func(ctx context.Context, n *clusterNode, args ...string) *exec.Cmd {
		// The API server's certificate names 127.0.0.1, where it is
		// exposed.
		return exec.CommandContext(ctx, filepath.Join(assets, "kubectl"), append([]string{"--kubeconfig", kc,
			"--server", "https://" + n.kubeAPI, "--request-timeout", "20s"}, args...)...)
	}
	c.kubectlVia = func(n *clusterNode, args ...string) (string, error) {
		// Not ended with ctx: the failure dumps run in cleanups, after
		// the test's context is done; --request-timeout bounds each call.
		cmd := c.kubectlCmd(context.WithoutCancel(ctx), n, args...)
		var out, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &stderr
		if err := cmd.Run(); err != nil {
			return out.String(), fmt.Errorf("kubectl %s: %v: %s", strings.Join(args, " "), err, stderr.String())
		}
		return out.String(), nil
	}
	c.kubectl = func(args ...string) (string, error) { return c.kubectlVia(cp, args...) }
	t.Cleanup(func() {
		if t.Failed() {
			for _, args := range [][]string{{"get", "nodes", "-o", "wide"}, {"get", "pods", "-A", "-o", "wide"}, {"get", "events", "-A"}} {
				out, err := c.kubectl(args...)
				t.Logf("kubectl %s:\n%s%v", strings.Join(args, " "), out, err)
			}
		}
	})
	return c
}

func TestClusterRunsPods(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	c := startCluster(t, ctx, "controlplane", "worker")
	kubectl := c.kubectl

	// Every node joins with the bootstrap token and becomes Ready: the
	// CNI runs on it.
	poll.Within(t, 8*time.Minute, 100*time.Millisecond, "both Nodes Ready", func() error {
		out, err := kubectl("get", "nodes", "-o", `jsonpath={range .items[*]}{.metadata.name}={.status.conditions[?(@.type=="Ready")].status}{" "}{end}`)
		if err != nil {
			return err
		}
		if !strings.Contains(out, "cp1=True") || !strings.Contains(out, "w1=True") {
			return fmt.Errorf("nodes: %s", out)
		}
		return nil
	})
	poll.Within(t, 5*time.Minute, 100*time.Millisecond, "CoreDNS Available", func() error {
		out, err := kubectl("-n", "kube-system", "get", "deployment", "coredns", "-o", `jsonpath={.status.conditions[?(@.type=="Available")].status}`)
		if err != nil {
			return err
		}
		if out != "True" {
			return fmt.Errorf("Available=%q", out)
		}
		return nil
	})

	// Talos's StaticPodStatus of each control-plane component: the
	// image of the version that runs, Ready once it answers its health
	// check.
	cpTalos := configClient(t, c.talos, c.nodes[0].api)
	want := "v" + kubernetesVersion(t, testenv.AssetsDir(t))
	poll.Within(t, 2*time.Minute, 200*time.Millisecond, "cp1's static pod statuses", func() error {
		for _, comp := range []string{"kube-apiserver", "kube-controller-manager", "kube-scheduler"} {
			res, err := cpTalos.COSI.Get(ctx, resource.NewMetadata(k8s.NamespaceName, k8s.StaticPodStatusType, "kube-system/"+comp+"-cp1", resource.VersionUndefined))
			if err != nil {
				return err
			}
			st := res.(*k8s.StaticPodStatus).TypedSpec().PodStatus
			cs := st["containerStatuses"].([]any)[0].(map[string]any)
			if cs["image"] != "registry.k8s.io/"+comp+":"+want || cs["ready"] != true {
				return fmt.Errorf("%s: %v", comp, st)
			}
		}
		return nil
	})

	// The node's labels and taints come from the config, through the API:
	// the node applies them once its Node exists, as Talos's controller
	// does, so they may land after CoreDNS is available.
	poll.Within(t, 2*time.Minute, 100*time.Millisecond, "cp1's labels and taints", func() error {
		out, err := kubectl("get", "node", "cp1", "-o", "json")
		if err != nil {
			return err
		}
		var cpNode struct {
			Metadata struct{ Labels map[string]string } `json:"metadata"`
			Spec     struct {
				Taints []struct{ Key, Effect string }
			}
		}
		if err := json.Unmarshal([]byte(out), &cpNode); err != nil {
			return err
		}
		if _, ok := cpNode.Metadata.Labels["node-role.kubernetes.io/control-plane"]; !ok {
			return fmt.Errorf("cp1 has no control-plane role label: %v", cpNode.Metadata.Labels)
		}
		if len(cpNode.Spec.Taints) == 0 || cpNode.Spec.Taints[0].Key != "node-role.kubernetes.io/control-plane" {
			return fmt.Errorf("cp1 taints %v, want the control-plane NoSchedule taint", cpNode.Spec.Taints)
		}
		return nil
	})

	// A pod from the mirror on each node: DNS, Services, pod to pod
	// across nodes, logs and exec.
	pods := clustertest.RunProbes(t, kubectl, []string{"cp1", "w1"}, 5*time.Minute)
	clustertest.CheckWorkloads(t, kubectl, pods, c.domain)
	clustertest.CheckPortForward(t, func(ctx context.Context, args ...string) *exec.Cmd { return c.kubectlCmd(ctx, c.nodes[0], args...) },
		(&net.Dialer{}).DialContext, pods)
	clustertest.CheckPreviousLogs(t, kubectl, "w1")

	// An image the mirror lacks: the pod waits on its pull, and says
	// which image.
	if out, err := kubectl("run", "missing", "--image", "registry.k8s.io/not-mirrored:v1", "--overrides",
		`{"spec":{"nodeName":"w1"}}`, "--restart", "Never"); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	poll.Within(t, 2*time.Minute, 100*time.Millisecond, "the pod of a missing image waits on its pull", func() error {
		out, err := kubectl("get", "pod", "missing", "-o", `jsonpath={.status.containerStatuses[0].state.waiting.reason} {.status.containerStatuses[0].image}`)
		if err != nil {
			return err
		}
		if !strings.HasPrefix(out, "ErrImagePull ") && !strings.HasPrefix(out, "ImagePullBackOff ") || !strings.HasSuffix(out, "registry.k8s.io/not-mirrored:v1") {
			return fmt.Errorf("pod missing: %q", out)
		}
		return nil
	})
}

// TestControlPlaneLeasesMove: with three control planes the
// controller-manager and the scheduler elect a leader; when the leader's
// machine shuts down, another control plane takes each lease over.
func TestControlPlaneLeasesMove(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	c := startCluster(t, ctx, "controlplane", "controlplane", "controlplane")
	holders := func(via *clusterNode) (map[string]string, error) {
		out, err := c.kubectlVia(via, "-n", "kube-system", "get", "leases", "kube-controller-manager", "kube-scheduler",
			"-o", `jsonpath={range .items[*]}{.metadata.name}={.spec.holderIdentity}{"\n"}{end}`)
		if err != nil {
			return nil, err
		}
		h := map[string]string{}
		for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
			if name, holder, ok := strings.Cut(line, "="); ok && holder != "" {
				// holderIdentity is HOSTNAME_UUID.
				h[name], _, _ = strings.Cut(holder, "_")
			}
		}
		if len(h) != 2 {
			return nil, fmt.Errorf("leases: %q", out)
		}
		return h, nil
	}
	poll.Within(t, 8*time.Minute, 100*time.Millisecond, "three control planes registered", func() error {
		out, err := c.kubectl("get", "nodes", "-o", "name")
		if err != nil {
			return err
		}
		if n := strings.Count(out, "node/cp"); n != 3 {
			return fmt.Errorf("%d control planes: %s", n, out)
		}
		return nil
	})
	// Shutting one of three down keeps etcd's quorum only once all three
	// are voting members, which Talos's health check waits for too: the
	// registered Nodes alone do not say so (a control plane's kubelet
	// registers before its etcd has joined).
	first := configClient(t, c.talos, c.nodes[0].api)
	poll.Within(t, 5*time.Minute, 100*time.Millisecond, "three voting etcd members", func() error {
		resp, err := first.EtcdMemberList(ctx, &machine.EtcdMemberListRequest{})
		if err != nil {
			return err
		}
		var voting []string
		for _, m := range resp.GetMessages()[0].GetMembers() {
			if !m.GetIsLearner() {
				voting = append(voting, m.GetHostname())
			}
		}
		if len(voting) != 3 {
			return fmt.Errorf("voting members: %v", voting)
		}
		return nil
	})
	var before map[string]string
	poll.Within(t, 3*time.Minute, 100*time.Millisecond, "the leases held", func() (err error) {
		before, err = holders(c.nodes[0])
		return err
	})
	t.Logf("leases before: %v", before)
	// Shut the leader down through the Talos API: the controller-manager's
	// (often the scheduler's too: they start together).
	var leader, survivor *clusterNode
	for _, n := range c.nodes {
		if n.name == before["kube-controller-manager"] {
			leader = n
		} else if survivor == nil {
			survivor = n
		}
	}
	if before["kube-scheduler"] != before["kube-controller-manager"] {
		t.Logf("the scheduler's lease is on %s, not the leader: only the controller-manager's moves", before["kube-scheduler"])
	}
	if leader == nil {
		t.Fatalf("the controller-manager's lease is held by %q, not a control plane", before["kube-controller-manager"])
	}
	if err := configClient(t, c.talos, leader.api).Shutdown(ctx); err != nil {
		t.Fatalf("Shutdown %s: %v", leader.name, err)
	}
	poll.Within(t, 3*time.Minute, 100*time.Millisecond, "the leases moved off "+leader.name, func() error {
		after, err := holders(survivor)
		if err != nil {
			return err
		}
		for lease, h := range after {
			if h == leader.name {
				return fmt.Errorf("%s still held by %s", lease, h)
			}
		}
		t.Logf("leases after %s shut down: %v", leader.name, after)
		return nil
	})
}

// startMirror serves a registry on addr inside ns (the cluster's bridge)
// and fills it with the images of an OCI layout, as `cozyctl images
// mirror` does.
func startMirror(t *testing.T, ns *netnstest.NS, addr, layout string) {
	t.Helper()
	serveRegistry(t, ns, addr)
	mirrorLayout(t, context.Background(), ns, addr, layout, nil)
}

// serveRegistry serves an empty registry on addr inside ns until the
// test ends.
func serveRegistry(t *testing.T, ns *netnstest.NS, addr string) {
	t.Helper()
	var srv *registry.Server
	if err := ns.Do(func() (err error) {
		srv, err = registry.Listen(addr, t.TempDir(), nodeLogger(t, "registry"))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("registry: %v", err)
		}
	})
}

// mirrorLayout pushes every image of an OCI layout, and charts, to the
// registry at addr inside ns.
func mirrorLayout(t *testing.T, ctx context.Context, ns *netnstest.NS, addr, layout string, charts []images.MirrorChart) {
	t.Helper()
	src, err := images.OpenLayout(layout)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := images.Mirror(ctx, images.MirrorOptions{
		Registry: addr, Insecure: true, Source: src, Refs: src.Refs(), Charts: charts,
		Transport: &http.Transport{DialContext: ns.DialContext},
	}); err != nil {
		t.Fatalf("mirror %s: %v", layout, err)
	}
}

// start runs the node in its namespaces: its network namespace, and a
// mount namespace of its own (the container platform binds its disk over
// Talos's paths there).
func (n *clusterNode) start(t *testing.T, assets, nodeAssets, runc string) {
	t.Helper()
	self, _ := os.Executable()
	var err error
	n.log, err = os.Create(filepath.Join(n.stateDir, "node.log"))
	if err != nil {
		t.Fatal(err)
	}
	n.cmd = n.ns.Command(context.Background(), self, "--address", n.ip+"/24", "--state-dir", n.stateDir, "--hostname", "node-"+n.name,
		"--mac", n.mac, "--disk", "vda:20GiB:virtio", "--reboot-delay", "500ms",
		"--platform", "container", "--node-services",
		"--etcd", filepath.Join(assets, "etcd"), "--kube-apiserver", filepath.Join(assets, "kube-apiserver"),
		"--kube-controller-manager", filepath.Join(assets, "kube-controller-manager"),
		"--kube-scheduler", filepath.Join(assets, "kube-scheduler"), "--kubelet", filepath.Join(assets, "kubelet"),
		"--containerd", filepath.Join(nodeAssets, "bin", "containerd"), "--runc", runc,
		"--cni-bin-dir", filepath.Join(nodeAssets, "cni", "bin"))
	n.cmd.Env = append(os.Environ(), runNodeEnv+"=1")
	n.cmd.Stdout, n.cmd.Stderr = n.log, n.log
	if err := n.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	n.api = n.ns.Expose(t, net.JoinHostPort(n.ip, "50000"))
	t.Cleanup(func() {
		_ = n.cmd.Process.Kill()
		_ = n.cmd.Wait()
		if err := talosnode.KillNodeCgroup("node-" + n.name); err != nil {
			t.Errorf("clean up %s: %v", n.name, err)
		}
		n.log.Close()
		if t.Failed() {
			for _, f := range []string{"node.log", "logs/kubelet.log", "logs/containerd.log", "logs/kube-apiserver.log", "logs/kube-controller-manager.log"} {
				data, _ := os.ReadFile(filepath.Join(n.stateDir, f))
				if len(data) > 8000 {
					data = data[len(data)-8000:]
				}
				t.Logf("%s %s (tail):\n%s", n.name, f, data)
			}
		}
	})
}

func parseRack(t *testing.T, doc string) *rack.Rack {
	t.Helper()
	r, err := rack.Parse([]byte(doc), "rack.yaml", t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// kubernetesVersion is the version of the kubelet built for the test: the
// cluster's, so the images its config names are the ones built.
func kubernetesVersion(t *testing.T, assets string) string {
	t.Helper()
	out, err := exec.Command(filepath.Join(assets, "kubelet"), "--version").Output()
	if err != nil {
		t.Fatalf("kubelet --version: %v", err)
	}
	v := strings.TrimPrefix(strings.TrimSpace(string(out)), "Kubernetes v")
	if v == "" || strings.ContainsAny(v, " \n") {
		t.Fatalf("kubelet --version printed %q", out)
	}
	return v
}
