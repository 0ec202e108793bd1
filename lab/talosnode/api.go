package talosnode

import (
	"context"
	"crypto/rand"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/cosi-project/runtime/pkg/state"
	"github.com/siderolabs/talos/pkg/machinery/api/common"
	"github.com/siderolabs/talos/pkg/machinery/api/machine"
	"github.com/siderolabs/talos/pkg/machinery/config"
	"github.com/siderolabs/talos/pkg/machinery/constants"
	"github.com/siderolabs/talos/pkg/machinery/resources/network"
	"github.com/siderolabs/talos/pkg/machinery/resources/runtime"
	"github.com/siderolabs/talos/pkg/machinery/version"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/emptypb"
)

// maintenanceServer is the machine API of a machine without a config, as
// Talos's maintenance service serves it: every caller is a reader, so
// only ApplyConfiguration (allowed to readers in maintenance) does
// anything; the admin-only methods answer as Talos does, and the rest are
// not implemented.
type maintenanceServer struct {
	machine.UnimplementedMachineServiceServer
	node *Node
}

var errMaintenance = status.Error(codes.Unimplemented, "API is not implemented in maintenance mode")

// Version needs the admin role, which maintenance mode grants only to
// SideroLink peers; the version is readable as the runtime.Version
// resource instead.
func (s *maintenanceServer) Version(context.Context, *emptypb.Empty) (*machine.VersionResponse, error) {
	return nil, errMaintenance
}

func (s *maintenanceServer) Reset(context.Context, *machine.ResetRequest) (*machine.ResetResponse, error) {
	return nil, errMaintenance
}

func (s *maintenanceServer) Upgrade(context.Context, *machine.UpgradeRequest) (*machine.UpgradeResponse, error) {
	return nil, errMaintenance
}

func (s *maintenanceServer) GenerateClientConfiguration(context.Context, *machine.GenerateClientConfigurationRequest) (*machine.GenerateClientConfigurationResponse, error) {
	return nil, status.Error(codes.Unimplemented, "client configuration (talosconfig) can't be generated in the maintenance mode")
}

// ApplyConfiguration validates the config, writes it to the node's disk
// and reboots the node into it: the emulated install.
func (s *maintenanceServer) ApplyConfiguration(ctx context.Context, req *machine.ApplyConfigurationRequest) (*machine.ApplyConfigurationResponse, error) {
	switch req.GetMode() {
	case machine.ApplyConfigurationRequest_REBOOT, machine.ApplyConfigurationRequest_AUTO, machine.ApplyConfigurationRequest_TRY:
	default:
		return nil, status.Errorf(codes.Unimplemented, "apply configuration --mode='%s' is not supported in maintenance mode",
			strings.ReplaceAll(strings.ToLower(req.GetMode().String()), "_", "-"))
	}
	n := s.node
	st := n.currentState()
	mc, warnings, err := loadMachineConfig(ctx, req.GetData(), st)
	if err != nil {
		n.log.Info("machine config refused; the client has the reason", "code", status.Code(err).String()) // the reason may quote the config
		return nil, err
	}
	reply := &machine.ApplyConfigurationResponse{Messages: []*machine.ApplyConfiguration{{Warnings: warnings}}}
	if req.GetDryRun() {
		reply.Messages[0].ModeDetails = "Dry run summary:\nNode is running in maintenance mode and does not have a config yet."
		return reply, nil
	}
	err = n.transition(reboot, func() error {
		if err := writeFileAtomic(filepath.Join(n.cfg.StateDir, ConfigFile), req.GetData(), 0o600); err != nil {
			return status.Errorf(codes.Internal, "write the machine config to disk: %s", err)
		}
		// The install puts its image's version on the disk.
		if err := writeFileAtomic(filepath.Join(n.cfg.StateDir, VersionFile), []byte(installedVersion(mc)+"\n"), 0o600); err != nil {
			return status.Errorf(codes.Internal, "write the installed version to disk: %s", err)
		}
		return put(ctx, st, machineStatus(runtime.MachineStageInstalling, false))
	})
	if err != nil {
		return nil, err
	}
	n.log.Info("machine config applied; installing and rebooting", "delay", n.cfg.RebootDelay)
	return reply, nil
}

// configuredServer is the machine API of a configured machine: what
// machined serves behind apid, for the methods the lab needs.
type configuredServer struct {
	machine.UnimplementedMachineServiceServer
	node *Node
}

// Version reports the version on the node's disk as of this boot (the
// emulation's own build information otherwise).
func (s *configuredServer) Version(context.Context, *emptypb.Empty) (*machine.VersionResponse, error) {
	v := version.NewVersion()
	s.node.mu.Lock()
	v.Tag = s.node.version
	s.node.mu.Unlock()
	return &machine.VersionResponse{Messages: []*machine.Version{{
		Version:  v,
		Platform: &machine.PlatformInfo{Name: "metal", Mode: metal{}.String()},
		Features: &machine.FeaturesInfo{Rbac: true}, // always on since Talos 1.6
	}}}, nil
}

func (s *configuredServer) Hostname(context.Context, *emptypb.Empty) (*machine.HostnameResponse, error) {
	s.node.mu.Lock()
	defer s.node.mu.Unlock()
	return &machine.HostnameResponse{Messages: []*machine.Hostname{{Hostname: s.node.hostname}}}, nil
}

// ApplyConfiguration replaces the config on disk. REBOOT reboots into it;
// AUTO and NO_REBOOT apply it at once, as far as the emulation goes (the
// config read at the next boot, and the hostname); STAGED leaves the
// running config alone until the next reboot.
func (s *configuredServer) ApplyConfiguration(ctx context.Context, req *machine.ApplyConfigurationRequest) (*machine.ApplyConfigurationResponse, error) {
	n := s.node
	if req.GetMode() == machine.ApplyConfigurationRequest_TRY {
		return nil, status.Error(codes.Unimplemented, "apply configuration --mode=try is not supported by the emulated node")
	}
	mc, warnings, err := loadMachineConfig(ctx, req.GetData(), n.currentState())
	if err != nil {
		n.log.Info("machine config refused; the client has the reason", "code", status.Code(err).String()) // the reason may quote the config
		return nil, err
	}
	msg := &machine.ApplyConfiguration{Warnings: warnings, Mode: req.GetMode()}
	reply := &machine.ApplyConfigurationResponse{Messages: []*machine.ApplyConfiguration{msg}}
	if req.GetDryRun() {
		msg.ModeDetails = "Dry run summary:\nThe config is valid; nothing was applied."
		return reply, nil
	}
	write := func() error {
		if err := writeFileAtomic(filepath.Join(n.cfg.StateDir, ConfigFile), req.GetData(), 0o600); err != nil {
			return status.Errorf(codes.Internal, "write the machine config to disk: %s", err)
		}
		return nil
	}
	switch req.GetMode() {
	case machine.ApplyConfigurationRequest_REBOOT:
		if err := n.transition(reboot, write); err != nil {
			return nil, err
		}
		msg.ModeDetails = "Applied configuration with a reboot"
	case machine.ApplyConfigurationRequest_STAGED:
		if err := write(); err != nil {
			return nil, err
		}
		msg.ModeDetails = "Staged configuration to be applied after a reboot"
	default: // AUTO, NO_REBOOT
		if err := write(); err != nil {
			return nil, err
		}
		n.applyNow(ctx, mc)
		msg.Mode = machine.ApplyConfigurationRequest_NO_REBOOT
		msg.ModeDetails = "Applied configuration without a reboot"
	}
	n.log.Info("machine config applied", "mode", req.GetMode().String())
	return reply, nil
}

// Bootstrap starts etcd as a new cluster, then kube-apiserver: once, on a
// control plane whose disk holds no etcd data. With RecoverEtcd the new
// cluster's data is the snapshot EtcdRecover uploaded (Talos's disaster
// recovery); the other control planes then join it as after a bootstrap.
func (s *configuredServer) Bootstrap(ctx context.Context, req *machine.BootstrapRequest) (*machine.BootstrapResponse, error) {
	n := s.node
	mc := n.runningConfig()
	if !mc.Machine().Type().IsControlPlane() {
		return nil, status.Error(codes.FailedPrecondition, "bootstrap can only be performed on a control plane node")
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.pending {
		return nil, status.Error(codes.Unavailable, "the node is rebooting")
	}
	if n.bootstrapped() || n.cp != nil {
		return nil, status.Error(codes.AlreadyExists, "etcd data directory is not empty")
	}
	if req.GetRecoverEtcd() {
		if _, err := n.recoverySnapshot(); err != nil {
			return nil, err
		}
	}
	for _, bin := range []string{n.cfg.Bin.Etcd, n.cfg.Bin.APIServer} {
		if _, err := exec.LookPath(bin); err != nil {
			return nil, status.Errorf(codes.FailedPrecondition, "the emulated node cannot run %s: %s (set --etcd and --kube-apiserver)", bin, err)
		}
	}
	if req.GetRecoverEtcd() {
		if err := n.restoreSnapshot(n.hostname, req.GetRecoverSkipHashCheck()); err != nil {
			return nil, err
		}
	}
	if err := writeFileAtomic(filepath.Join(n.cfg.StateDir, BootstrappedFile), nil, 0o600); err != nil {
		return nil, status.Errorf(codes.Internal, "write the bootstrap marker: %s", err)
	}
	cp, err := startControlPlane(n.cfg, mc, n.hostname, n.spawn, "")
	if err != nil {
		_ = os.Remove(filepath.Join(n.cfg.StateDir, BootstrappedFile))
		return nil, status.Errorf(codes.Internal, "start etcd and kube-apiserver: %s", err)
	}
	n.cp = cp
	how := "bootstrap"
	if req.GetRecoverEtcd() {
		how = "bootstrap from a snapshot"
	}
	n.log.Info(how+": etcd and kube-apiserver started", "logs", filepath.Join(n.cfg.StateDir, LogDir))
	return &machine.BootstrapResponse{Messages: []*machine.Bootstrap{{}}}, nil
}

// Kubeconfig streams a fresh admin kubeconfig for the cluster, as a
// gzipped tar, on control planes (before bootstrap too, as Talos does).
func (s *configuredServer) Kubeconfig(_ *emptypb.Empty, stream grpc.ServerStreamingServer[common.Data]) error {
	mc := s.node.runningConfig()
	if !mc.Machine().Type().IsControlPlane() {
		return status.Error(codes.Unimplemented, "kubeconfig is only available on control plane nodes")
	}
	kc, err := adminKubeconfig(mc.Cluster())
	if err != nil {
		return status.Errorf(codes.Internal, "kubeconfig: %s", err)
	}
	data, err := tarGz(kc)
	if err != nil {
		return status.Errorf(codes.Internal, "kubeconfig: %s", err)
	}
	return stream.Send(&common.Data{Bytes: data})
}

// EtcdMemberList lists the members of the node's etcd.
func (s *configuredServer) EtcdMemberList(ctx context.Context, _ *machine.EtcdMemberListRequest) (*machine.EtcdMemberListResponse, error) {
	n := s.node
	if !n.runningConfig().Machine().Type().IsControlPlane() {
		return nil, status.Error(codes.Unimplemented, "member list is only available on control plane nodes")
	}
	n.mu.Lock()
	cp := n.cp
	n.mu.Unlock()
	if cp == nil {
		return nil, status.Error(codes.Unavailable, "etcd is not running: the cluster has not been bootstrapped on this node")
	}
	members, err := cp.members(ctx)
	if err != nil {
		return nil, status.Errorf(codes.Unavailable, "etcd: %s", err)
	}
	names := make([]string, len(members))
	for i, m := range members {
		names[i] = m.GetHostname()
	}
	return &machine.EtcdMemberListResponse{Messages: []*machine.EtcdMembers{{Members: members, LegacyMembers: names}}}, nil
}

func (s *configuredServer) Reboot(ctx context.Context, _ *machine.RebootRequest) (*machine.RebootResponse, error) {
	id, err := s.node.powerTransition(ctx, reboot, runtime.MachineStageRebooting)
	if err != nil {
		return nil, err
	}
	return &machine.RebootResponse{Messages: []*machine.Reboot{{ActorId: id}}}, nil
}

func (s *configuredServer) Shutdown(ctx context.Context, _ *machine.ShutdownRequest) (*machine.ShutdownResponse, error) {
	id, err := s.node.powerTransition(ctx, shutdown, runtime.MachineStageShuttingDown)
	if err != nil {
		return nil, err
	}
	return &machine.ShutdownResponse{Messages: []*machine.Shutdown{{ActorId: id}}}, nil
}

// Reset wipes the node's disk (config, etcd data, bootstrap marker) and
// reboots it into maintenance mode, or powers it off without Reboot.
// Naming only the EPHEMERAL partition wipes what the node runs with (etcd
// data, the bootstrap marker, the system directories) and keeps STATE,
// its config: it reboots configured, with etcd waiting for a bootstrap or
// a cluster to join, the state Talos's disaster recovery starts from.
// A graceful reset of a control plane leaves etcd first.
func (s *configuredServer) Reset(ctx context.Context, req *machine.ResetRequest) (*machine.ResetResponse, error) {
	t := resetOff
	if req.GetReboot() {
		t = reset
	}
	if parts := req.GetSystemPartitionsToWipe(); len(parts) > 0 {
		if req.GetMode() == machine.ResetRequest_USER_DISKS {
			return nil, status.Error(codes.InvalidArgument, "reset failed: invalid input, wipe mode USER_DISKS doesn't support SystemPartitionsToWipe parameter")
		}
		wipeState := false
		for _, p := range parts {
			switch p.GetLabel() {
			case constants.EphemeralPartitionLabel:
			case constants.StatePartitionLabel:
				wipeState = wipeState || p.GetWipe()
			default:
				return nil, status.Errorf(codes.NotFound, "failed to get volume status with label %q: the emulated node has the STATE and EPHEMERAL volumes", p.GetLabel())
			}
		}
		if !wipeState {
			if !req.GetReboot() {
				return nil, status.Error(codes.Unimplemented, "the emulated node wipes EPHEMERAL alone only with a reboot")
			}
			t = resetEphemeral
		}
	}
	if req.GetGraceful() && t != resetEphemeral {
		// Talos's graceful reset leaves etcd before it wipes, so the
		// others keep a cluster without this member. (Talos does it after
		// its reply and logs a failure; here the caller gets it.) The
		// cordon and drain of Talos's graceful reset are not emulated.
		if err := s.node.leaveIfMember(ctx); err != nil {
			return nil, err
		}
	}
	id, err := s.node.powerTransition(ctx, t, runtime.MachineStageResetting)
	if err != nil {
		return nil, err
	}
	return &machine.ResetResponse{Messages: []*machine.Reset{{ActorId: id}}}, nil
}

// powerTransition queues t for after the reply and returns the actor ID
// Talos hands out for the sequence.
func (n *Node) powerTransition(ctx context.Context, t transition, stage runtime.MachineStage) (string, error) {
	st := n.currentState()
	err := n.transition(t, func() error {
		return put(ctx, st, machineStatus(stage, false))
	})
	if err != nil {
		return "", err
	}
	n.log.Info("power transition requested", "stage", stage.String())
	return actorID(), nil
}

// transition runs prepare and, if it succeeds, makes the node go through
// t once the current request is answered. Only one transition at a time.
func (n *Node) transition(t transition, prepare func() error) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.pending {
		return status.Error(codes.Unavailable, "the node is already rebooting")
	}
	if err := prepare(); err != nil {
		return err
	}
	n.pending = true
	n.next <- t
	return nil
}

// applyNow makes a config applied without a reboot the running one.
func (n *Node) applyNow(ctx context.Context, mc config.Provider) {
	n.mu.Lock()
	n.machine = mc
	n.hostname = hostnameOf(mc, n.cfg.Hostname)
	st, hostname := n.state, n.hostname
	n.mu.Unlock()
	hs := network.NewHostnameStatus(network.NamespaceName, network.HostnameID)
	hs.TypedSpec().Hostname = hostname
	if err := put(ctx, st, hs); err != nil {
		n.log.Warn("update hostname status", "err", err)
	}
	if err := put(ctx, st, machineConfigResource(mc)); err != nil {
		n.log.Warn("update the machine config resource", "err", err)
	}
	n.mu.Lock()
	cp := n.cp
	n.mu.Unlock()
	if cp != nil {
		if err := cp.reconfigure(n.cfg, mc); err != nil {
			n.log.Error("the control plane cannot run the applied config", "err", err)
		}
		if err := cp.staticPodsRestarting(ctx, st, hostname); err != nil {
			n.log.Warn("static pod status", "err", err)
		}
	}
	if err := n.reconfigureKubelet(mc, hostname); err != nil {
		n.log.Error("the kubelet cannot run the applied config", "err", err)
	}
}

func (n *Node) runningConfig() config.Provider {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.machine
}

func (n *Node) currentState() state.State {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.state
}

func actorID() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:])
}

// ServiceList lists the system services the emulation stands for, with
// Talos's service states: apid always, and on a control plane trustd
// and etcd, which is Running once bootstrapped or joined, Preparing
// while it waits for either (the state Talos's disaster recovery starts
// from), and Finished once it left the cluster. The node's kubelet and
// containerd are not listed.
func (s *configuredServer) ServiceList(context.Context, *emptypb.Empty) (*machine.ServiceListResponse, error) {
	n := s.node
	running := func(id string) *machine.ServiceInfo {
		return &machine.ServiceInfo{Id: id, State: "Running", Health: &machine.ServiceHealth{Healthy: true}}
	}
	services := []*machine.ServiceInfo{running("apid")}
	if n.runningConfig().Machine().Type().IsControlPlane() {
		n.mu.Lock()
		up, left := n.cp != nil, n.etcdLeft
		n.mu.Unlock()
		etcd := running("etcd")
		switch {
		case left:
			etcd = &machine.ServiceInfo{Id: "etcd", State: "Finished", Health: &machine.ServiceHealth{Unknown: true}}
		case !up:
			etcd = &machine.ServiceInfo{Id: "etcd", State: "Preparing", Health: &machine.ServiceHealth{Unknown: true}}
		}
		services = append(services, etcd, running("trustd"))
	}
	return &machine.ServiceListResponse{Messages: []*machine.ServiceList{{Services: services}}}, nil
}
