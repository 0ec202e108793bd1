package talosnode_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/siderolabs/talos/pkg/machinery/api/machine"

	"cozy.dev/cozy/lab/talosnode"
)

// TestRebootExit: with RebootExit the node leaves every reboot to the
// machine it runs on (Run returns ErrReboot) and power-offs return nil;
// the next boot of the same disk, a new Run, comes up in the mode the disk
// says. This is how a VM's init drives the node (lab/nodeimage).
func TestRebootExit(t *testing.T) {
	addr := loopbackAddress(t)
	cfg := testMachine(t, addr, "52:54:00:00:00:01")
	cfg.Reboot = talosnode.RebootExit
	cfg.RebootDelay = time.Hour // must not be waited for
	cl := newCluster(t, addr)
	tc := cl.talosconfig(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	install := func(n *runningNode) {
		t.Helper()
		waitMaintenance(t, n)
		if _, err := insecureClient(t, n.endpoint()).ApplyConfiguration(ctx, &machine.ApplyConfigurationRequest{
			Data: cl.machineConfig(t, "cp1"), Mode: machine.ApplyConfigurationRequest_AUTO,
		}); err != nil {
			t.Fatalf("ApplyConfiguration: %v", err)
		}
		n.wantExit(t, talosnode.ErrReboot, "install")
	}
	configPath := filepath.Join(cfg.StateDir, talosnode.ConfigFile)

	install(startNode(t, cfg))

	n := startNode(t, cfg)
	waitConfigured(t, n, tc)
	if err := configClient(t, tc, n.endpoint()).Reboot(ctx); err != nil {
		t.Fatalf("Reboot: %v", err)
	}
	n.wantExit(t, talosnode.ErrReboot, "Reboot")

	n = startNode(t, cfg)
	waitConfigured(t, n, tc)
	if err := configClient(t, tc, n.endpoint()).Reset(ctx, false, true); err != nil {
		t.Fatalf("Reset: %v", err)
	}
	n.wantExit(t, talosnode.ErrReboot, "Reset with reboot")
	if _, err := os.Stat(configPath); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the config survived the reset (stat: %v)", err)
	}

	// Power-off is still Run returning nil.
	install(startNode(t, cfg))
	n = startNode(t, cfg)
	waitConfigured(t, n, tc)
	if err := configClient(t, tc, n.endpoint()).Shutdown(ctx); err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
	n.wantExit(t, nil, "Shutdown")
	if _, err := os.Stat(configPath); err != nil {
		t.Errorf("the config is gone after a shutdown: %v", err)
	}
}

// wantExit waits for Run to return on its own, with want.
func (rn *runningNode) wantExit(t testing.TB, want error, after string) {
	t.Helper()
	select {
	case err := <-rn.done:
		rn.cancel()
		rn.cancel = nil
		if !errors.Is(err, want) || (want == nil && err != nil) {
			t.Fatalf("after %s, Run returned %v, want %v", after, err, want)
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("after %s, Run did not return", after)
	}
}
