package bootstrap

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"

	"k8s.io/client-go/tools/clientcmd"

	"cozy.dev/cozy/bootstrap/netboot"
	"cozy.dev/cozy/platform"
	"cozy.dev/cozy/pxe"
	"cozy.dev/cozy/pxe/inventory"
)

// UpOptions are a whole bring-up: the netboot server for the rack (unless
// another one boots it), the bootstrap, then the platform.
type UpOptions struct {
	// Options are the bootstrap's; Up sets Inventory.
	Options
	// Boot is what the netboot server Up runs serves (kernel, initramfs,
	// command line, arm64 files), and where (HTTP port, server address,
	// AllowUnknown); the rack decides the rest (netboot.Config). Its
	// state dir is StateDir/pxe.
	Boot pxe.Config
	// InventoryDir, if set, is the state dir of another netboot server,
	// which boots the rack: Up runs none.
	InventoryDir string
	// Platform installs Flux for the rack's platform.git, its Git settings
	// taken from the rack; nil skips the platform.
	Platform *platform.InstallOptions
}

// PlatformResult says what became of the platform step.
type PlatformResult string

const (
	PlatformInstalled PlatformResult = "installed"
	PlatformSkipped   PlatformResult = "skipped" // UpOptions.Platform was nil
	PlatformNoGit     PlatformResult = "no-git"  // the rack has no platform.git.url
)

// UpResult is what a finished bring-up produced.
type UpResult struct {
	*Result
	Platform PlatformResult
}

// PlatformError is a failed platform install on a cluster that is up.
type PlatformError struct {
	Kubeconfig string
	Err        error
}

func (e *PlatformError) Error() string {
	return "the cluster is up, but installing the platform failed: " + e.Err.Error()
}

func (e *PlatformError) Unwrap() error { return e.Err }

// Up brings the rack up: it serves the netboot server for the rack while
// Run bootstraps it (the server's failure ends the bootstrap with that
// error), then installs the platform. Like Run, it continues from the
// state dir when run again.
func Up(ctx context.Context, opts UpOptions) (*UpResult, error) {
	// The bootstrap's context: the netboot server's failure ends it.
	runCtx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	var served sync.WaitGroup
	pxeDir := opts.InventoryDir
	if pxeDir == "" {
		pxeDir = filepath.Join(opts.StateDir, "pxe")
		cfg, err := netbootConfig(opts, pxeDir)
		if err != nil {
			return nil, err
		}
		served.Go(func() {
			if err := pxe.Serve(runCtx, cfg); err != nil {
				cancel(fmt.Errorf("netboot server: %w", err))
			}
		})
	}
	opts.Inventory = func() ([]inventory.Machine, error) {
		list, err := inventory.Load(pxeDir)
		if errors.Is(err, os.ErrNotExist) {
			return nil, nil // the server has seen no machine yet
		}
		return list, err
	}
	res, err := Run(runCtx, opts.Options)
	cancel(nil)
	served.Wait()
	if cause := context.Cause(runCtx); err != nil && cause != nil && !errors.Is(cause, context.Canceled) {
		err = cause
	}
	if err != nil {
		return nil, err
	}
	up := &UpResult{Result: res, Platform: PlatformSkipped}
	switch {
	case opts.Platform == nil:
	case opts.Rack.Platform.Git.URL == "":
		up.Platform = PlatformNoGit
	default:
		if err := installPlatform(ctx, opts, res.Kubeconfig); err != nil {
			return up, &PlatformError{Kubeconfig: res.Kubeconfig, Err: err}
		}
		up.Platform = PlatformInstalled
	}
	return up, nil
}

// netbootConfig is the rack's netboot server, serving opts.Boot.
func netbootConfig(opts UpOptions, stateDir string) (pxe.Config, error) {
	r, boot := opts.Rack, opts.Boot
	cfg, err := netboot.Config(r)
	if err != nil {
		return cfg, err
	}
	cfg.Kernel, cfg.Initrds, cfg.Cmdline, cfg.ARM64 = boot.Kernel, boot.Initrds, boot.Cmdline, boot.ARM64
	cfg.HTTPPort, cfg.ServerIP, cfg.AllowUnknown = boot.HTTPPort, boot.ServerIP, boot.AllowUnknown
	cfg.StateDir = stateDir
	cfg.Log = opts.Log
	if cfg.Log != nil {
		cfg.Log = cfg.Log.With("component", "pxe")
	}
	if err := netboot.CheckBoot(r, cfg); err != nil {
		return cfg, fmt.Errorf("%w\n(or another netboot server boots the rack: --no-netboot)", err)
	}
	return cfg, nil
}

func installPlatform(ctx context.Context, opts UpOptions, kubeconfig string) error {
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return err
	}
	p := *opts.Platform
	p.Git = platform.GitFromRack(opts.Rack)
	p.ClusterDomain = opts.Rack.Cluster.DNSDomain
	if p.Log == nil {
		p.Log = opts.Log
	}
	return platform.Install(ctx, cfg, p)
}
