package rackapi

import (
	"context"
	"fmt"
	"time"

	"github.com/cosi-project/runtime/pkg/resource"
	"github.com/siderolabs/talos/pkg/machinery/api/machine"
	coreconfig "github.com/siderolabs/talos/pkg/machinery/config"
	"github.com/siderolabs/talos/pkg/machinery/config/configpatcher"
	configres "github.com/siderolabs/talos/pkg/machinery/resources/config"
)

// MachineConfig is the config the node runs: Talos's MachineConfig
// resource, which only the os:admin role reads (the bootstrap's
// talosconfig has it).
func (r *Rack) MachineConfig(ctx context.Context, name string) (coreconfig.Provider, error) {
	ctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	c, err := r.Connect(ctx, name)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	res, err := c.COSI.Get(ctx, resource.NewMetadata(configres.NamespaceName, configres.MachineConfigType, configres.ActiveID, resource.VersionUndefined))
	if err != nil {
		return nil, fmt.Errorf("machine config: %w", err)
	}
	mc, ok := res.(*configres.MachineConfig)
	if !ok || mc.Provider() == nil {
		return nil, fmt.Errorf("machine config: the node sent a %T", res)
	}
	return mc.Provider(), nil
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
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	c, err := r.Connect(ctx, name)
	if err != nil {
		return false, err
	}
	defer c.Close()
	if _, err := c.ApplyConfiguration(ctx, &machine.ApplyConfigurationRequest{Data: data, Mode: machine.ApplyConfigurationRequest_NO_REBOOT}); err != nil {
		return false, fmt.Errorf("apply the patched machine config: %w", err)
	}
	return true, nil
}
