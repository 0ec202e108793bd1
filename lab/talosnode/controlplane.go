package talosnode

import (
	"bytes"
	"context"
	"crypto/tls"
	stdx509 "crypto/x509"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	goruntime "runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/siderolabs/crypto/x509"

	"cozy.dev/cozy/internal/procstat"
	"github.com/siderolabs/talos/pkg/machinery/api/machine"
	"github.com/siderolabs/talos/pkg/machinery/config/config"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/rest"
)

// controlPlane is etcd and kube-apiserver of a bootstrapped control plane,
// run as child processes where Talos runs etcd as a system service and
// kube-apiserver as a static pod: certified by the cluster's CAs from the
// machine config, listening on the node address only.
type controlPlane struct {
	log     *slog.Logger
	etcdURL string
	etcd    *http.Client // with an etcd client certificate
	etcdTLS *tls.Config  // the same, for etcd's own client (etcd.go)

	// halt stops kube-apiserver, then etcd; wg waits for etcd's end.
	halt func()
	wg   sync.WaitGroup

	// programs are kube-apiserver and, with the node services, the
	// controller-manager and the scheduler, by name: a config applied
	// without a reboot changes them (reconfigure).
	programs map[string]*program
	// images are the images the running config names for them.
	imagesMu sync.Mutex
	images   map[string]string
	// statusMu orders the writes of their StaticPodStatus resources.
	statusMu sync.Mutex
	// apiRestarts is signalled before kube-apiserver restarts with a new
	// config: the VIP's holder lets it go, as Talos's does when its
	// kube-apiserver static pod goes away.
	apiRestarts chan struct{}
}

// controlPlaneFiles are the paths of what etcd and kube-apiserver run with.
type controlPlaneFiles struct {
	dir string
}

func (f controlPlaneFiles) path(name string) string { return filepath.Join(f.dir, name) }

// startControlPlane writes the certificates and starts etcd, then
// kube-apiserver once etcd answers. Both are restarted if they exit, and
// stopped by stop. initialCluster is empty for a new cluster (bootstrap,
// or a restart with data), else the members of the cluster this node
// joins (joinEtcd).
func startControlPlane(c Config, mc config.Config, hostname string, spawn *spawner, initialCluster string) (*controlPlane, error) {
	pki := controlPlaneFiles{filepath.Join(c.StateDir, PKIDir)}
	etcdClient, err := writePKI(pki, c, mc, hostname)
	if err != nil {
		return nil, fmt.Errorf("control plane certificates: %w", err)
	}
	for _, dir := range []string{filepath.Join(c.StateDir, EtcdDir), filepath.Join(c.StateDir, LogDir)} {
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return nil, err
		}
	}
	// kube-apiserver stops first: it holds connections to etcd.
	etcdCtx, stopEtcd := context.WithCancel(context.Background())
	apiCtx, stopAPI := context.WithCancel(etcdCtx)
	cp := &controlPlane{
		log:     c.Logger,
		etcdURL: "https://" + c.hostPort(EtcdClientPort),
		etcd:    etcdHTTPClient(mc, etcdClient),
		etcdTLS: etcdClientTLS(mc, etcdClient),
	}
	etcdArgs := etcdArgs(c, hostname, pki, initialCluster)
	apiArgs, err := apiServerArgs(c, mc, pki)
	if err != nil {
		stopAPI()
		stopEtcd()
		return nil, err
	}
	cp.programs = map[string]*program{
		"kube-apiserver": newProgram(c.kubeBinary("kube-apiserver", mc.Cluster().APIServer().Image()), apiArgs),
	}
	cp.images = controlPlaneImages(mc)
	cp.apiRestarts = make(chan struct{}, 1)
	var api sync.WaitGroup
	cp.wg.Add(1)
	go func() {
		defer cp.wg.Done()
		supervise(etcdCtx, cp.log, spawn, "etcd", c.Bin.Etcd, etcdArgs, filepath.Join(c.StateDir, LogDir, "etcd.log"))
	}()
	api.Add(1)
	go func() {
		defer api.Done()
		if cp.waitEtcd(apiCtx) == nil {
			superviseProgram(apiCtx, cp.log, spawn, "kube-apiserver", cp.programs["kube-apiserver"], nil, filepath.Join(c.StateDir, LogDir, "kube-apiserver.log"))
		}
	}()
	if c.NodeServices {
		comps, err := controlPlaneComponents(c, mc, pki)
		if err != nil {
			stopAPI()
			api.Wait()
			stopEtcd()
			cp.wg.Wait()
			return nil, err
		}
		for _, comp := range comps {
			cp.programs[comp.name] = newProgram(comp.bin, comp.args)
		}
		// They start once the local API server is ready, as static pods
		// would start serving: until then they only fail, and under
		// emulation each failed start costs the API server CPU it needs
		// to come up.
		api.Go(func() {
			if err := waitAPIReady(apiCtx, mc); err != nil {
				return
			}
			cp.log.Info("kube-apiserver ready: starting the controller-manager and the scheduler, applying the bootstrap manifests")
			var wg sync.WaitGroup
			for _, comp := range comps {
				wg.Go(func() {
					superviseProgram(apiCtx, cp.log, spawn, comp.name, cp.programs[comp.name], nil, filepath.Join(c.StateDir, LogDir, comp.name+".log"))
				})
			}
			wg.Go(func() { cp.applyBootstrapManifests(apiCtx, mc) })
			wg.Wait()
		})
	}
	cp.halt = func() {
		stopAPI()
		api.Wait()
		stopEtcd()
	}
	return cp, nil
}

// controlPlaneImages are the images a config names for the control
// plane's components.
func controlPlaneImages(mc config.Config) map[string]string {
	cl := mc.Cluster()
	return map[string]string{
		"kube-apiserver":          cl.APIServer().Image(),
		"kube-controller-manager": cl.ControllerManager().Image(),
		"kube-scheduler":          cl.Scheduler().Image(),
	}
}

// reconfigure makes the components run as mc says, restarting those
// whose binary or arguments change, as Talos restarts a static pod whose
// spec changed after a config applied without a reboot: a new image
// there is a new binary here. etcd is left alone, as on Talos (its
// changes need a reboot).
func (cp *controlPlane) reconfigure(c Config, mc config.Config) error {
	pki := controlPlaneFiles{filepath.Join(c.StateDir, PKIDir)}
	apiArgs, err := apiServerArgs(c, mc, pki)
	if err != nil {
		return err
	}
	want := map[string]component{"kube-apiserver": {bin: c.kubeBinary("kube-apiserver", mc.Cluster().APIServer().Image()), args: apiArgs}}
	if c.NodeServices {
		comps, err := controlPlaneComponents(c, mc, pki)
		if err != nil {
			return err
		}
		for _, comp := range comps {
			want[comp.name] = comp
		}
	}
	cp.imagesMu.Lock()
	cp.images = controlPlaneImages(mc)
	cp.imagesMu.Unlock()
	for name, p := range cp.programs {
		w, ok := want[name]
		if !ok || p.runs(w.bin, w.args) {
			continue
		}
		if name == "kube-apiserver" {
			select {
			case cp.apiRestarts <- struct{}{}:
			default:
			}
		}
		cp.log.Info("restarting with the new machine config", "process", name, "binary", w.bin)
		p.set(w.bin, w.args)
	}
	return nil
}

// stop stops kube-apiserver and etcd and waits for them to exit.
func (cp *controlPlane) stop() {
	cp.halt()
	cp.wg.Wait()
}

// waitEtcd polls etcd's health endpoint until it answers or ctx ends.
func (cp *controlPlane) waitEtcd(ctx context.Context) error {
	for {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, cp.etcdURL+"/health", nil)
		if err != nil {
			return err
		}
		if resp, err := cp.etcd.Do(req); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// members lists etcd's members through its v3 JSON gateway.
func (cp *controlPlane) members(ctx context.Context) ([]*machine.EtcdMember, error) {
	var list struct{ Members []etcdMember }
	if err := etcdCall(ctx, cp.etcd, cp.etcdURL, "/v3/cluster/member/list", struct{}{}, &list); err != nil {
		return nil, err
	}
	out := make([]*machine.EtcdMember, 0, len(list.Members))
	for _, m := range list.Members {
		id, err := strconv.ParseUint(m.ID, 10, 64)
		if err != nil {
			return nil, fmt.Errorf("etcd member list: member ID %q: %w", m.ID, err)
		}
		out = append(out, &machine.EtcdMember{
			Id:         id,
			Hostname:   m.Name,
			PeerUrls:   m.PeerURLs,
			ClientUrls: m.ClientURLs,
			IsLearner:  m.IsLearner,
		})
	}
	return out, nil
}

func etcdArgs(c Config, hostname string, pki controlPlaneFiles, initialCluster string) []string {
	client := "https://" + c.hostPort(EtcdClientPort)
	peer := "https://" + c.hostPort(EtcdPeerPort)
	clusterState := "existing"
	if initialCluster == "" {
		initialCluster, clusterState = hostname+"="+peer, "new"
	}
	return []string{
		"--name=" + hostname,
		"--data-dir=" + filepath.Join(c.StateDir, EtcdDir),
		"--listen-client-urls=" + client,
		"--advertise-client-urls=" + client,
		"--listen-peer-urls=" + peer,
		"--initial-advertise-peer-urls=" + peer,
		"--initial-cluster=" + initialCluster,
		"--initial-cluster-state=" + clusterState,
		"--client-cert-auth=true",
		"--trusted-ca-file=" + pki.path("etcd-ca.crt"),
		"--cert-file=" + pki.path("etcd-server.crt"),
		"--key-file=" + pki.path("etcd-server.key"),
		"--peer-client-cert-auth=true",
		"--peer-trusted-ca-file=" + pki.path("etcd-ca.crt"),
		"--peer-cert-file=" + pki.path("etcd-peer.crt"),
		"--peer-key-file=" + pki.path("etcd-peer.key"),
	}
}

// bindAddress is kube-apiserver's: all addresses (the VIP among them), as
// on Talos, unless the node is on loopback beside others (tests).
func bindAddress(c Config) string {
	if c.Address.IsLoopback() {
		return c.Address.String()
	}
	return "0.0.0.0"
}

func apiServerArgs(c Config, mc config.Config, pki controlPlaneFiles) ([]string, error) {
	cl := mc.Cluster()
	port := cl.LocalAPIServerPort()
	if port == 0 {
		port = 6443
	}
	services := cl.Network().ServiceCIDRs()
	if len(services) == 0 {
		return nil, errors.New("the config has no cluster.network.serviceSubnets")
	}
	issuer := cl.Endpoint().String()
	args := []string{
		"--advertise-address=" + c.Address.String(),
		"--bind-address=" + bindAddress(c),
		"--secure-port=" + strconv.Itoa(port),
		"--etcd-servers=https://" + c.hostPort(EtcdClientPort),
		"--etcd-cafile=" + pki.path("etcd-ca.crt"),
		"--etcd-certfile=" + pki.path("apiserver-etcd-client.crt"),
		"--etcd-keyfile=" + pki.path("apiserver-etcd-client.key"),
		"--tls-cert-file=" + pki.path("apiserver.crt"),
		"--tls-private-key-file=" + pki.path("apiserver.key"),
		"--client-ca-file=" + pki.path("ca.crt"),
		"--kubelet-client-certificate=" + pki.path("apiserver-kubelet-client.crt"),
		"--kubelet-client-key=" + pki.path("apiserver-kubelet-client.key"),
		"--requestheader-client-ca-file=" + pki.path("aggregator-ca.crt"),
		"--proxy-client-cert-file=" + pki.path("front-proxy-client.crt"),
		"--proxy-client-key-file=" + pki.path("front-proxy-client.key"),
		"--requestheader-allowed-names=front-proxy-client",
		"--requestheader-extra-headers-prefix=X-Remote-Extra-",
		"--requestheader-group-headers=X-Remote-Group",
		"--requestheader-username-headers=X-Remote-User",
		"--service-account-issuer=" + issuer,
		"--service-account-key-file=" + pki.path("service-account.key"),
		"--service-account-signing-key-file=" + pki.path("service-account.key"),
		"--service-cluster-ip-range=" + strings.Join(services, ","),
		"--encryption-provider-config=" + pki.path("encryptionconfig.yaml"),
		"--authorization-mode=Node,RBAC",
		"--enable-admission-plugins=NodeRestriction",
		// Reach kubelets (logs, exec, port-forward) at their node
		// address, as Talos does: a node's name need not resolve.
		"--kubelet-preferred-address-types=InternalIP,ExternalIP,Hostname",
		"--api-audiences=" + issuer,
		"--enable-bootstrap-token-auth=true",
		"--allow-privileged=true",
		"--profiling=false",
		"--cert-dir=" + pki.dir,
	}
	if c.Address.IsLoopback() {
		// The endpoints of the kubernetes Service may not be loopback
		// addresses; only tests put a node on one.
		args = append(args, "--endpoint-reconciler-type=none")
	}
	return args, nil
}

// writePKI writes the certificates etcd and kube-apiserver run with,
// issued from the cluster's CAs in the machine config, and returns the
// client certificate the node itself talks to etcd with.
func writePKI(f controlPlaneFiles, c Config, mc config.Config, hostname string) (tls.Certificate, error) {
	cl := mc.Cluster()
	if err := os.MkdirAll(f.dir, 0o700); err != nil {
		return tls.Certificate{}, err
	}
	etcdCA := cl.Etcd().CA()
	if !canIssue(etcdCA) {
		return tls.Certificate{}, errors.New("the config has no cluster.etcd.ca with a key")
	}
	k8sCA := cl.IssuingCA()
	if !canIssue(k8sCA) {
		return tls.Certificate{}, errors.New("the config has no cluster.ca with a key")
	}
	aggCA := cl.AggregatorCA()
	if !canIssue(aggCA) {
		return tls.Certificate{}, errors.New("the config has no cluster.aggregatorCA with a key")
	}
	sa := cl.ServiceAccount()
	if sa == nil || len(sa.Key) == 0 {
		return tls.Certificate{}, errors.New("the config has no cluster.serviceAccount key")
	}

	server := stdx509.ExtKeyUsageServerAuth
	client := stdx509.ExtKeyUsageClientAuth
	etcdNames := sans{
		IPs:      []net.IP{c.Address.AsSlice(), net.IPv4(127, 0, 0, 1), net.IPv6loopback},
		DNSNames: []string{hostname, "localhost"},
	}
	apiNames, err := apiServerSANs(c, mc)
	if err != nil {
		return tls.Certificate{}, err
	}
	var etcdClient *x509.KeyPair
	for _, cert := range []struct {
		name   string
		ca     *x509.PEMEncodedCertificateAndKey
		cn     string
		org    []string
		names  sans
		usages []stdx509.ExtKeyUsage
		keep   **x509.KeyPair
	}{
		{"etcd-server", etcdCA, hostname, nil, etcdNames, []stdx509.ExtKeyUsage{server, client}, nil},
		{"etcd-peer", etcdCA, hostname, nil, etcdNames, []stdx509.ExtKeyUsage{server, client}, nil},
		{"apiserver-etcd-client", etcdCA, "kube-apiserver", nil, sans{}, []stdx509.ExtKeyUsage{client}, nil},
		{"talos-etcd-client", etcdCA, "talos", nil, sans{}, []stdx509.ExtKeyUsage{client}, &etcdClient},
		{"apiserver", k8sCA, "kube-apiserver", []string{"kube-master"}, apiNames, []stdx509.ExtKeyUsage{server}, nil},
		{"apiserver-kubelet-client", k8sCA, "apiserver-kubelet-client", []string{"system:masters"}, sans{}, []stdx509.ExtKeyUsage{client}, nil},
		{"front-proxy-client", aggCA, "front-proxy-client", nil, sans{}, []stdx509.ExtKeyUsage{client}, nil},
	} {
		kp, err := issue(cert.ca, cert.cn, cert.org, cert.names, cert.usages...)
		if err != nil {
			return tls.Certificate{}, fmt.Errorf("%s certificate: %w", cert.name, err)
		}
		if err := writeSecret(f.path(cert.name+".crt"), kp.CrtPEM); err != nil {
			return tls.Certificate{}, err
		}
		if err := writeSecret(f.path(cert.name+".key"), kp.KeyPEM); err != nil {
			return tls.Certificate{}, err
		}
		if cert.keep != nil {
			*cert.keep = kp
		}
	}
	clientCAs := bytes.Clone(k8sCA.Crt)
	for _, ca := range cl.AcceptedCAs() {
		clientCAs = append(clientCAs, ca.Crt...)
	}
	enc, err := encryptionConfig(cl)
	if err != nil {
		return tls.Certificate{}, err
	}
	for name, data := range map[string][]byte{
		"etcd-ca.crt":           etcdCA.Crt,
		"ca.crt":                clientCAs,
		"aggregator-ca.crt":     aggCA.Crt,
		"service-account.key":   sa.Key,
		"encryptionconfig.yaml": enc,
	} {
		if err := writeSecret(f.path(name), data); err != nil {
			return tls.Certificate{}, err
		}
	}
	return *etcdClient.Certificate, nil
}

// apiServerSANs: the control-plane endpoint's host, the node, the
// cluster's certSANs (the VIP among them), loopback and the in-cluster
// names, as Talos's API server certificate has them.
func apiServerSANs(c Config, mc config.Config) (sans, error) {
	cl := mc.Cluster()
	domain := cl.Network().DNSDomain()
	s := sans{
		IPs: []net.IP{c.Address.AsSlice(), net.IPv4(127, 0, 0, 1), net.IPv6loopback},
		DNSNames: []string{
			"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc",
			"kubernetes.default.svc." + domain,
		},
	}
	add := func(name string) {
		if ip, err := netip.ParseAddr(name); err == nil {
			s.IPs = append(s.IPs, ip.AsSlice())
		} else if name != "" {
			s.DNSNames = append(s.DNSNames, name)
		}
	}
	add(cl.Endpoint().Hostname())
	for _, n := range cl.CertSANs() {
		add(n)
	}
	ips, err := cl.Network().APIServerIPs()
	if err != nil {
		return sans{}, fmt.Errorf("kubernetes service IP: %w", err)
	}
	for _, ip := range ips {
		s.IPs = append(s.IPs, ip.AsSlice())
	}
	return s, nil
}

// encryptionConfig encrypts Secrets at rest with the config's key, as
// Talos configures kube-apiserver.
func encryptionConfig(cl config.ClusterConfig) ([]byte, error) {
	provider, secret := "secretbox", cl.SecretboxEncryptionSecret()
	if secret == "" {
		provider, secret = "aescbc", cl.AESCBCEncryptionSecret()
	}
	if secret == "" {
		return nil, errors.New("the config has no cluster.secretboxEncryptionSecret or aescbcEncryptionSecret")
	}
	if _, err := base64.StdEncoding.DecodeString(secret); err != nil {
		return nil, fmt.Errorf("the cluster encryption secret is not base64: %w", err)
	}
	return fmt.Appendf(nil, `apiVersion: apiserver.config.k8s.io/v1
kind: EncryptionConfiguration
resources:
  - resources:
      - secrets
    providers:
      - %s:
          keys:
            - name: key1
              secret: %s
      - identity: {}
`, provider, secret), nil
}

func writeSecret(path string, data []byte) error {
	return writeFileAtomic(path, data, 0o600)
}

// supervise runs a program until ctx ends, restarting it when it exits,
// as Talos's service runner restarts a failed service. Its output is
// appended to logPath.
func supervise(ctx context.Context, log *slog.Logger, spawn *spawner, name, bin string, args []string, logPath string) {
	superviseProgram(ctx, log, spawn, name, newProgram(bin, args), nil, logPath)
}

// superviseEnv is supervise with an environment for the program.
func superviseEnv(ctx context.Context, log *slog.Logger, spawn *spawner, name, bin string, args, env []string, logPath string) {
	superviseProgram(ctx, log, spawn, name, newProgram(bin, args), env, logPath)
}

// superviseProgram is supervise for a program whose binary and arguments
// may change while it runs (program.set): it is then stopped and started
// again at once with the new ones.
//
// A program that keeps failing waits longer before each restart (2 s,
// doubling up to 30 s, as kubelet's crash-loop back-off does), so a
// restart loop does not starve the rest of a small machine; one that ran
// for a minute starts over at 2 s.
func superviseProgram(ctx context.Context, log *slog.Logger, spawn *spawner, name string, p *program, env []string, logPath string) {
	wait := 2 * time.Second
	for {
		started := time.Now()
		// What it runs now is read below: a change signalled before
		// this start is in it already.
		select {
		case <-p.changed:
		default:
		}
		bin, args := p.start()
		err := runOnce(ctx, spawn, name, bin, args, env, logPath, p.changed)
		p.stopped()
		if ctx.Err() != nil {
			return
		}
		if errors.Is(err, errReplaced) {
			log.Info("process restarted with its new configuration", "process", name, "binary", bin)
			wait = 2 * time.Second
			continue
		}
		if time.Since(started) > time.Minute {
			wait = 2 * time.Second
		}
		// The log's last lines say why: on a lab VM the serial console,
		// where this goes, is all there is to read.
		log.Warn("process exited; restarting", "process", name, "err", err, "in", wait, "log", logPath, "tail", logTail(logPath, 3))
		select {
		case <-ctx.Done():
			return
		case <-p.changed:
			continue
		case <-time.After(wait):
		}
		wait = min(2*wait, 30*time.Second)
	}
}

// program is the binary and arguments a supervised program runs with.
type program struct {
	mu      sync.Mutex
	bin     string
	args    []string
	changed chan struct{} // signalled when set changes them
	gen     int           // counts the changes
	// running is the binary of the process that runs now ("" between
	// processes), started at generation runningGen: after set, the old
	// process runs until it has shut down.
	running    string
	runningGen int
}

// start is what to run now, recorded as running.
func (p *program) start() (string, []string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.running, p.runningGen = p.bin, p.gen
	return p.bin, p.args
}

// stopped records that no process runs.
func (p *program) stopped() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.running = ""
}

// generation counts the changes set made.
func (p *program) generation() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.gen
}

// current is the binary of the process that runs ("" if none), and
// whether that process runs the program's latest binary and arguments.
func (p *program) current() (string, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.running, p.running != "" && p.runningGen == p.gen
}

func newProgram(bin string, args []string) *program {
	return &program{bin: bin, args: args, changed: make(chan struct{}, 1)}
}

func (p *program) get() (string, []string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.bin, p.args
}

// runs reports whether the program runs with bin and args.
func (p *program) runs(bin string, args []string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return bin == p.bin && slices.Equal(args, p.args)
}

// set changes what the program runs and reports whether that changed
// anything; its supervisor then restarts it.
func (p *program) set(bin string, args []string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if bin == p.bin && slices.Equal(args, p.args) {
		return false
	}
	p.bin, p.args = bin, args
	p.gen++
	select {
	case p.changed <- struct{}{}:
	default:
	}
	return true
}

// errReplaced: the program was stopped to run with a new configuration.
var errReplaced = errors.New("replaced by a new configuration")

// stopTimeout is how long a child gets to exit after SIGTERM.
const stopTimeout = 10 * time.Second

// runOnce runs the program until it exits, ctx ends, or replace is
// signalled (errReplaced).
func runOnce(ctx context.Context, spawn *spawner, name, bin string, args, env []string, logPath string, replace <-chan struct{}) error {
	out, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	defer out.Close()
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = out, out
	// Only the environment given: etcd reads ETCD_* variables as flags,
	// and nothing from the caller's environment belongs on the node.
	cmd.Env = append([]string{}, env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := spawn.start(cmd); err != nil {
		return err
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	spawn.running(name, cmd.Process.Pid)
	defer spawn.running(name, 0)
	stopped := ctx.Err()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
	case <-replace:
		stopped = errReplaced
	}
	_ = cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-done:
	case <-time.After(stopTimeout):
		_ = cmd.Process.Kill()
		<-done
	}
	if stopped != nil {
		return stopped
	}
	return ctx.Err()
}

// spawner starts child processes from one OS thread that lives as long as
// the node: Linux sends a child its parent-death signal (Pdeathsig) when
// the thread that forked it exits, so forking from an arbitrary goroutine's
// thread could kill a child early, while this way children die exactly
// when the node's process (or its Run) ends.
type spawner struct {
	reqs chan spawnRequest
	done chan struct{}

	mu    sync.Mutex
	procs map[string]int // running programs by name: for the CPU report
}

// running records that the program name runs as pid (0: it stopped).
func (s *spawner) running(name string, pid int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.procs == nil {
		s.procs = map[string]int{}
	}
	if pid == 0 {
		delete(s.procs, name)
	} else {
		s.procs[name] = pid
	}
}

// cpu is the CPU time each running program has used.
func (s *spawner) cpu() map[string]time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := map[string]time.Duration{}
	for name, pid := range s.procs {
		if d, err := procstat.CPU(pid); err == nil {
			out[name] = d
		}
	}
	if d, err := procstat.CPU(os.Getpid()); err == nil {
		out["cozy-talos-node"] = d
	}
	return out
}

type spawnRequest struct {
	cmd *exec.Cmd
	res chan error
}

func newSpawner() *spawner {
	s := &spawner{reqs: make(chan spawnRequest), done: make(chan struct{})}
	started := make(chan struct{})
	go func() {
		// Never unlocked: when this goroutine returns, its thread exits.
		goruntime.LockOSThread()
		close(started)
		for {
			select {
			case r := <-s.reqs:
				r.res <- r.cmd.Start()
			case <-s.done:
				return
			}
		}
	}()
	<-started
	return s
}

func (s *spawner) start(cmd *exec.Cmd) error {
	r := spawnRequest{cmd, make(chan error, 1)}
	select {
	case s.reqs <- r:
		return <-r.res
	case <-s.done:
		return errors.New("the node is shutting down")
	}
}

func (s *spawner) close() { close(s.done) }

// controlPlaneComponents writes the files of the controller-manager and
// the scheduler (unless the config disables them) and returns them.
func controlPlaneComponents(c Config, mc config.Config, pki controlPlaneFiles) ([]component, error) {
	var comps []component
	if cp := mc.Machine().Controlplane(); cp == nil || !cp.ControllerManager().Disabled() {
		kcm, err := controllerManager(c, mc, pki)
		if err != nil {
			return nil, err
		}
		comps = append(comps, kcm)
	}
	if cp := mc.Machine().Controlplane(); cp == nil || !cp.Scheduler().Disabled() {
		ks, err := scheduler(c, mc, pki)
		if err != nil {
			return nil, err
		}
		comps = append(comps, ks)
	}
	for _, comp := range comps {
		for path, data := range comp.files {
			if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
				return nil, err
			}
			if err := writeSecret(path, data); err != nil {
				return nil, err
			}
		}
	}
	return comps, nil
}

// applyBootstrapManifests creates the bootstrap manifests, retrying
// until they are in, as Talos's manifest controller does on every control
// plane (creating only what is missing, so control planes do not fight).
func (cp *controlPlane) applyBootstrapManifests(ctx context.Context, mc config.Config) {
	rendered, err := renderManifests(mc)
	if err == nil {
		var objs []*unstructured.Unstructured
		if objs, err = manifestObjects(rendered); err == nil {
			err = retry(ctx, func() error {
				cfg, err := adminRESTConfig(mc, localAPIEndpoint(mc))
				if err != nil {
					return err
				}
				created, err := applyManifests(ctx, cfg, objs)
				if err == nil {
					cp.log.Info("bootstrap manifests applied", "objects", len(objs), "created", created)
				} else {
					cp.log.Info("bootstrap manifests: not yet, retrying", "err", err)
				}
				return err
			})
			if ctx.Err() != nil {
				return
			}
		}
	}
	if err != nil {
		cp.log.Error("bootstrap manifests cannot be applied", "err", err)
	}
}

// waitAPIReady polls the local API server's /readyz, as the node's own
// admin, on one connection, until it answers ok or ctx ends.
func waitAPIReady(ctx context.Context, mc config.Config) error {
	cfg, err := adminRESTConfig(mc, "https://"+net.JoinHostPort("localhost", strconv.Itoa(apiServerPort(mc))))
	if err != nil {
		return err
	}
	return pollReadyz(ctx, cfg, 2*time.Second)
}

// pollReadyz asks cfg's API server for /readyz, on one connection, every
// interval until it answers ok or ctx ends.
func pollReadyz(ctx context.Context, cfg *rest.Config, interval time.Duration) error {
	hc, err := rest.HTTPClientFor(cfg)
	if err != nil {
		return err
	}
	for {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, cfg.Host+"/readyz", nil)
		if err != nil {
			return err
		}
		if resp, err := hc.Do(req); err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		if !sleep(ctx, interval) {
			return ctx.Err()
		}
	}
}

// retry runs f until it succeeds or ctx ends, waiting 2 s after the first
// failure and twice as long after each next one, up to 30 s.
func retry(ctx context.Context, f func() error) error {
	wait := 2 * time.Second
	for {
		err := f()
		if err == nil || ctx.Err() != nil {
			return err
		}
		if !sleep(ctx, wait) {
			return ctx.Err()
		}
		wait = min(2*wait, 30*time.Second)
	}
}

// logTail is the last n lines of a log file, each cut to 300 bytes.
func logTail(path string, n int) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	off, err := tailOffset(f, n)
	if err != nil {
		return ""
	}
	data, _ := io.ReadAll(io.NewSectionReader(f, off, 1<<62))
	lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	for i, l := range lines {
		if len(l) > 300 {
			lines[i] = l[:300] + "…"
		}
	}
	return strings.Join(lines, "\n")
}
