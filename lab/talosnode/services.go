package talosnode

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/siderolabs/talos/pkg/machinery/config/config"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

// The node services every configured Talos node runs, emulated here with
// the real programs: containerd (with runc and the CNI plugins), KubePrism,
// and kubelet, which joins the cluster with the bootstrap token and
// rotates its certificate; then the Node's labels and taints from the
// config. Control planes add the controller-manager, the scheduler and
// the bootstrap manifests once their API server runs (controlplane.go).

// kernelDefaults are the kernel settings Talos makes on every machine
// that kubelet's protectKernelDefaults checks, and IP forwarding.
var kernelDefaults = map[string]string{
	"vm.overcommit_memory":         "1",
	"vm.panic_on_oom":              "0",
	"kernel.panic":                 "10",
	"kernel.panic_on_oops":         "1",
	"kernel.keys.root_maxkeys":     "1000000",
	"kernel.keys.root_maxbytes":    "25000000",
	"net.ipv4.ip_forward":          "1",
	"net.ipv6.conf.all.forwarding": "1",
}

// netnsDefaults are per network namespace, so a node on the container
// platform sets them too: forwarding for pod traffic, and bridged pod
// traffic through netfilter for kube-proxy's rules.
var netnsDefaults = map[string]string{
	"net.ipv4.ip_forward":                 "1",
	"net.ipv6.conf.all.forwarding":        "1",
	"net.bridge.bridge-nf-call-iptables":  "1",
	"net.bridge.bridge-nf-call-ip6tables": "1",
}

// startNodeServices starts containerd, KubePrism and kubelet for this
// boot, under ctx; wg tracks them. Failures to start are returned;
// later failures are logged and retried by the supervisors.
func (n *Node) startNodeServices(ctx context.Context, wg *sync.WaitGroup, mc config.Config, hostname string) error {
	c := n.cfg
	sysctls := netnsDefaults
	if c.Platform == PlatformMetal {
		sysctls = kernelDefaults
		if err := writeSysctls(mc.Machine().Sysctls()); err != nil {
			n.log.Warn("machine.sysctls", "err", err)
		}
	}
	if err := writeSysctls(sysctls); err != nil {
		n.log.Warn("kernel settings", "err", err)
	}
	for _, d := range []string{kubernetesDir, filepath.Dir(kubernetesCACert), staticPodDir, kubeletRootDir, cniConfDir, podLogsDir, containerLogsDir, filepath.Join(c.StateDir, LogDir)} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return err
		}
	}
	if err := writeFileAtomic(podResolvConf, podResolvConfFor(mc), 0o644); err != nil {
		return err
	}

	// containerd.
	if err := writeCRIConfig(mc, c.Bin.Runc, c.Bin.CNIDir, c.Platform); err != nil {
		return fmt.Errorf("containerd config: %w", err)
	}
	logs := filepath.Join(c.StateDir, LogDir)
	env := []string{"PATH=" + strings.Join(pathOf(c.Bin.Containerd, c.Bin.Runc), ":")}
	wg.Go(func() {
		superviseEnv(ctx, n.log, n.spawn, "containerd", c.Bin.Containerd,
			[]string{"--address", containerdSocket, "--config", criConfigFile}, env, filepath.Join(logs, "containerd.log"))
	})
	waitCtx, cancel := context.WithTimeout(ctx, time.Minute)
	err := waitSocket(waitCtx, containerdSocket)
	cancel()
	if err != nil {
		return fmt.Errorf("containerd: %w (log: %s)", err, filepath.Join(logs, "containerd.log"))
	}

	// KubePrism.
	if listen, ups, ok := kubePrism(mc); ok {
		wg.Go(func() {
			for ctx.Err() == nil {
				if err := runKubePrism(ctx, n.log, listen, ups); err != nil {
					n.log.Warn("KubePrism", "err", err)
					sleep(ctx, 2*time.Second)
				}
			}
		})
	}

	// kubelet.
	bin, args, err := n.kubeletSpec(mc, hostname)
	if err != nil {
		return err
	}
	// The kubelet starts once the cluster's API server is ready. Here the
	// API server is not a control plane kubelet's static pod but a
	// process of the node, so nothing needs the kubelet before; and every
	// kubelet retrying its bootstrap, its informers and its lease against
	// an API server still coming up costs that API server, on an emulated
	// CPU, the time it needs to come up at all (its RBAC bootstrap timed
	// out).
	n.log.Info("kubelet: waiting for the cluster's API server", "endpoint", localAPIEndpoint(mc))
	if err := waitClusterAPI(ctx, mc); err != nil {
		return err
	}
	kubelet := newProgram(bin, args)
	n.mu.Lock()
	n.kubelet = kubelet
	n.mu.Unlock()
	wg.Go(func() {
		superviseProgram(ctx, n.log, n.spawn, "kubelet", kubelet, env, filepath.Join(logs, "kubelet.log"))
	})

	// The Node's labels, annotations and taints, once it is registered.
	wg.Go(func() { n.applyNodeSpec(ctx, mc, hostname) })
	return nil
}

// reconfigureKubelet makes the running kubelet run as mc says (a config
// applied without a reboot), restarting it if its binary (the version
// machine.kubelet.image names) or its flags change, as Talos restarts
// its kubelet service when the kubelet spec changes.
func (n *Node) reconfigureKubelet(mc config.Config, hostname string) error {
	n.mu.Lock()
	kubelet := n.kubelet
	n.mu.Unlock()
	if kubelet == nil {
		return nil
	}
	bin, args, err := n.kubeletSpec(mc, hostname)
	if err != nil {
		return err
	}
	if kubelet.set(bin, args) {
		n.log.Info("restarting with the new machine config", "process", "kubelet", "binary", bin)
	}
	return nil
}

// kubeletSpec writes the kubelet's files for mc and returns its binary
// (of the version machine.kubelet.image names) and flags.
func (n *Node) kubeletSpec(mc config.Config, hostname string) (bin string, args []string, err error) {
	c := n.cfg
	nodeIP, err := kubeletNodeIP(mc, c.Address)
	if err != nil {
		return "", nil, err
	}
	cgroupRoot := "/"
	if c.Platform == PlatformContainer {
		cgroupRoot = nodeCgroup(c.Hostname)
	}
	if err := writeKubeletFiles(mc, hostname, c.Platform, cgroupRoot); err != nil {
		return "", nil, fmt.Errorf("kubelet files: %w", err)
	}
	if args, err = kubeletArgs(mc, hostname, nodeIP); err != nil {
		return "", nil, err
	}
	return c.kubeBinary("kubelet", mc.Machine().Kubelet().Image()), args, nil
}

// pathOf is a PATH holding the directories of the given binaries, then
// the system's: containerd finds its shim and runc there.
func pathOf(bins ...string) []string {
	var dirs []string
	for _, b := range bins {
		if d := filepath.Dir(b); filepath.IsAbs(b) && !slices.Contains(dirs, d) {
			dirs = append(dirs, d)
		}
	}
	return append(dirs, "/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin")
}

// writeKubeletFiles writes what kubelet starts with, as Talos does
// before each kubelet start: the cluster CAs, the bootstrap kubeconfig,
// the config file; and it drops the kubelet's self-signed serving
// certificate so kubelet makes a fresh one.
func writeKubeletFiles(mc config.Config, nodeName string, p Platform, cgroupRoot string) error {
	if err := writeFileAtomic(kubernetesCACert, clusterCAs(mc.Cluster()), 0o400); err != nil {
		return err
	}
	bkc, err := bootstrapKubeconfig(mc)
	if err != nil {
		return err
	}
	if err := writeFileAtomic(kubeletBootstrapKC, bkc, 0o600); err != nil {
		return err
	}
	kc, err := kubeletConfiguration(mc, p, cgroupRoot)
	if err != nil {
		return err
	}
	data, err := kubeletConfigYAML(kc)
	if err != nil {
		return err
	}
	if err := writeFileAtomic(kubeletConfigFile, data, 0o600); err != nil {
		return err
	}
	for _, f := range []string{"kubelet.crt", "kubelet.key"} {
		if err := os.Remove(filepath.Join(kubeletPKIDir, f)); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
	}
	return nil
}

// podResolvConfFor is the resolv.conf of pods with dnsPolicy Default,
// CoreDNS's upstream: Talos's host DNS address when the config forwards
// kube DNS to it, else the machine's resolvers (machine.network
// .nameservers, then the node's /etc/resolv.conf), never loopback, where
// CoreDNS would find itself.
func podResolvConfFor(mc config.Config) []byte {
	if f := mc.Machine().Features().HostDNS(); f != nil && f.ForwardKubeDNSToHost() {
		return []byte("nameserver 169.254.116.108\n")
	}
	var servers []string
	if rc := mc.NetworkResolverConfig(); rc != nil {
		for _, a := range rc.Resolvers() {
			servers = append(servers, a.String())
		}
	}
	if len(servers) == 0 {
		if f, err := os.Open("/etc/resolv.conf"); err == nil {
			s := bufio.NewScanner(f)
			for s.Scan() {
				if fields := strings.Fields(s.Text()); len(fields) == 2 && fields[0] == "nameserver" {
					servers = append(servers, fields[1])
				}
			}
			f.Close()
		}
	}
	var b strings.Builder
	for _, s := range servers {
		if a, err := netip.ParseAddr(s); err == nil && !a.IsLoopback() {
			fmt.Fprintf(&b, "nameserver %s\n", s)
		}
	}
	if b.Len() == 0 {
		// Talos's default resolvers.
		b.WriteString("nameserver 1.1.1.1\nnameserver 8.8.8.8\n")
	}
	return []byte(b.String())
}

// writeSysctls writes kernel settings through /proc/sys; one that the
// kernel lacks (a module not loaded) is reported, the others still set.
func writeSysctls(settings map[string]string) error {
	var errs []error
	for k, v := range settings {
		p := filepath.Join("/proc/sys", strings.ReplaceAll(k, ".", "/"))
		if err := os.WriteFile(p, []byte(v), 0o644); err != nil {
			errs = append(errs, fmt.Errorf("%s=%s: %w", k, v, err))
		}
	}
	return errors.Join(errs...)
}

// applyNodeSpec puts the config's labels, annotations and taints on the
// Node once kubelet has registered it, as Talos's node-apply controller
// does: with a short-lived admin certificate on a control plane, with
// kubelet's own credentials (so NodeRestriction applies) on a worker.
func (n *Node) applyNodeSpec(ctx context.Context, mc config.Config, nodeName string) {
	spec := desiredNode(mc)
	_ = retry(ctx, func() error {
		cfg, err := nodeApplyConfig(mc)
		if err == nil {
			attempt, cancel := context.WithTimeout(ctx, 30*time.Second)
			err = applyNode(attempt, cfg, nodeName, spec)
			cancel()
		}
		if err == nil {
			n.log.Info("node labels and taints applied", "node", nodeName)
		} else {
			n.log.Debug("node labels and taints: not yet", "err", err)
		}
		return err
	})
}

func nodeApplyConfig(mc config.Config) (*rest.Config, error) {
	if mc.Machine().Type().IsControlPlane() {
		return adminRESTConfig(mc, localAPIEndpoint(mc))
	}
	return clientcmd.BuildConfigFromFlags("", kubeletKubeconfig)
}

// adminRESTConfig is a client of the API at server with a fresh admin
// certificate from cluster.ca, valid ten minutes, as Talos's internal
// admin.
func adminRESTConfig(mc config.Config, server string) (*rest.Config, error) {
	cl := mc.Cluster()
	kp, err := clusterClientCert(cl, "talos:admin", "system:masters", 10*time.Minute)
	if err != nil {
		return nil, err
	}
	return &rest.Config{
		Host: server,
		TLSClientConfig: rest.TLSClientConfig{
			CAData: clusterCAs(cl), CertData: kp.CrtPEM, KeyData: kp.KeyPEM,
		},
		Timeout: 30 * time.Second,
	}, nil
}

// sleep waits d or until ctx ends; false if ctx ended.
func sleep(ctx context.Context, d time.Duration) bool {
	select {
	case <-ctx.Done():
		return false
	case <-time.After(d):
		return true
	}
}

// prepareMachine gives the node its system directories from its disk,
// and on the container platform a cgroup tree of its own. Binding over
// Talos's paths is only safe where the node owns the mount namespace: a
// private one (container platform), or a lab VM's, where the node is the
// child of the machine's init.
func (n *Node) prepareMachine() error {
	switch n.cfg.Platform {
	case PlatformContainer:
		if err := privateMountNamespace(); err != nil {
			return err
		}
		if err := mountHostCgroups(); err != nil {
			return fmt.Errorf("cgroups: %w", err)
		}
		if err := enterNodeCgroup(n.cfg.Hostname); err != nil {
			return fmt.Errorf("cgroups: %w", err)
		}
	default:
		if os.Getppid() != 1 {
			return errors.New("node services on the metal platform run only as the child of the machine's init (a lab VM); on a shared host use --platform container")
		}
	}
	return bindSystemDirs(filepath.Join(n.cfg.StateDir, SystemDir))
}

// killLeftovers kills what containerd's shims and pods leave behind when
// the node stops: they are not its children. Only the container platform
// needs it; a VM's reboot ends them.
func (n *Node) killLeftovers() {
	if !n.cfg.NodeServices || n.cfg.Platform != PlatformContainer {
		return
	}
	if err := KillNodeCgroup(n.cfg.Hostname); err != nil {
		n.log.Warn("kill what the node left running", "err", err)
	}
}

// waitClusterAPI polls the cluster's /readyz through the node's local
// API endpoint (KubePrism), anonymously as kubelet first would, on one
// connection, until it answers ok or ctx ends.
func waitClusterAPI(ctx context.Context, mc config.Config) error {
	cfg := &rest.Config{Host: localAPIEndpoint(mc), TLSClientConfig: rest.TLSClientConfig{CAData: clusterCAs(mc.Cluster())}, Timeout: 30 * time.Second}
	return pollReadyz(ctx, cfg, 3*time.Second)
}

// reportCPU logs, every interval, the CPU time each program of the node
// has used: on an emulated machine, where CPU is what runs out, the
// serial console then says who spent it.
func (n *Node) reportCPU(ctx context.Context, interval time.Duration) {
	for sleep(ctx, interval) {
		cpu := n.spawn.cpu()
		names := make([]string, 0, len(cpu))
		for name := range cpu {
			names = append(names, name)
		}
		slices.Sort(names)
		attrs := make([]any, 0, 2*len(names))
		for _, name := range names {
			attrs = append(attrs, name, cpu[name].Round(100*time.Millisecond).String())
		}
		n.log.Info("CPU time", attrs...)
	}
}
