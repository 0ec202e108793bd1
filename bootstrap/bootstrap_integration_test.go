//go:build integration

package bootstrap_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/insomniacslk/dhcp/dhcpv4"
	"github.com/insomniacslk/dhcp/dhcpv4/nclient4"
	"github.com/insomniacslk/dhcp/iana"
	"k8s.io/client-go/rest"

	"cozy.dev/cozy/bootstrap"
	"cozy.dev/cozy/bootstrap/state"
	"cozy.dev/cozy/internal/testing/cozyctl"
	"cozy.dev/cozy/internal/testing/netnstest"
	"cozy.dev/cozy/internal/testing/prereq"
	"cozy.dev/cozy/internal/testing/syncbuf"
)

// rackRig is a provisioning network in a namespace: a bridge where the
// netboot server answers, and one veth per machine whose far end is the
// machine's NIC, with its MAC, in the machine's own namespace. Machines
// are emulated Talos nodes (lab/talosnode) running as processes there, so
// each has its own network stack as a real machine does (etcd checks that
// a peer connects from an address its certificate names).
type rackRig struct {
	t        *testing.T
	ns       *netnstest.NS
	dir      string
	rackFile string
	stateDir string
	nodes    []*emuNode
	assets   string
	// nodeArgs are more flags for every emulated node.
	nodeArgs []string
}

type emuNode struct {
	host, role, mac, ip, iface string
	port                       string        // its link's end on the rack's bridge
	ns                         *netnstest.NS // the machine's network stack
	dir                        string
	cmd                        *exec.Cmd
	log                        *syncbuf.Buffer
}

const rigSubnet = "10.79.0"

// bootstrapLogLine is what the emulated node logs when a Bootstrap call
// really starts etcd.
const bootstrapLogLine = "bootstrap: etcd and kube-apiserver started"

// newRackRig makes the rig for a rack of control planes and workers; rack
// is extra top-level YAML for the rack file (a cluster: section).
func newRackRig(t *testing.T, controlPlanes, workers int, rack ...string) *rackRig {
	t.Helper()
	return newRackRigWith(t, controlPlanes, workers, nil, rack...)
}

// newRackRigWith is newRackRig with more YAML for each machine (indented
// as its fields), from machineYAML(hostname).
func newRackRigWith(t *testing.T, controlPlanes, workers int, machineYAML func(host string) string, rack ...string) *rackRig {
	t.Helper()
	assets := os.Getenv("KUBEBUILDER_ASSETS")
	if assets == "" {
		prereq.Missing(t, "KUBEBUILDER_ASSETS is not set: run make envtest (the emulated control plane runs a real etcd and kube-apiserver)")
	}
	r := &rackRig{t: t, ns: netnstest.New(t, "rack"), dir: t.TempDir(), assets: assets}
	r.stateDir = filepath.Join(r.dir, "state")
	r.ns.IP(t, "link", "add", "br0", "type", "bridge")
	r.ns.IP(t, "addr", "add", rigSubnet+".1/24", "dev", "br0")
	r.ns.IP(t, "link", "set", "br0", "up")

	var machines strings.Builder
	add := func(host, role string, i int) {
		n := &emuNode{host: host, role: role, mac: fmt.Sprintf("52:54:00:79:00:%02x", i), ip: fmt.Sprintf("%s.%d", rigSubnet, 10+i),
			iface: "eth0", ns: netnstest.New(t, host), dir: filepath.Join(r.dir, "disk-"+host), log: &syncbuf.Buffer{}}
		n.port = fmt.Sprintf("n%d", i)
		netnstest.Veth(t, r.ns, n.port, "", n.ns, n.iface, "")
		n.ns.IP(t, "link", "set", n.iface, "address", n.mac)
		r.ns.IP(t, "link", "set", n.port, "master", "br0")
		r.nodes = append(r.nodes, n)
		fmt.Fprintf(&machines, `  - hostname: %s
    role: %s
    mac: "%s"
    install: {disk: /dev/vda}
    interfaces:
      - {mac: "%s", addresses: [%s/24]}
`, host, role, n.mac, n.mac, n.ip)
		if machineYAML != nil {
			machines.WriteString(machineYAML(host))
		}
	}
	for i := range controlPlanes {
		add(fmt.Sprintf("cp%d", i+1), "controlplane", i+1)
	}
	for i := range workers {
		add(fmt.Sprintf("w%d", i+1), "worker", controlPlanes+i+1)
	}
	rackYAML := fmt.Sprintf(`apiVersion: cozy.dev/v1alpha1
kind: Rack
metadata: {name: itest}
`+strings.Join(rack, "")+`network:
  interface: br0
  subnet: %[1]s.0/24
  dhcp: {mode: full, range: %[1]s.100-%[1]s.199}
machines:
%[2]s`, rigSubnet, machines.String())
	r.rackFile = filepath.Join(r.dir, "rack.yaml")
	for name, data := range map[string]string{"rack.yaml": rackYAML, "vmlinuz": "kernel", "initrd": "initramfs"} {
		if err := os.WriteFile(filepath.Join(r.dir, name), []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return r
}

// run is one `cozyctl bootstrap` process.
type run struct {
	cmd    *exec.Cmd
	stderr *syncbuf.Buffer
	events chan bootstrap.Event
	done   chan error
}

// bootstrap starts `cozyctl bootstrap -o json` in the namespace.
func (r *rackRig) bootstrap(extra ...string) *run {
	r.t.Helper()
	return r.bringUp([]string{"bootstrap"}, extra...)
}

// bringUp starts `cozyctl COMMAND -o json` with the bootstrap's flags in
// the namespace: bootstrap, or node add.
func (r *rackRig) bringUp(command []string, extra ...string) *run {
	r.t.Helper()
	args := append(append(command, "--rack", r.rackFile, "--state-dir", r.stateDir, "-o", "json",
		"--kernel", filepath.Join(r.dir, "vmlinuz"), "--initrd", filepath.Join(r.dir, "initrd"),
		"--timeout", "90s", "--log-level", "debug"), extra...)
	p := &run{cmd: r.ns.Command(context.Background(), cozyctl.Path(r.t), args...), stderr: &syncbuf.Buffer{}, events: make(chan bootstrap.Event, 256), done: make(chan error, 1)}
	p.cmd.Stderr = p.stderr
	out, err := p.cmd.StdoutPipe()
	if err != nil {
		r.t.Fatal(err)
	}
	if err := p.cmd.Start(); err != nil {
		r.t.Fatal(err)
	}
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			var e bootstrap.Event
			if json.Unmarshal(sc.Bytes(), &e) == nil {
				p.events <- e
			}
		}
		close(p.events)
		p.done <- p.cmd.Wait()
	}()
	r.t.Cleanup(func() { _ = p.cmd.Process.Kill() })
	return p
}

// boot netboots every machine: a DHCP exchange from its NIC (which puts
// it in the server's inventory), its reserved address on the NIC, and the
// emulated Talos node started on it in maintenance mode.
func (r *rackRig) boot(ctx context.Context) {
	r.t.Helper()
	r.bootSome(ctx, r.nodes...)
}

// bootSome netboots the machines named, as boot does all.
func (r *rackRig) bootSome(ctx context.Context, nodes ...*emuNode) {
	r.t.Helper()
	var wg sync.WaitGroup
	for _, n := range nodes {
		wg.Go(func() { r.dhcp(ctx, n) })
	}
	wg.Wait()
	for _, n := range nodes {
		n.ns.IP(r.t, "addr", "add", n.ip+"/24", "dev", n.iface)
		r.start(n)
	}
}

func (r *rackRig) dhcp(ctx context.Context, n *emuNode) {
	r.t.Helper()
	hw, _ := net.ParseMAC(n.mac)
	for {
		var lease *nclient4.Lease
		err := n.ns.Do(func() error {
			c, err := nclient4.New(n.iface, nclient4.WithHWAddr(hw), nclient4.WithTimeout(300*time.Millisecond), nclient4.WithRetry(1))
			if err != nil {
				return err
			}
			defer c.Close()
			// As a UEFI firmware's PXE client asks (the inventory lists
			// netboot clients only).
			lease, err = c.Request(ctx,
				dhcpv4.WithOption(dhcpv4.OptClassIdentifier("PXEClient:Arch:00007:UNDI:003016")),
				dhcpv4.WithOption(dhcpv4.OptClientArch(iana.EFI_X86_64)))
			return err
		})
		if err == nil {
			if got := lease.ACK.YourIPAddr.String(); got != n.ip {
				r.t.Errorf("%s leased %s, want its reserved %s", n.host, got, n.ip)
			}
			return
		}
		if ctx.Err() != nil {
			r.t.Errorf("%s: no DHCP lease: %v", n.host, err)
			return
		}
	}
}

// node is the rig's node of that name.
func (r *rackRig) node(host string) *emuNode {
	i := slices.IndexFunc(r.nodes, func(n *emuNode) bool { return n.host == host })
	if i < 0 {
		r.t.Fatalf("no node %s in the rig", host)
	}
	return r.nodes[i]
}

// start runs (or restarts) the emulated node with its disk.
func (r *rackRig) start(n *emuNode) {
	self, _ := os.Executable()
	args := append([]string{"--address", n.ip + "/24", "--state-dir", n.dir,
		"--mac", n.mac, "--disk", "vda:20GiB:virtio", "--reboot-delay", "500ms",
		"--etcd", filepath.Join(r.assets, "etcd"), "--kube-apiserver", filepath.Join(r.assets, "kube-apiserver"),
		// Not run without --node-services, but what the node has: an
		// upgrade pre-pulls them.
		"--kube-controller-manager", filepath.Join(r.assets, "kube-controller-manager"),
		"--kube-scheduler", filepath.Join(r.assets, "kube-scheduler"), "--kubelet", filepath.Join(r.assets, "kubelet")}, r.nodeArgs...)
	n.cmd = n.ns.Command(context.Background(), self, args...)
	n.cmd.Env = append(os.Environ(), "COZY_TEST_RUN_TALOS_NODE=1")
	n.cmd.Stdout, n.cmd.Stderr = n.log, n.log
	if err := n.cmd.Start(); err != nil {
		r.t.Fatal(err)
	}
	cmd := n.cmd
	r.t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(15 * time.Second):
			_ = cmd.Process.Kill()
		}
		if r.t.Failed() {
			r.t.Logf("node %s log:\n%s", n.host, tail(n.log.String(), 40))
			for _, f := range []string{"etcd.log", "kube-apiserver.log"} {
				if b, err := os.ReadFile(filepath.Join(n.dir, "logs", f)); err == nil {
					r.t.Logf("node %s %s:\n%s", n.host, f, tail(string(b), 400))
				}
			}
		}
	})
}

// rigVIP is the control planes' shared address in haRack's racks.
const rigVIP = rigSubnet + ".9"

// haRack is a rack of control planes behind a VIP (rigVIP) and workers,
// netbooted and bootstrapped by `cozyctl bootstrap`, for the day-2 tests;
// and a client config of its cluster through the VIP.
func haRack(ctx context.Context, t *testing.T, controlPlanes, workers int) (*rackRig, *rest.Config) {
	t.Helper()
	return haRackWith(ctx, t, controlPlanes, workers, "", nil)
}

// haRackWith is haRack with more of the rack's cluster: section (flow
// YAML fields: "kubernetesVersion: 1.36.1") and more flags for the nodes.
func haRackWith(ctx context.Context, t *testing.T, controlPlanes, workers int, cluster string, nodeArgs []string) (*rackRig, *rest.Config) {
	t.Helper()
	if cluster != "" {
		cluster = ", " + cluster
	}
	r := newRackRig(t, controlPlanes, workers, "cluster: {vip: "+rigVIP+cluster+"}\n")
	r.nodeArgs = nodeArgs
	p := r.bootstrap()
	t.Cleanup(func() { r.failLogs(p) })
	r.boot(ctx)
	for range p.events {
	}
	if err := <-p.done; err != nil {
		t.Fatalf("bootstrap: %v", err)
	}
	rc, err := r.ns.RESTConfig(filepath.Join(r.stateDir, bootstrap.KubeconfigFile))
	if err != nil {
		t.Fatal(err)
	}
	return r, rc
}

// cozyctl runs `cozyctl ARGS --rack R --state-dir S -o json` in the
// rig's namespace.
func (r *rackRig) cozyctl(ctx context.Context, args ...string) (stdout, stderr string, err error) {
	cmd := r.ns.Command(ctx, cozyctl.Path(r.t), append(args, "--rack", r.rackFile, "--state-dir", r.stateDir, "-o", "json")...)
	var out, errOut strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err = cmd.Run()
	return out.String(), errOut.String(), err
}

// killedRuns starts `cozyctl ARGS --rack R --state-dir S` ten times and
// kills each (SIGKILL) after a random time between from and from+spread.
func (r *rackRig) killedRuns(ctx context.Context, from, spread time.Duration, args ...string) {
	r.t.Helper()
	for i := range 10 {
		cmd := r.ns.Command(ctx, cozyctl.Path(r.t), append(args, "--rack", r.rackFile, "--state-dir", r.stateDir)...)
		if err := cmd.Start(); err != nil {
			r.t.Fatal(err)
		}
		after := from + time.Duration(rand.Int64N(int64(spread))).Round(time.Millisecond)
		time.Sleep(after)
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		r.t.Logf("run %d killed after %v", i+1, after)
	}
}

func (r *rackRig) failLogs(p *run) {
	if r.t.Failed() {
		r.t.Logf("bootstrap stderr:\n%s", tail(p.stderr.String(), 60))
	}
}

// TestBootstrapRack takes three emulated machines from maintenance mode to
// a cluster whose kubeconfig answers /version, found through the real
// netboot server's inventory.
func TestBootstrapRack(t *testing.T) {
	r := newRackRig(t, 1, 2)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	p := r.bootstrap()
	defer r.failLogs(p)
	r.boot(ctx)

	phases := map[string][]state.Phase{}
	for e := range p.events {
		if e.Node != "" {
			if l := phases[e.Node]; len(l) == 0 || l[len(l)-1] != e.Phase {
				phases[e.Node] = append(l, e.Phase)
			}
		}
	}
	if err := <-p.done; err != nil {
		t.Fatalf("bootstrap: %v", err)
	}
	want := map[string]string{
		"cp1": "pending discovered applied configured etcd ready",
		"w1":  "pending discovered applied configured ready",
		"w2":  "pending discovered applied configured ready",
	}
	for node, w := range want {
		if got := phaseList(phases[node]); got != w {
			t.Errorf("%s went through %q, want %q", node, got, w)
		}
	}
	kubeconfig := filepath.Join(r.stateDir, bootstrap.KubeconfigFile)
	if fi, err := os.Stat(kubeconfig); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("kubeconfig: %v", err)
	}
	v, err := r.ns.KubeVersion(kubeconfig)
	if err != nil || !strings.HasPrefix(v, "v1.") {
		t.Errorf("/version through the cluster endpoint: %q, %v", v, err)
	}
	if !strings.Contains(p.stderr.String(), "cluster itest is up") {
		t.Errorf("no closing line on stderr:\n%s", tail(p.stderr.String(), 5))
	}

	// Run again: everything is done, nothing is applied or bootstrapped.
	again := r.bootstrap()
	for range again.events {
	}
	if err := <-again.done; err != nil {
		t.Fatalf("second run: %v\n%s", err, again.stderr)
	}
	if strings.Contains(again.stderr.String(), "config applied") {
		t.Error("the second run applied configs again")
	}
}

// TestBootstrapHA bootstraps three control planes and a worker behind a
// VIP: etcd is bootstrapped on cp1 only, cp2 and cp3 join it by themselves
// (as learners, then promoted), one control plane holds the VIP (the
// cluster endpoint, and where the worker gets its certificate), and
// bootstrap ends once all three are voting members, each running its own
// kube-apiserver.
func TestBootstrapHA(t *testing.T) {
	const vip = rigSubnet + ".9"
	r := newRackRig(t, 3, 1, "cluster: {vip: "+vip+"}\n")
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	p := r.bootstrap()
	defer r.failLogs(p)
	r.boot(ctx)
	var joined string
	for e := range p.events {
		if strings.HasPrefix(e.Message, "etcd has ") {
			joined = e.Message
		}
	}
	if err := <-p.done; err != nil {
		t.Fatalf("bootstrap: %v", err)
	}
	if joined != "etcd has 3 of 3 control planes" {
		t.Errorf("last etcd membership event %q, want 3 of 3", joined)
	}
	for _, n := range r.nodes {
		log := n.log.String()
		bootstrapped := strings.Count(log, bootstrapLogLine)
		promoted := strings.Count(log, "join etcd: promoted to a voting member")
		want := map[string][2]int{"cp1": {1, 0}, "cp2": {0, 1}, "cp3": {0, 1}, "w1": {0, 0}}[n.host]
		if bootstrapped != want[0] || promoted != want[1] {
			t.Errorf("%s: bootstrapped %d times and joined %d times, want %d and %d", n.host, bootstrapped, promoted, want[0], want[1])
		}
	}
	var holders int
	for _, n := range r.nodes {
		if strings.Contains(n.log.String(), "vip: this node holds the shared address") {
			holders++
		}
	}
	if holders < 1 {
		t.Error("no control plane took the VIP")
	}
	// Each control plane's kube-apiserver registered itself; the
	// kubeconfig reaches them through the VIP.
	rc, err := r.ns.RESTConfig(filepath.Join(r.stateDir, bootstrap.KubeconfigFile))
	if err != nil {
		t.Fatal(err)
	}
	if rc.Host != "https://"+vip+":6443" {
		t.Errorf("kubeconfig server %s, want the VIP", rc.Host)
	}
	hc, err := rest.HTTPClientFor(rc)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for range 60 { // kube-apiservers register on their own schedule
		got = got[:0]
		resp, err := hc.Get(rc.Host + "/apis/discovery.k8s.io/v1/namespaces/default/endpointslices/kubernetes")
		if err == nil {
			var slice struct {
				Endpoints []struct{ Addresses []string }
			}
			_ = json.NewDecoder(resp.Body).Decode(&slice)
			resp.Body.Close()
			for _, e := range slice.Endpoints {
				got = append(got, e.Addresses...)
			}
		}
		if len(got) == 3 {
			break
		}
		time.Sleep(time.Second)
	}
	slices.Sort(got)
	if want := []string{rigSubnet + ".11", rigSubnet + ".12", rigSubnet + ".13"}; !slices.Equal(got, want) {
		t.Errorf("kubernetes EndpointSlice addresses %v, want %v", got, want)
	}
}

func phaseList(ps []state.Phase) string {
	s := make([]string, len(ps))
	for i, p := range ps {
		s[i] = string(p)
	}
	return strings.Join(s, " ")
}

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// TestBootstrapCrashResume kills `cozyctl bootstrap` right after each
// phase in turn and runs it again: every run converges, secrets.yaml never
// changes, and etcd is bootstrapped once.
func TestBootstrapCrashResume(t *testing.T) {
	r := newRackRig(t, 1, 2)
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	secretsPath := filepath.Join(r.stateDir, bootstrap.TalosDir, "secrets.yaml")
	var secrets []byte
	seen := map[string]bool{}
	for i, killAt := range []state.Phase{state.Discovered, state.Applied, state.Configured, state.Bootstrap} {
		p := r.bootstrap()
		killed := make(chan bool, 1)
		go func() {
			k := false
			for e := range p.events {
				key := e.Node + "/" + string(e.Phase)
				if e.Node != "" && e.Phase == killAt && !seen[key] && !k {
					_ = p.cmd.Process.Kill()
					k = true
				}
				if e.Node != "" {
					seen[key] = true
				}
			}
			killed <- k
		}()
		if i == 0 {
			r.boot(ctx)
		}
		if !<-killed {
			r.failLogs(p)
			t.Fatalf("the run meant to die after %q ended first: %v", killAt, <-p.done)
		}
		<-p.done
		got, err := os.ReadFile(secretsPath)
		if err != nil {
			t.Fatalf("after the kill at %s: %v", killAt, err)
		}
		if secrets == nil {
			secrets = got
		} else if !bytes.Equal(got, secrets) {
			t.Fatalf("secrets.yaml changed after the kill at %s", killAt)
		}
		t.Logf("killed after %s; state: %s", killAt, phasesOf(t, r.stateDir))
	}
	p := r.bootstrap()
	defer r.failLogs(p)
	for range p.events {
	}
	if err := <-p.done; err != nil {
		t.Fatalf("the final run: %v", err)
	}
	if got, _ := os.ReadFile(secretsPath); !bytes.Equal(got, secrets) {
		t.Error("secrets.yaml changed in the final run")
	}
	if v, err := r.ns.KubeVersion(filepath.Join(r.stateDir, bootstrap.KubeconfigFile)); err != nil {
		t.Errorf("/version: %q, %v", v, err)
	}
	if n := strings.Count(r.nodes[0].log.String(), bootstrapLogLine); n != 1 {
		t.Errorf("cp1 bootstrapped etcd %d times, want once", n)
	}
}

func phasesOf(t *testing.T, dir string) string {
	data, err := os.ReadFile(filepath.Join(dir, state.File))
	if err != nil {
		return err.Error()
	}
	var s state.State
	if err := json.Unmarshal(data, &s); err != nil {
		return err.Error()
	}
	var out []string
	for _, h := range []string{"cp1", "w1", "w2"} {
		if n := s.Nodes[h]; n != nil {
			out = append(out, h+"="+string(n.Phase))
		}
	}
	return strings.Join(out, " ") + " etcd=" + s.EtcdBootstrapped
}
