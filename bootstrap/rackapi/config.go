package rackapi

import (
	"context"
	"fmt"
	"time"

	"github.com/cosi-project/runtime/pkg/resource"
	"github.com/siderolabs/talos/pkg/machinery/api/machine"
	"github.com/siderolabs/talos/pkg/machinery/client"
	coreconfig "github.com/siderolabs/talos/pkg/machinery/config"
	"github.com/siderolabs/talos/pkg/machinery/config/configpatcher"
	configres "github.com/siderolabs/talos/pkg/machinery/resources/config"
)

// MachineConfig is the config the node runs: Talos's MachineConfig
// resource, which only the os:admin role reads (the bootstrap's
// talosconfig has it).
func (r *Rack) MachineConfig(ctx context.Context, name string) (coreconfig.Provider, error) {
	var mc coreconfig.Provider
	err := r.Call(ctx, name, 15*time.Second, func(ctx context.Context, c *client.Client) error {
		res, err := c.COSI.Get(ctx, resource.NewMetadata(configres.NamespaceName, configres.MachineConfigType, configres.ActiveID, resource.VersionUndefined))
		if err != nil {
			return fmt.Errorf("machine config: %w", err)
		}
		got, ok := res.(*configres.MachineConfig)
		if !ok || got.Provider() == nil {
			return fmt.Errorf("machine config: the node sent a %T", res)
		}
		mc = got.Provider()
		return nil
	})
	return mc, err
}

// PatchConfig applies a patch (a strategic merge patch in YAML, as
// `talosctl patch mc` takes) to the config the node runs, without a
// reboot, as talosctl upgrade-k8s patches a node. It reports whether the
// config changed (a patch already in is not sent again).
func (r *Rack) PatchConfig(ctx context.Context, name, patch string) (bool, error) {
	cfg, err := r.MachineConfig(ctx, name)
	if err != nil {
		return false, err
	}
	p, err := configpatcher.LoadPatch([]byte(patch))
	if err != nil {
		return false, fmt.Errorf("patch: %w", err)
	}
	out, err := configpatcher.Apply(configpatcher.WithConfig(cfg), []configpatcher.Patch{p})
	if err != nil {
		return false, fmt.Errorf("patch the machine config: %w", err)
	}
	before, err := cfg.Bytes()
	if err != nil {
		return false, err
	}
	data, err := out.Bytes()
	if err != nil {
		return false, err
	}
	if string(before) == string(data) {
		return false, nil
	}
	err = r.Call(ctx, name, time.Minute, func(ctx context.Context, c *client.Client) error {
		if _, err := c.ApplyConfiguration(ctx, &machine.ApplyConfigurationRequest{Data: data, Mode: machine.ApplyConfigurationRequest_NO_REBOOT}); err != nil {
			return fmt.Errorf("apply the patched machine config: %w", err)
		}
		return nil
	})
	return err == nil, err
}
