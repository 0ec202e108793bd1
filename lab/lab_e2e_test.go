//go:build integration && lab

package lab_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/siderolabs/talos/pkg/machinery/api/common"
	talosclient "github.com/siderolabs/talos/pkg/machinery/client"
	clientconfig "github.com/siderolabs/talos/pkg/machinery/client/config"
	"google.golang.org/grpc"

	"cozy.dev/cozy/bmc"
	"cozy.dev/cozy/bootstrap"
	"cozy.dev/cozy/bootstrap/power"
	"cozy.dev/cozy/bootstrap/rack"
	"cozy.dev/cozy/bootstrap/state"
	"cozy.dev/cozy/bootstrap/upgrade"
	"cozy.dev/cozy/internal/cachedir"
	"cozy.dev/cozy/internal/kernelimage"
	"cozy.dev/cozy/internal/netns"
	"cozy.dev/cozy/internal/testing/clustertest"
	"cozy.dev/cozy/internal/testing/cozyctl"
	"cozy.dev/cozy/internal/testing/netnstest"
	"cozy.dev/cozy/internal/testing/poll"
	"cozy.dev/cozy/internal/testing/prereq"
	"cozy.dev/cozy/internal/testing/syncbuf"
	"cozy.dev/cozy/internal/testing/testenv"
	"cozy.dev/cozy/lab"
	"cozy.dev/cozy/lab/nodeimage"
	"cozy.dev/cozy/platform/flux"
	"cozy.dev/cozy/platform/render"
	"cozy.dev/cozy/platform/status"
	"cozy.dev/cozy/platform/upstream"
	"cozy.dev/cozy/pxe/inventory"
)

// TestLab is `make lab-test`: `cozyctl lab up` of three VMs, BIOS and UEFI
// mixed, under TCG, with the node services off (what `lab up` does by
// itself under TCG), netbooted by Cozy's server and bootstrapped into a
// cluster by `cozyctl bootstrap`, checked phase by phase, and the
// platform rendered for its rack accepted by its API server; always torn
// down, serial logs kept in $COZY_TEST_ARTIFACTS.
func TestLab(t *testing.T) {
	requireLab(t)
	// Bootstrapped on an older Kubernetes than its build, to upgrade.
	c := lab.Config{Name: fmt.Sprintf("lt%d", os.Getpid()), Nodes: 3, ControlPlanes: 1,
		Firmware: lab.FirmwareMixed, Accel: "tcg", Dir: t.TempDir(), KubernetesVersion: labUpgradeFrom}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	res, _ := upLab(ctx, t, &c)
	if res.NodeServices {
		t.Errorf("--node-services %s under %s ran the node services", c.NodeServices, res.Accel)
	}
	checkBootstrapped(t, &c, res)
	checkNodes(t, labKubectl(ctx, &c, res.Kubeconfig), &c, false)
	for _, m := range c.Machines() {
		serial, err := os.ReadFile(filepath.Join(c.Dir, "vms", m.Name, "serial.log"))
		if err != nil {
			t.Fatal(err)
		}
		// The kernel argument kept every node to its API: no KubePrism,
		// no kubelet.
		if strings.Contains(string(serial), "KubePrism listening") {
			t.Errorf("%s ran its node services with %s on its kernel command line", m.Name, nodeimage.APIOnlyArg)
		}
		checkKernelUnderTCG(t, m.Name, string(serial))
	}
	platformAccepted(ctx, t, &c, res.Kubeconfig)
	dayTwo(ctx, t, &c)
}

// checkKernelUnderTCG checks, in a VM's kernel log, what
// nodeimage.TCGArgs are for: the kernel reads time from the TSC, and
// Talos's pti=on, earlier on the command line, did not turn page-table
// isolation on.
func checkKernelUnderTCG(t *testing.T, machine, log string) {
	t.Helper()
	if !strings.Contains(log, "pti=on") {
		t.Errorf("%s: no pti=on on its kernel command line: Talos's arguments are not what nodeimage.TCGArgs expects", machine)
	}
	if !strings.Contains(log, "clocksource: Switched to clocksource tsc") {
		t.Errorf("%s: the kernel did not switch to the TSC under TCG", machine)
	}
	if strings.Contains(log, "page tables isolation: enabled") {
		t.Errorf("%s: page-table isolation is on under TCG", machine)
	}
}

// labUpgradeFrom is the Kubernetes version TestLab bootstraps, then
// upgrades from to the lab's build (lab.KubernetesVersion).
const labUpgradeFrom = "1.36.1"

// dayTwo is the day-2 commands on the lab's VMs, as an operator runs them
// in its namespace:
//   - `cozyctl upgrade kubernetes` from labUpgradeFrom to the lab's version:
//     each component's image patched into each VM's config and applied
//     without a reboot, gated on the control plane's StaticPodStatus. The
//     VMs carry one build, which ran the old version too, so no binary
//     changes and nothing restarts: what is shown is the path through the
//     VMs' Talos API, not a new Kubernetes (TestKubernetesUpgradeVersions
//     is);
//   - `cozyctl rack validate --against-cluster` then finds the rack in
//     step;
//   - `cozyctl node remove` of the last worker: reset without a reboot, so
//     its VM powers off, and the state dir records it removed.
func dayTwo(ctx context.Context, t *testing.T, c *lab.Config) {
	t.Helper()
	rackFile := filepath.Join(c.Dir, lab.RackFile)
	stateDir := filepath.Join(c.Dir, lab.StateDir)
	cozy := func(args ...string) (string, error) {
		cmd := exec.CommandContext(ctx, "ip", append([]string{"netns", "exec", lab.Namespace(c.Name), cozyctl.Path(t)}, args...)...)
		var stderr strings.Builder
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			return string(out), fmt.Errorf("cozyctl %s: %v\n%s", strings.Join(args, " "), err, stderr.String())
		}
		return string(out), nil
	}
	b, err := os.ReadFile(rackFile)
	if err != nil {
		t.Fatal(err)
	}
	y := strings.Replace(string(b), "kubernetesVersion: "+labUpgradeFrom, "kubernetesVersion: "+lab.KubernetesVersion, 1)
	if err := os.WriteFile(rackFile, []byte(y), 0o644); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	out, err := cozy("upgrade", "kubernetes", "--rack", rackFile, "--state-dir", stateDir, "-o", "json")
	if err != nil {
		t.Fatal(err)
	}
	var up upgrade.KubernetesResult
	if err := json.Unmarshal([]byte(out), &up); err != nil {
		t.Fatalf("upgrade kubernetes -o json: %v: %s", err, out)
	}
	t.Logf("cozyctl upgrade kubernetes v%s → v%s on the lab's VMs: %v, %d steps", labUpgradeFrom, lab.KubernetesVersion, time.Since(start).Round(time.Second), len(up.Steps))
	// cp1's kube-apiserver, controller-manager, scheduler, kube-proxy
	// (flannel's) and kubelet; each worker's kubelet.
	if len(up.Steps) != 5+c.Nodes-c.ControlPlanes {
		t.Errorf("upgrade steps %+v", up.Steps)
	}
	for _, s := range up.Steps {
		if s.From != "v"+labUpgradeFrom || s.To != "v"+lab.KubernetesVersion || s.Result != "upgraded" && !strings.HasPrefix(s.Result, "config only") {
			t.Errorf("upgrade step %+v", s)
		}
	}
	if out, err := cozy("rack", "validate", rackFile, "--against-cluster", "--state-dir", stateDir); err != nil {
		t.Errorf("rack validate --against-cluster after the upgrade: %v\n%s", err, out)
	}

	last := c.Machines()[c.Nodes-1]
	start = time.Now()
	if _, err := cozy("node", "remove", last.Name, "--rack", rackFile, "--state-dir", stateDir, "-o", "json"); err != nil {
		t.Fatal(err)
	}
	t.Logf("cozyctl node remove %s: %v", last.Name, time.Since(start).Round(time.Second))
	poll.Within(t, 2*time.Minute, time.Second, last.Name+"'s VM powered off", func() error {
		if st := c.VMStatus(last); st != "stopped" {
			return fmt.Errorf("its VM is %s", st)
		}
		return nil
	})
	st, err := state.Read(stateDir)
	if err != nil {
		t.Fatal(err)
	}
	if n := st.Nodes[last.Name]; n == nil || n.Phase != state.Removed {
		t.Errorf("%s in the state dir: %+v, want removed", last.Name, n)
	}
}

// TestLabNodes is `make e2e`: the lab with its node services on, under
// TCG: two VMs (cp1 BIOS, w1 UEFI) netbooted and bootstrapped into a
// control plane and a worker, then every Node Ready and CoreDNS available
// (lab up waits for both), and a probe pod from the lab's mirror on each
// node: DNS, the API's Service, pod to pod across the VMs, logs, exec and
// port-forward. Two VMs, not three: on 2 cores without KVM three kept
// CoreDNS from getting ready within lab up's wait, their emulated CPUs
// never idle (docs/lab.md#measured). Not part of `make check`: under
// TCG it takes about 18 minutes.
func TestLabNodes(t *testing.T) {
	requireLab(t)
	c := lab.Config{Name: fmt.Sprintf("ln%d", os.Getpid()), Nodes: 2, ControlPlanes: 1,
		Firmware: lab.FirmwareMixed, Accel: "tcg", NodeServices: lab.NodeServicesOn, Dir: t.TempDir()}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Minute)
	defer cancel()
	res, _ := upLab(ctx, t, &c)
	checkBootstrapped(t, &c, res)
	for _, want := range []string{"all nodes Ready", "CoreDNS available"} {
		if !slices.ContainsFunc(res.Milestones, func(m lab.Milestone) bool { return m.Name == want }) {
			t.Errorf("lab up reported no %q: %v", want, res.Milestones)
		}
	}
	kubectl := labKubectl(ctx, &c, res.Kubeconfig)
	checkNodes(t, kubectl, &c, true)
	var names []string
	for _, m := range c.Machines() {
		names = append(names, m.Name)
	}
	pods := clustertest.RunProbes(t, kubectl, names, 15*time.Minute)
	clustertest.CheckWorkloads(t, kubectl, pods, rack.DefaultDNSDomain)
	clustertest.CheckPortForward(t, func(ctx context.Context, args ...string) *exec.Cmd {
		return exec.CommandContext(ctx, "ip", append([]string{"netns", "exec", lab.Namespace(c.Name),
			filepath.Join(os.Getenv("KUBEBUILDER_ASSETS"), "kubectl"), "--kubeconfig", res.Kubeconfig}, args...)...)
	}, netns.Dialer(lab.Namespace(c.Name)), pods)
}

// TestLabPlatform is lab up --platform under TCG: one VM (control plane
// and worker: on 2 cores a second VM costs more than it adds) with real
// node services, then Flux installs MetalLB from the lab's chart mirror and
// registry, served from its Git server, until platform status is Ready;
// a LoadBalancer Service then gets the pool's first address and the node
// answers ARP and HTTP for it on the lab's bridge.
func TestLabPlatform(t *testing.T) {
	requireLab(t)
	c := lab.Config{Name: fmt.Sprintf("lp%d", os.Getpid()), Nodes: 1, ControlPlanes: 1, MemoryMiB: 4096,
		Accel: "tcg", NodeServices: lab.NodeServicesOn, Platform: true, Dir: t.TempDir()}
	ctx, cancel := context.WithTimeout(context.Background(), 85*time.Minute)
	defer cancel()
	res, _ := upLab(ctx, t, &c)
	for _, want := range []string{"all nodes Ready", "CoreDNS available", "platform Ready"} {
		if !slices.ContainsFunc(res.Milestones, func(m lab.Milestone) bool { return m.Name == want }) {
			t.Errorf("lab up reported no %q: %v", want, res.Milestones)
		}
	}
	kubectl := labKubectl(ctx, &c, res.Kubeconfig)
	checkNodes(t, kubectl, &c, true)
	checkPlatformStatus(ctx, t, &c, res.Kubeconfig)
	var names []string
	for _, m := range c.Machines() {
		names = append(names, m.Name)
	}
	clustertest.RunProbes(t, kubectl, names, 15*time.Minute)
	checkLoadBalancer(ctx, t, &c, kubectl)
}

// checkPlatformStatus is cozyctl platform status as a user runs it: every
// component the lab turns on is Ready, every other one off.
func checkPlatformStatus(ctx context.Context, t *testing.T, c *lab.Config, kubeconfig string) {
	t.Helper()
	cmd := exec.CommandContext(ctx, "ip", "netns", "exec", lab.Namespace(c.Name), cozyctl.Path(t),
		"platform", "status", "--kubeconfig", kubeconfig, "-o", "json")
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	var rep status.Report
	if err != nil || json.Unmarshal(out, &rep) != nil {
		t.Fatalf("cozyctl platform status: %v\n%s%s", err, out, stderr.String())
	}
	if !rep.Ready {
		t.Errorf("platform status: not Ready: %s", out)
	}
	for _, comp := range rep.Components {
		// The bootstrap's root sync (flux.SyncName) has its own row, on.
		if on := slices.Contains(lab.PlatformComponents, comp.Name) || comp.Name == flux.SyncName; on != !comp.Off || on && !comp.Ready {
			t.Errorf("%s: ready %v, off %v (%s); want the lab's components Ready, the rest off", comp.Name, comp.Ready, comp.Off, comp.Message)
		}
	}
	t.Logf("platform status: %d components, %v Ready", len(rep.Components), lab.PlatformComponents)
}

// checkLoadBalancer is the platform's MetalLB at work in the lab: a
// LoadBalancer Service in front of the probe pods gets the pool's first
// address, a client on the lab's bridge fetches a probe's page through it,
// and the bridge's neighbour entry for the address is a VM's MAC, a
// worker's if the lab has workers: its speaker answered the ARP request.
func checkLoadBalancer(ctx context.Context, t *testing.T, c *lab.Config, kubectl clustertest.Kubectl) {
	t.Helper()
	svc := filepath.Join(t.TempDir(), "svc.yaml")
	if err := os.WriteFile(svc, []byte("apiVersion: v1\nkind: Service\nmetadata: {name: probe-lb, namespace: default}\n"+
		"spec:\n  type: LoadBalancer\n  selector: {app: probe}\n  ports: [{port: 80, targetPort: 8080}]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := kubectl("apply", "-f", svc); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	var ip string
	poll.Within(t, 5*time.Minute, 2*time.Second, "the Service's load-balancer address", func() (err error) {
		ip, err = kubectl("get", "service", "probe-lb", "-o", "jsonpath={.status.loadBalancer.ingress[0].ip}")
		if err == nil && ip == "" {
			err = errors.New("no address yet")
		}
		return err
	})
	if ip != lab.PoolFrom {
		t.Errorf("the Service got %s, want %s, the pool's first address", ip, lab.PoolFrom)
	}
	hc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DialContext: netns.Dialer(lab.Namespace(c.Name))}}
	var body string
	poll.Within(t, 5*time.Minute, 2*time.Second, "a probe through "+ip, func() error {
		resp, err := hc.Get("http://" + net.JoinHostPort(ip, "80") + "/")
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		body = string(b)
		return err
	})
	if !strings.HasPrefix(body, "probe on ") {
		t.Errorf("through %s: %q, want a probe's page", ip, body)
	}
	neigh, err := exec.CommandContext(ctx, "ip", "netns", "exec", lab.Namespace(c.Name), "ip", "neigh", "show", ip, "dev", lab.Bridge).CombinedOutput()
	if err != nil {
		t.Fatalf("ip neigh: %v: %s", err, neigh)
	}
	var by string
	for _, m := range c.Machines() {
		if strings.Contains(strings.ToLower(string(neigh)), "lladdr "+strings.ToLower(m.MACText)+" ") {
			by = m.Name
			if m.Role != "worker" && c.Nodes > c.ControlPlanes {
				t.Errorf("%s answered ARP for %s; the lab's speakers run on workers when it has some", m.Name, ip)
			}
		}
	}
	if by == "" {
		t.Errorf("the bridge's neighbour entry for %s is %q: no VM's MAC answered its ARP", ip, neigh)
	}
	t.Logf("%s answered by %s: %q", ip, by, body)
}

// checkBootstrapped checks the lab's netboot and bootstrap phase by phase.
func checkBootstrapped(t *testing.T, c *lab.Config, res *lab.Result) {
	t.Helper()
	// Netboot: every machine got its lease and fetched iPXE's script,
	// the kernel and the initramfs, with the firmware the lab gave it.
	inv, err := inventory.Load(filepath.Join(c.Dir, lab.StateDir, "pxe"))
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range c.Machines() {
		var im *inventory.Machine
		for i := range inv {
			if inv[i].MAC == m.MACText {
				im = &inv[i]
			}
		}
		switch {
		case im == nil:
			t.Errorf("%s never reached the netboot server", m.Name)
		case im.IP != m.IP:
			t.Errorf("%s leased %v, want its reserved %v", m.Name, im.IP, m.IP)
		case im.Firmware != m.Firmware:
			t.Errorf("%s netbooted as %s, want %s", m.Name, im.Firmware, m.Firmware)
		case im.Phase != inventory.PhaseInitrd && im.Phase != inventory.PhaseConfig:
			t.Errorf("%s stopped netbooting at %s", m.Name, im.Phase)
		}
	}
	// Each kernel ran the emulated node, found in maintenance mode and
	// configured by bootstrap; etcd was bootstrapped once, on cp1.
	var st state.State
	data, err := os.ReadFile(filepath.Join(c.Dir, lab.StateDir, state.File))
	if err != nil || json.Unmarshal(data, &st) != nil {
		t.Fatalf("bootstrap state: %v", err)
	}
	if st.EtcdBootstrapped != "cp1" {
		t.Errorf("etcd bootstrapped on %q, want cp1", st.EtcdBootstrapped)
	}
	for _, m := range c.Machines() {
		if n := st.Nodes[m.Name]; n == nil || n.Phase != state.Ready {
			t.Errorf("%s: %+v, want ready", m.Name, n)
		}
		serial, _ := os.ReadFile(filepath.Join(c.Dir, "vms", m.Name, "serial.log"))
		for _, want := range []string{"maintenance mode: waiting for a machine config", "configured mode"} {
			if !strings.Contains(string(serial), want) {
				t.Errorf("%s's console lacks %q", m.Name, want)
			}
		}
		if n := strings.Count(string(serial), "bootstrap: etcd and kube-apiserver started"); (m.Name == "cp1") != (n == 1) || n > 1 {
			t.Errorf("%s bootstrapped etcd %d times", m.Name, n)
		}
	}
	// The kubeconfig answers /version through the cluster endpoint.
	if v, err := (&netnstest.NS{Name: lab.Namespace(c.Name)}).KubeVersion(res.Kubeconfig); err != nil || !strings.HasPrefix(v, "v1.") {
		t.Fatalf("/version: %q, %v", v, err)
	}
	checkBMCs(t, c)
}

// checkNodes reads the cluster's Node objects, not the bootstrap's own
// marks: with the node services on, each machine's kubelet registered a
// Node of its name and it is Ready; API-only, no kubelet registered any.
func checkNodes(t *testing.T, kubectl clustertest.Kubectl, c *lab.Config, services bool) {
	t.Helper()
	out, err := kubectl("get", "nodes", "-o", "json")
	if err != nil {
		t.Fatal(err)
	}
	var nodes corev1.NodeList
	if err := json.Unmarshal([]byte(out), &nodes); err != nil {
		t.Fatalf("kubectl get nodes: %v", err)
	}
	if !services {
		if len(nodes.Items) != 0 {
			t.Errorf("API-only nodes, yet %d Nodes registered", len(nodes.Items))
		}
		return
	}
	ready := map[string]bool{}
	for _, n := range nodes.Items {
		for _, cond := range n.Status.Conditions {
			if cond.Type == corev1.NodeReady {
				ready[n.Name] = cond.Status == corev1.ConditionTrue
				if !ready[n.Name] {
					t.Errorf("Node %s: Ready %s (%s: %s)", n.Name, cond.Status, cond.Reason, cond.Message)
				}
			}
		}
	}
	for _, m := range c.Machines() {
		if _, ok := ready[m.Name]; !ok {
			t.Errorf("%s registered no Node with a Ready condition (Nodes: %d)", m.Name, len(nodes.Items))
		}
	}
	if len(nodes.Items) != len(c.Machines()) {
		t.Errorf("%d Nodes for %d machines", len(nodes.Items), len(c.Machines()))
	}
}

// checkBMCs: lab up leaves the VMs off and the bootstrap powers them on
// through their BMCs; `cozyctl machine` then reads each VM's power and
// hardware from its BMC, inside the lab's namespace.
func checkBMCs(t *testing.T, c *lab.Config) {
	t.Helper()
	bin := cozyctl.Path(t)
	machine := func(args ...string) []power.Row {
		cmd := exec.Command("ip", append([]string{"netns", "exec", lab.Namespace(c.Name), bin, "machine"},
			append(args, "--all", "--rack", filepath.Join(c.Dir, lab.RackFile), "-o", "json")...)...)
		var stderr strings.Builder
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		var rows []power.Row
		if err != nil || json.Unmarshal(out, &rows) != nil {
			t.Fatalf("cozyctl machine %v: %v\n%s%s", args, err, out, stderr.String())
		}
		return rows
	}
	status := machine("power", "status")
	inv := machine("inspect")
	for i, m := range c.Machines() {
		if i >= len(status) || status[i].Power != bmc.PowerOn {
			t.Errorf("%s's BMC: %+v, want On", m.Name, status)
			continue
		}
		if got := inv[i].Inventory; got == nil || got.UUID != m.UUID || len(got.NICs) != 1 || got.NICs[0].MAC != m.MACText {
			t.Errorf("%s's BMC inventory: %+v, want UUID %s and MAC %s", m.Name, got, m.UUID, m.MACText)
		}
	}
}

// labKubectl runs the kubectl built with the lab's binaries inside its
// namespace, as `cozyctl lab kubectl` does.
func labKubectl(ctx context.Context, c *lab.Config, kubeconfig string) clustertest.Kubectl {
	return func(args ...string) (string, error) {
		cmd := exec.CommandContext(ctx, "ip", append([]string{"netns", "exec", lab.Namespace(c.Name),
			filepath.Join(os.Getenv("KUBEBUILDER_ASSETS"), "kubectl"), "--kubeconfig", kubeconfig, "--request-timeout", "60s"}, args...)...)
		var stderr strings.Builder
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			return string(out), fmt.Errorf("kubectl %s: %v: %s", strings.Join(args, " "), err, stderr.String())
		}
		return string(out), nil
	}
}

// platformAccepted checks that the lab's API server accepts the platform
// `cozyctl platform render` makes for the lab's rack: with the Flux CRDs
// (at the versions of the Flux API Cozy imports) and the CRDs of the
// platform's components' kinds it renders (KubeVirt, CDI, the Cluster API
// operator's providers, at the versions it pins) installed from the
// module cache, every rendered object passes a server-side dry run.
func platformAccepted(ctx context.Context, t *testing.T, c *lab.Config, kubeconfig string) {
	t.Helper()
	r, err := rack.Load(filepath.Join(c.Dir, lab.RackFile))
	if err != nil {
		t.Fatal(err)
	}
	layout, err := render.Render(r)
	if err != nil {
		t.Fatalf("platform render: %v", err)
	}
	objs, err := layout.Objects()
	if err != nil {
		t.Fatal(err)
	}
	var flux []testenv.CRDSource
	for _, src := range testenv.UpstreamCRDs() {
		if strings.HasPrefix(src.Module, "github.com/fluxcd/") {
			flux = append(flux, src)
		}
	}
	crds, err := testenv.LoadCRDs(ctx, append(flux, testenv.PlatformCRDs()...))
	if err != nil {
		t.Fatal(err)
	}
	// Flux's, and of the components' only those of kinds rendered: CRDs
	// are slow to install on one emulated vCPU.
	rendered := map[schema.GroupKind]bool{}
	for _, o := range objs {
		rendered[o.GroupVersionKind().GroupKind()] = true
	}
	crds = slices.DeleteFunc(crds, func(crd *apiextensionsv1.CustomResourceDefinition) bool {
		return !strings.HasSuffix(crd.Spec.Group, ".toolkit.fluxcd.io") && !rendered[schema.GroupKind{Group: crd.Spec.Group, Kind: crd.Spec.Names.Kind}]
	})
	rc, err := (&netnstest.NS{Name: lab.Namespace(c.Name)}).RESTConfig(kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	rc.Timeout = time.Minute          // CRDs are slow to install on one emulated vCPU
	ctrllog.SetLogger(logr.Discard()) // controller-runtime's client would warn that nobody set one
	if _, err := envtest.InstallCRDs(rc, envtest.CRDInstallOptions{CRDs: crds, MaxTime: 5 * time.Minute}); err != nil {
		t.Fatalf("install the Flux CRDs: %v", err)
	}
	cl, err := client.New(rc, client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	apply := func(u *unstructured.Unstructured, opts ...client.ApplyOption) error {
		opts = append(opts, client.FieldOwner("cozy-lab-test"), client.ForceOwnership)
		return cl.Apply(ctx, client.ApplyConfigurationFromUnstructured(u.DeepCopy()), opts...)
	}
	ns := &unstructured.Unstructured{}
	ns.SetAPIVersion("v1")
	ns.SetKind("Namespace")
	ns.SetName("flux-system")
	if err := apply(ns); err != nil {
		t.Fatal(err)
	}
	// Namespaced objects need their namespace, even in a dry run: those
	// rendered, then those the components' own manifests bring (KubeVirt's).
	for _, o := range objs {
		if o.GetKind() == "Namespace" {
			if err := apply(o.Unstructured); err != nil {
				t.Fatalf("%s: namespace %s: %v", o.File, o.GetName(), err)
			}
		}
	}
	for _, o := range objs {
		if name := o.GetNamespace(); name != "" {
			other := ns.DeepCopy()
			other.SetName(name)
			if err := cl.Get(ctx, client.ObjectKeyFromObject(other), other.DeepCopy()); err != nil {
				if err := apply(other); err != nil {
					t.Fatalf("%s: namespace %s: %v", o.File, name, err)
				}
			}
		}
	}
	accepted := 0
	for _, o := range objs {
		if err := apply(o.Unstructured, client.DryRunAll); err != nil {
			t.Errorf("%s: %s %s/%s refused: %v", o.File, o.GetKind(), o.GetNamespace(), o.GetName(), err)
			continue
		}
		accepted++
	}
	t.Logf("platform: all %d of %d objects accepted by the lab's API server", accepted, len(objs))
}

// requireLab fails the test under CI, or skips it, when the lab cannot run
// here.
func requireLab(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		prereq.Missing(t, "the lab needs root")
	}
	for _, bin := range []string{"qemu-system-x86_64", "qemu-img"} {
		if _, err := exec.LookPath(bin); err != nil {
			prereq.Missing(t, "%s is not installed (hack/install-deps.sh)", bin)
		}
	}
	for _, f := range []string{lab.OVMFCode, "/usr/lib/ipxe/undionly.kpxe", "/usr/lib/ipxe/ipxe.efi"} {
		if _, err := os.Stat(f); err != nil {
			prereq.Missing(t, "%v (hack/install-deps.sh)", err)
		}
	}
	for _, env := range []string{"COZY_BOOT_ASSETS", "KUBEBUILDER_ASSETS", "COZY_NODE_ASSETS", "COZY_LAB_IMAGES"} {
		if os.Getenv(env) == "" {
			prereq.Missing(t, "%s is not set (make lab-test sets it)", env)
		}
	}
	sweepOrphanLabs()
}

// upLab is `cozyctl lab up` of c, with this test binary as cozyctl. It
// fails the test if the lab does not come up, and returns a function that
// tears it down (also run when the test ends) and keeps the serial logs
// and the bootstrap's output in $COZY_TEST_ARTIFACTS.
func upLab(ctx context.Context, t *testing.T, c *lab.Config) (*lab.Result, func()) {
	t.Helper()
	res, down, err := tryUpLab(ctx, t, c, upOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return res, down
}

// upOptions change how a test brings its lab up.
type upOptions struct {
	// nodesWait bounds the wait for Ready nodes and CoreDNS (0: the
	// tests' default).
	nodesWait time.Duration
	// noBootstrap stops with the VMs off and their BMCs answering.
	noBootstrap bool
}

// tryUpLab is upLab for a caller that wants lab up's failure, and its
// partial result, back: on failure it logs what the cluster was doing.
func tryUpLab(ctx context.Context, t *testing.T, c *lab.Config, opts upOptions) (*lab.Result, func(), error) {
	t.Helper()
	filled, err := c.WithDefaults()
	if err != nil {
		t.Fatal(err)
	}
	*c = filled
	node := nodeBinary(t)
	var progress syncbuf.Buffer // the bootstrap's log and progress
	down := sync.OnceFunc(func() {
		if err := lab.Down(context.Background(), c, false); err != nil {
			t.Errorf("lab down: %v", err)
		}
		keepArtifacts(t, c, progress.String())
	})
	t.Cleanup(down)
	timeout := map[bool]time.Duration{false: 15 * time.Minute, true: 25 * time.Minute}[c.NodeServices == lab.NodeServicesOn]
	if opts.nodesWait > 0 {
		timeout = opts.nodesWait
	}
	res, err := lab.Up(ctx, c, lab.UpOptions{
		Cozyctl: cozyctl.Path(t), CacheDir: cachedir.Dir(),
		Image: func(ctx context.Context) (kernelimage.Image, error) {
			img, err := nodeimage.Build(ctx, nodeimage.Options{
				NodeBinary: node, KernelDir: os.Getenv("COZY_BOOT_ASSETS"), KubernetesDir: os.Getenv("KUBEBUILDER_ASSETS"),
				RuntimeDir: os.Getenv("COZY_NODE_ASSETS"), CacheDir: filepath.Join(cachedir.Dir(), "lab", "images"),
			})
			if err != nil {
				return kernelimage.Image{}, err
			}
			return kernelimage.Image{Kernel: img.Kernel, Initrds: []string{img.Initrd}, Cmdline: img.Cmdline}, nil
		},
		Images: func(context.Context) (string, error) { return os.Getenv("COZY_LAB_IMAGES"), nil },
		PlatformImages: func(context.Context) (string, error) {
			return testenv.BuiltDir(t, "COZY_PLATFORM_IMAGES", "hack/platform-images.sh", "index.json"), nil
		},
		FluxManifests: func(context.Context) (string, error) {
			return filepath.Join(testenv.BuiltDir(t, "COZY_FLUX_BIN", "hack/flux-controllers.sh", "install.yaml"), "install.yaml"), nil
		},
		Charts:      upstream.Maker{Source: upstream.Source{Proxies: upstream.Proxies(os.Getenv("GOPROXY")), Cache: filepath.Join(cachedir.Dir(), "modules")}},
		Stderr:      &progress,
		NoBootstrap: opts.noBootstrap,
		// Each bootstrap wait, and the wait for Ready nodes: under TCG
		// a real control plane takes long (docs/lab.md#measured).
		Timeout: timeout,
	})
	if res != nil {
		t.Logf("lab %s: %d nodes, accel %s, %s in all", c.Name, res.Nodes, res.Accel, res.Total)
		for _, p := range res.Phases {
			t.Logf("  %-34s %9s", p.Phase, p.Took)
		}
		for _, m := range res.Milestones {
			t.Logf("    %-32s at %8s", m.Name, m.At)
		}
	}
	if err != nil {
		if res != nil && res.NodeServices {
			// What the cluster was doing when lab up gave up.
			kubectl := labKubectl(ctx, c, filepath.Join(c.Dir, lab.StateDir, bootstrap.KubeconfigFile))
			for _, args := range [][]string{{"get", "nodes,pods", "-A", "-o", "wide"}, {"get", "events", "-A", "--sort-by=.lastTimestamp"},
				{"-n", "kube-system", "logs", "-l", "k8s-app=kube-dns", "--prefix", "--tail", "15"},
				{"-n", "kube-system", "logs", "-l", "k8s-app=kube-proxy", "--prefix", "--tail", "15"}} {
				out, err := kubectl(args...)
				t.Logf("kubectl %s: %v\n%s", strings.Join(args, " "), err, tail(out, 60))
			}
			if c.Platform {
				fluxPods := "app in (source-controller,kustomize-controller,helm-controller)"
				for _, args := range [][]string{{"get", "gitrepositories,kustomizations,helmrepositories,helmcharts,helmreleases", "-A"},
					{"-n", "flux-system", "logs", "-l", fluxPods, "--prefix", "--tail", "40"},
					{"-n", "flux-system", "logs", "-l", fluxPods, "--prefix", "--tail", "40", "--previous"}} {
					out, err := kubectl(args...)
					t.Logf("kubectl %s: %v\n%s", strings.Join(args, " "), err, tail(out, 130))
				}
			}
			logServiceTails(t, c, []string{"containerd", "kubelet"}, 30)
		}
		return res, down, fmt.Errorf("lab up: %w\n%s", err, tail(progress.String(), 40))
	}
	return res, down, nil
}

// sweepOrphanLabs removes the namespaces of test labs whose test process
// died without cleaning up (a killed `go test`), with what runs in them.
func sweepOrphanLabs() {
	out, _ := exec.Command("ip", "netns", "list").Output()
	for _, line := range strings.Split(string(out), "\n") {
		ns, _, _ := strings.Cut(line, " ")
		var pid int
		if _, err := fmt.Sscanf(ns, "cozy-lab-lt%d", &pid); err != nil || pid == os.Getpid() {
			continue
		}
		if _, err := os.Stat(fmt.Sprintf("/proc/%d", pid)); err == nil {
			continue // a test lab whose test may still run
		}
		if pids, _ := exec.Command("ip", "netns", "pids", ns).Output(); len(pids) > 0 {
			for _, p := range strings.Fields(string(pids)) {
				_ = exec.Command("kill", "-9", p).Run()
			}
		}
		_ = exec.Command("ip", "netns", "del", ns).Run()
	}
}

// nodeBinary is a static cozy-talos-node: $COZY_NODE_BINARY, or built now.
func nodeBinary(t *testing.T) string {
	if p := os.Getenv("COZY_NODE_BINARY"); p != "" {
		return p
	}
	out := filepath.Join(t.TempDir(), "cozy-talos-node")
	cmd := exec.Command("go", "build", "-trimpath", "-o", out, "cozy.dev/cozy/cmd/cozy-talos-node")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build cozy-talos-node: %v\n%s", err, b)
	}
	return out
}

// keepArtifacts copies the VMs' serial logs and the bootstrap's output to
// $COZY_TEST_ARTIFACTS.
func keepArtifacts(t *testing.T, c *lab.Config, bootstrapLog string) {
	dir := os.Getenv("COZY_TEST_ARTIFACTS")
	if dir == "" {
		return
	}
	_ = os.MkdirAll(dir, 0o755)
	_ = os.WriteFile(filepath.Join(dir, "lab-"+c.Name+"-bootstrap.log"), []byte(bootstrapLog), 0o644)
	for _, m := range c.Machines() {
		data, err := os.ReadFile(filepath.Join(c.Dir, "vms", m.Name, "serial.log"))
		if err != nil {
			continue
		}
		_ = os.MkdirAll(dir, 0o755)
		_ = os.WriteFile(filepath.Join(dir, "lab-"+c.Name+"-"+m.Name+"-serial.log"), data, 0o644)
	}
}

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// logServiceTails logs the last lines of node services' logs on every
// machine, read through the Talos API (talosctl logs SERVICE --tail N).
func logServiceTails(t *testing.T, c *lab.Config, services []string, lines int32) {
	t.Helper()
	tc, err := clientconfig.Open(filepath.Join(c.Dir, lab.StateDir, "talos", "talosconfig"))
	if err != nil {
		t.Logf("talosconfig: %v", err)
		return
	}
	dial := netns.Dialer(lab.Namespace(c.Name))
	for _, m := range c.Machines() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		cl, err := talosclient.New(ctx, talosclient.WithConfig(tc), talosclient.WithEndpoints(m.IP.String()),
			talosclient.WithGRPCDialOptions(grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) { return dial(ctx, "tcp", addr) })))
		if err != nil {
			t.Logf("%s: Talos API: %v", m.Name, err)
			cancel()
			continue
		}
		for _, svc := range services {
			var out strings.Builder
			stream, err := cl.Logs(ctx, "system", common.ContainerDriver_CONTAINERD, svc, false, lines)
			for err == nil {
				var d *common.Data
				if d, err = stream.Recv(); err == nil {
					out.Write(d.GetBytes())
				}
			}
			t.Logf("%s: talosctl logs %s --tail %d (%v):\n%s", m.Name, svc, lines, err, out.String())
		}
		cl.Close() //nolint:errcheck
		cancel()
	}
}
