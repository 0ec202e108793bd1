// Package talosnode is an emulated Talos Linux node: a process that serves
// Talos's machine API and COSI resource API over gRPC, with Talos's own
// generated servers, resource types and config validation, so that the
// real Talos client (talosctl's library) drives it as it drives a real
// machine.
//
// The node boots in maintenance mode (TLS with a throwaway certificate, no
// client authentication, ApplyConfiguration and read-only resources), and
// once a machine config is applied it "installs" it to its disk (a
// directory) and "reboots" into configured mode: mutual TLS with the
// config's OS CA. A control plane bootstrapped through the API runs a real
// etcd and a real kube-apiserver as child processes, certified by the
// cluster's CAs from the config, and hands out Talos-style admin
// kubeconfigs for them. docs/talos-node.md says what is emulated and what
// is real.
package talosnode

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"sync"
	"time"

	cosiv1alpha1 "github.com/cosi-project/runtime/api/v1alpha1"
	"github.com/cosi-project/runtime/pkg/state"
	cosiserver "github.com/cosi-project/runtime/pkg/state/protobuf/server"
	"github.com/siderolabs/talos/pkg/machinery/api/machine"
	"github.com/siderolabs/talos/pkg/machinery/api/security"
	"github.com/siderolabs/talos/pkg/machinery/config"
	"github.com/siderolabs/talos/pkg/machinery/resources/runtime"
	"github.com/siderolabs/talos/pkg/machinery/version"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
)

// Node is one emulated machine. Run it with Run.
type Node struct {
	cfg   Config
	log   *slog.Logger
	spawn *spawner

	mu sync.Mutex
	// Set for each boot:
	mode     mode
	machine  config.Provider // the running config; nil in maintenance
	hostname string
	state    state.State
	// cp runs etcd and kube-apiserver on a bootstrapped control plane.
	cp *controlPlane
	// version is the Talos version this boot reports (VersionFile).
	version string
	// kubelet is this boot's kubelet, once the node services started it.
	kubelet *program
	// etcdLeft: this control plane left etcd (EtcdLeaveCluster) in this
	// boot; its etcd service is finished until the next.
	etcdLeft bool
	// next is the power transition a request asked for; the node makes
	// it once the reply is out.
	next    chan transition
	pending bool
}

type mode int

const (
	maintenance mode = iota
	configured
)

func (m mode) String() string {
	if m == maintenance {
		return "maintenance"
	}
	return "configured"
}

// transition is what happens to the machine after a request.
type transition int

const (
	reboot         transition = iota // back up in the mode its disk says
	reset                            // disk wiped, back up in maintenance
	resetEphemeral                   // EPHEMERAL wiped, back up configured
	resetOff                         // disk wiped, powered off
	shutdown                         // powered off
)

// New checks cfg and returns a node that is not running yet.
func New(cfg Config) (*Node, error) {
	c, err := cfg.withDefaults()
	if err != nil {
		return nil, fmt.Errorf("talos node config: %w", err)
	}
	return &Node{cfg: c, log: c.Logger, next: make(chan transition, 1)}, nil
}

// Run boots the node and serves until ctx ends or the machine is shut
// down through the API (Shutdown, or Reset without reboot); both return
// nil. Reboots, installs and resets happen inside Run, unless the config
// says RebootExit: then Run returns ErrReboot for each. etcd and
// kube-apiserver are stopped before Run returns.
func (n *Node) Run(ctx context.Context) error {
	if err := os.MkdirAll(n.cfg.StateDir, 0o700); err != nil {
		return fmt.Errorf("state dir: %w", err)
	}
	if n.cfg.NodeServices {
		if err := n.prepareMachine(); err != nil {
			return err
		}
		defer n.killLeftovers()
	}
	n.spawn = newSpawner()
	defer n.spawn.close()
	defer n.stopControlPlane()
	if n.cfg.NodeServices {
		go n.reportCPU(ctx, time.Minute)
	}
	for {
		b, err := n.boot(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		var t transition
		select {
		case <-ctx.Done():
			b.stop()
			n.log.Info("node stopped")
			return nil
		case t = <-n.next:
		}
		b.stop()
		n.stopControlPlane()
		n.killLeftovers()
		n.mu.Lock()
		n.pending = false
		n.mu.Unlock()
		switch t {
		case shutdown:
			n.log.Info("machine powered off")
			return nil
		case reset, resetOff:
			// Only a node that bound the system directories (in a mount
			// namespace it owns: prepareMachine) unmounts below them.
			// Anywhere else these are the host's: unmounting below its
			// /run/netns would take every network namespace off the host.
			if n.cfg.NodeServices {
				if err := unmountBelow(systemDirs); err != nil {
					return fmt.Errorf("reset: %w", err)
				}
			}
			if err := wipe(n.cfg.StateDir); err != nil {
				return fmt.Errorf("reset: %w", err)
			}
			if err := emptyDirs(filepath.Join(n.cfg.StateDir, SystemDir)); err != nil {
				return fmt.Errorf("reset: %w", err)
			}
			n.log.Info("disk wiped")
			if t == resetOff {
				n.log.Info("machine powered off")
				return nil
			}
		case resetEphemeral:
			if err := n.wipeEphemeral(); err != nil {
				return fmt.Errorf("reset: %w", err)
			}
			n.log.Info("EPHEMERAL wiped: etcd data and the system directories")
		}
		if n.cfg.Reboot == RebootExit {
			n.log.Info("rebooting: the machine takes over")
			return ErrReboot
		}
		n.log.Info("rebooting", "delay", n.cfg.RebootDelay)
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(n.cfg.RebootDelay):
		}
	}
}

// booted is what one boot serves and runs.
type booted struct {
	servers []*grpc.Server
	// background work of this boot (joining etcd), stopped first.
	cancel context.CancelFunc
	work   sync.WaitGroup
}

// stop ends the boot's background work and closes the listeners.
// In-flight requests finish first (so the reply that asked for a reboot
// reaches its client), but open watches do not hold a reboot up for long.
func (b *booted) stop() {
	if b.cancel != nil {
		b.cancel()
	}
	b.work.Wait()
	var wg sync.WaitGroup
	for _, s := range b.servers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			done := make(chan struct{})
			go func() { s.GracefulStop(); close(done) }()
			select {
			case <-done:
			case <-time.After(time.Second):
				s.Stop()
				<-done
			}
		}()
	}
	wg.Wait()
}

// boot brings the machine up in the mode its disk says.
func (n *Node) boot(ctx context.Context) (*booted, error) {
	mc, err := readMachineConfig(n.cfg.StateDir)
	if err != nil {
		return nil, err
	}
	st := newState()
	hostname, m, ver := n.cfg.Hostname, maintenance, version.Tag
	if mc != nil {
		hostname, m, ver = hostnameOf(mc, n.cfg.Hostname), configured, n.diskVersion()
	}
	if err := seed(ctx, st, bootResources(n.cfg, hostname, "", ver)...); err != nil {
		return nil, err
	}
	n.mu.Lock()
	n.mode, n.machine, n.hostname, n.state, n.version = m, mc, hostname, st, ver
	n.etcdLeft = false
	n.mu.Unlock()
	if n.cfg.NodeServices {
		// The machine's hostname, as Talos sets it: its kubelet,
		// controller-manager and scheduler name themselves after it.
		// (prepareMachine made sure the node owns it.)
		if err := unix.Sethostname([]byte(hostname)); err != nil {
			n.log.Warn("set the hostname", "hostname", hostname, "err", err)
		}
	}

	if m == maintenance {
		return n.bootMaintenance(ctx, st, hostname)
	}
	return n.bootConfigured(ctx, st, mc, hostname)
}

func (n *Node) bootMaintenance(ctx context.Context, st state.State, hostname string) (*booted, error) {
	if err := put(ctx, st, machineStatus(runtime.MachineStageMaintenance, true)); err != nil {
		return nil, err
	}
	tlsConfig, err := maintenanceTLS(apiSANs(n.cfg.Address, hostname, nil))
	if err != nil {
		return nil, err
	}
	srv := n.grpcServer(credentials.NewTLS(tlsConfig), maintenance)
	machine.RegisterMachineServiceServer(srv, &maintenanceServer{node: n})
	cosiv1alpha1.RegisterStateServer(srv, cosiserver.NewState(state.Filter(st, readOnly)))
	if err := n.serve(srv, n.cfg.Port); err != nil {
		return nil, err
	}
	n.log.Info("maintenance mode: waiting for a machine config", "address", n.cfg.hostPort(n.cfg.Port), "hostname", hostname)
	return &booted{servers: []*grpc.Server{srv}}, nil
}

func (n *Node) bootConfigured(ctx context.Context, st state.State, mc config.Provider, hostname string) (*booted, error) {
	if err := put(ctx, st, machineStatus(runtime.MachineStageBooting, false)); err != nil {
		return nil, err
	}
	sec := mc.Machine().Security()
	clientCAs, err := osCAPool(sec)
	if err != nil {
		return nil, err
	}
	names := apiSANs(n.cfg.Address, hostname, sec.CertSANs())
	controlPlane := mc.Machine().Type().IsControlPlane()
	b := &booted{}

	var cert, trustdCert *tls.Certificate
	if canIssue(sec.IssuingCA()) {
		kp, err := issue(sec.IssuingCA(), hostname, nil, names)
		if err != nil {
			return nil, fmt.Errorf("API certificate: %w", err)
		}
		cert, trustdCert = kp.Certificate, kp.Certificate
	} else {
		// A worker holds no OS CA key: like Talos, it asks a control
		// plane's trustd for its API certificate and serves nothing until
		// it has one.
		n.log.Info("requesting the API certificate from trustd", "endpoint", mc.Cluster().Endpoint().Hostname())
		cert, err = requestCertificate(ctx, mc, names, n.log)
		if err != nil {
			return nil, err
		}
	}

	srv := n.grpcServer(credentials.NewTLS(configuredTLS(*cert, clientCAs)), configured)
	machine.RegisterMachineServiceServer(srv, &configuredServer{node: n})
	cosiv1alpha1.RegisterStateServer(srv, cosiserver.NewState(state.Filter(st, readOnly)))
	if err := n.serve(srv, n.cfg.Port); err != nil {
		return nil, err
	}
	b.servers = append(b.servers, srv)

	if controlPlane && trustdCert != nil {
		td := grpc.NewServer(grpc.Creds(credentials.NewTLS(trustdTLS(*trustdCert))),
			grpc.ChainUnaryInterceptor(recoverUnary(n.log)))
		security.RegisterSecurityServiceServer(td, &trustd{ca: sec.IssuingCA(), token: sec.Token(), log: n.log})
		if err := n.serve(td, TrustdPort); err != nil {
			b.stop()
			return nil, err
		}
		b.servers = append(b.servers, td)
	}

	// Background work of this boot; Run's context outlives reboots, so
	// the boot has its own.
	work, cancel := context.WithCancel(context.Background())
	b.cancel = cancel
	switch {
	case controlPlane && n.bootstrapped():
		if err := n.startControlPlane(mc, hostname); err != nil {
			b.stop()
			return nil, err
		}
	case controlPlane && trustdCert != nil:
		// Every control plane but the one bootstrapped joins etcd by
		// itself.
		b.work.Go(func() { n.joinEtcd(work, mc, hostname) })
	}
	if controlPlane {
		b.work.Go(func() { n.reportStaticPods(work, st, hostname) })
	}
	if vip, ok := layer2VIP(mc); ok && controlPlane {
		b.work.Go(func() { n.runVIP(work, vip, hostname) })
	}
	if n.cfg.NodeServices {
		// In the background: containerd takes a while to answer on a
		// slow machine, and the API serves meanwhile. A node service that
		// cannot start leaves the machine API up, as on Talos, to be
		// looked at and fixed.
		b.work.Go(func() {
			if err := n.startNodeServices(work, &b.work, mc, hostname); err != nil {
				n.log.Error("node services failed to start", "err", err)
			}
		})
	}
	if err := put(ctx, st, machineConfigResource(mc)); err != nil {
		b.stop()
		return nil, err
	}
	if err := put(ctx, st, machineStatus(runtime.MachineStageRunning, true)); err != nil {
		b.stop()
		return nil, err
	}
	n.log.Info("configured mode", "address", n.cfg.hostPort(n.cfg.Port), "hostname", hostname, "type", mc.Machine().Type().String())
	return b, nil
}

// serve listens on the node address and serves srv until it is stopped.
func (n *Node) serve(srv *grpc.Server, port int) error {
	lis, err := net.Listen("tcp", n.cfg.listenAddr(port))
	if err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	go func() {
		if err := srv.Serve(lis); err != nil {
			n.log.Warn("gRPC server stopped", "err", err)
		}
	}()
	return nil
}

// bootstrapped reports whether this control plane's etcd was bootstrapped:
// the marker, or etcd data, is on its disk.
func (n *Node) bootstrapped() bool {
	if _, err := os.Stat(filepath.Join(n.cfg.StateDir, BootstrappedFile)); err == nil {
		return true
	}
	entries, _ := os.ReadDir(filepath.Join(n.cfg.StateDir, EtcdDir))
	return len(entries) > 0
}

func (n *Node) startControlPlane(mc config.Config, hostname string) error {
	cp, err := startControlPlane(n.cfg, mc, hostname, n.spawn, "")
	if err != nil {
		return err
	}
	n.mu.Lock()
	n.cp = cp
	n.mu.Unlock()
	n.log.Info("etcd and kube-apiserver started", "logs", filepath.Join(n.cfg.StateDir, LogDir))
	return nil
}

func (n *Node) stopControlPlane() {
	n.mu.Lock()
	cp := n.cp
	n.cp = nil
	n.mu.Unlock()
	if cp != nil {
		cp.stop()
		n.log.Info("etcd and kube-apiserver stopped")
	}
}

// wipe empties the node's disk, keeping the logs of what ran on it. The
// system directories are emptied in place: they stay bound over Talos's
// paths.
func wipe(dir string) error {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	for _, e := range entries {
		if e.Name() == LogDir || e.Name() == SystemDir {
			continue
		}
		if err := os.RemoveAll(filepath.Join(dir, e.Name())); err != nil {
			return err
		}
	}
	return nil
}

// wipeEphemeral empties what Talos keeps on EPHEMERAL (/var): etcd's data
// and the node's system directories; the config (STATE) stays.
func (n *Node) wipeEphemeral() error {
	if n.cfg.NodeServices {
		if err := unmountBelow(systemDirs); err != nil {
			return err
		}
	}
	for _, name := range []string{EtcdDir, BootstrappedFile, RecoverySnapshotFile} {
		if err := os.RemoveAll(filepath.Join(n.cfg.StateDir, name)); err != nil {
			return err
		}
	}
	return emptyDirs(filepath.Join(n.cfg.StateDir, SystemDir))
}

// emptyDirs removes everything below each directory of the tree at root
// that is one of systemDirs' sources, keeping the directories.
func emptyDirs(root string) error {
	for _, d := range systemDirs {
		entries, err := os.ReadDir(filepath.Join(root, d))
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return err
		}
		for _, e := range entries {
			if isSystemDir(filepath.Join(d, e.Name())) {
				continue // a bind of its own, emptied in its turn
			}
			if err := os.RemoveAll(filepath.Join(root, d, e.Name())); err != nil {
				return err
			}
		}
	}
	return nil
}

func isSystemDir(p string) bool {
	for _, d := range systemDirs {
		if d == p {
			return true
		}
	}
	return false
}
