package talosnode

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/cosi-project/runtime/pkg/state"
	"github.com/siderolabs/talos/pkg/machinery/config"
	"github.com/siderolabs/talos/pkg/machinery/config/configloader"
	"github.com/siderolabs/talos/pkg/machinery/config/validation"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"cozy.dev/cozy/internal/atomicfile"
)

// Files on the node's disk (Config.StateDir).
const (
	// ConfigFile is the applied machine config, as the client sent it.
	ConfigFile = "config.yaml"
	// BootstrappedFile marks a control plane whose etcd was bootstrapped.
	BootstrappedFile = "bootstrapped"
	// EtcdDir is etcd's data directory.
	EtcdDir = "etcd"
	// PKIDir holds the certificates etcd and kube-apiserver run with,
	// issued again on every boot.
	PKIDir = "pki"
	// LogDir holds etcd.log and kube-apiserver.log.
	LogDir = "logs"
)

// metal is the runtime mode Talos runs in on bare metal: it installs to
// disk and does not run in a container.
type metal struct{}

func (metal) String() string        { return "metal" }
func (metal) RequiresInstall() bool { return true }
func (metal) InContainer() bool     { return false }

// loadMachineConfig parses and validates a machine config the way Talos
// does before accepting it, strictly: warnings are errors. Validation
// runs against st, the node's resources, so an install disk selector that
// matches none of the node's disks is refused. Errors are gRPC statuses
// with Talos's wording.
func loadMachineConfig(ctx context.Context, data []byte, st state.State) (cfg config.Provider, warnings []string, err error) {
	defer func() {
		// The loader is fuzzed upstream; a client's bytes must still never
		// take the node down.
		if r := recover(); r != nil {
			cfg, warnings, err = nil, nil, status.Errorf(codes.InvalidArgument, "failed to parse config: %v", r)
		}
	}()
	cfg, err = configloader.NewFromBytes(data)
	if err != nil {
		return nil, nil, status.Errorf(codes.InvalidArgument, "failed to parse config: %s", err)
	}
	if cfg.RawV1Alpha1() == nil {
		return nil, nil, status.Error(codes.InvalidArgument, "configuration validation failed: the config has no v1alpha1 document (machine and cluster sections)")
	}
	opts := []validation.Option{validation.WithStrict()}
	warnings, err = cfg.Validate(metal{}, opts...)
	if err != nil {
		return nil, nil, status.Errorf(codes.InvalidArgument, "configuration validation failed: %s", err)
	}
	runtimeWarnings, err := cfg.RuntimeValidate(ctx, st, metal{}, opts...)
	if err != nil {
		return nil, nil, status.Errorf(codes.InvalidArgument, "runtime configuration validation failed: %s", err)
	}
	return cfg, append(warnings, runtimeWarnings...), nil
}

// readMachineConfig loads the config on the node's disk; nil without error
// when there is none (the machine was never configured, or was reset).
func readMachineConfig(dir string) (config.Provider, error) {
	data, err := os.ReadFile(filepath.Join(dir, ConfigFile))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	cfg, err := configloader.NewFromBytes(data)
	if err != nil {
		return nil, fmt.Errorf("the machine config on disk (%s) does not load: %w; reset the node by removing it", filepath.Join(dir, ConfigFile), err)
	}
	if v := cfg.RawV1Alpha1(); v == nil || v.MachineConfig == nil || v.ClusterConfig == nil {
		return nil, fmt.Errorf("the machine config on disk (%s) has no machine and cluster sections", filepath.Join(dir, ConfigFile))
	}
	return cfg, nil
}

// writeFileAtomic replaces path with data (see atomicfile), creating its
// directory first.
func writeFileAtomic(path string, data []byte, perm os.FileMode) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return err
	}
	return atomicfile.Write(path, data, perm)
}

// hostnameOf is the hostname a config gives the machine, or fallback.
func hostnameOf(cfg config.Config, fallback string) string {
	if hc := cfg.NetworkHostnameConfig(); hc != nil && hc.Hostname() != "" {
		return hc.Hostname()
	}
	return fallback
}
