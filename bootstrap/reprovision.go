package bootstrap

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/siderolabs/talos/pkg/machinery/api/machine"
	clientconfig "github.com/siderolabs/talos/pkg/machinery/client/config"

	"cozy.dev/cozy/bmc"
	"cozy.dev/cozy/bootstrap/leave"
	"cozy.dev/cozy/bootstrap/power"
	"cozy.dev/cozy/bootstrap/rack"
	"cozy.dev/cozy/bootstrap/state"
	"cozy.dev/cozy/bootstrap/talosapi"
)

// Wipe modes of a reprovision, Talos's reset modes.
const (
	// WipeSystem wipes the Talos install disk (its STATE and EPHEMERAL
	// partitions among the rest), not other disks.
	WipeSystem = "system"
	// WipeAll wipes the install disk and every user disk Talos manages.
	WipeAll = "all"
)

// ReprovisionOptions of one reprovision.
type ReprovisionOptions struct {
	Rack     *rack.Rack
	StateDir string
	Machines []string
	// Wipe is WipeSystem (default) or WipeAll.
	Wipe      string
	TalosPort int
	// Timeout bounds the wait for each machine to be back in maintenance
	// mode (default 10m).
	Timeout time.Duration
	Log     *slog.Logger
}

// Reprovisioned is one machine's result.
type Reprovisioned struct {
	Machine string `json:"machine"`
	// How is "talos reset" (through the Talos API) or "bmc" (one-time
	// network boot and a power cycle, for a machine the API cannot reach).
	How string `json:"how,omitempty"`
	IP  string `json:"ip,omitempty"`
	// Back says it answered in maintenance mode at IP; a machine that got
	// another address is found by the next bootstrap all the same.
	Back  bool          `json:"back"`
	Took  time.Duration `json:"took"`
	Error string        `json:"error,omitempty"`
}

// Reprovision takes installed workers back to Talos maintenance mode, with
// their disks wiped, for the next `cozyctl bootstrap` to install again:
// a Talos reset (graceful, then reboot) if the node's API answers, with a
// one-time network boot set first through its BMC if it has one; else,
// through the BMC, a one-time network boot and a power cycle. The state
// dir records each as pending before anything is done to it, so a run
// cut short leaves nothing the bootstrap would skip. Each machine is
// first taken out of the cluster (package leave): its Node drained, a
// control plane out of etcd, refused if etcd would lose its quorum; the
// Node is deleted after the reset. Control planes go one per run.
func Reprovision(ctx context.Context, o ReprovisionOptions) []Reprovisioned {
	if o.Wipe == "" {
		o.Wipe = WipeSystem
	}
	if o.TalosPort == 0 {
		o.TalosPort = 50000
	}
	if o.Timeout == 0 {
		o.Timeout = 10 * time.Minute
	}
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	var controlPlanes []string
	for _, m := range o.Rack.Machines {
		if m.Role == rack.RoleControlPlane && slices.Contains(o.Machines, m.Hostname) {
			controlPlanes = append(controlPlanes, m.Hostname)
		}
	}
	if len(controlPlanes) > 1 {
		// One at a time: each must leave etcd with its quorum intact.
		out := make([]Reprovisioned, len(o.Machines))
		for i, name := range o.Machines {
			out[i] = Reprovisioned{Machine: name, Error: fmt.Sprintf("%d control planes (%s): reprovision them one at a time, so that each leaves etcd with its quorum intact",
				len(controlPlanes), strings.Join(controlPlanes, ", "))}
		}
		return out
	}
	results := bmc.Each(ctx, o.Machines, 0, func(ctx context.Context, name string) (Reprovisioned, error) {
		start := time.Now()
		r, err := reprovision(ctx, o, name)
		r.Took = time.Since(start).Round(100 * time.Millisecond)
		return r, err
	})
	out := make([]Reprovisioned, len(results))
	for i, r := range results {
		out[i] = r.Value
		out[i].Machine = r.Machine
		if r.Err != nil {
			out[i].Error = r.Err.Error()
		}
	}
	return out
}

func reprovision(ctx context.Context, o ReprovisionOptions, name string) (Reprovisioned, error) {
	res := Reprovisioned{Machine: name}
	i := slices.IndexFunc(o.Rack.Machines, func(m rack.Machine) bool { return m.Hostname == name })
	if i < 0 {
		return res, fmt.Errorf("no machine %q in the rack", name)
	}
	m := &o.Rack.Machines[i]
	if o.Wipe != WipeSystem && o.Wipe != WipeAll {
		return res, fmt.Errorf("--wipe %q: system or all", o.Wipe)
	}
	st, err := state.Open(o.StateDir, o.Rack.Metadata.Name)
	if err != nil {
		return res, err
	}
	n := st.Node(name)
	if !n.Phase.AtLeast(state.Discovered) && !n.IP.IsValid() {
		return res, errors.New("the bootstrap has not seen it: nothing to reprovision, `cozyctl bootstrap` takes it as it is")
	}
	ip := n.IP
	res.IP = ip.String()
	// Out of the cluster first: drained, and out of etcd for a control
	// plane (refused if etcd would lose its quorum). A machine whose API
	// is gone is left as lost: its member is removed through the others.
	lo, err := leaveOptions(o.Rack, o.StateDir, o.TalosPort, o.Timeout, o.Log)
	if err != nil {
		return res, err
	}
	lo.Lost = talosGone(ctx, lo, name)
	if _, err := leave.Cluster(ctx, lo, name); err != nil {
		return res, err
	}
	if err := st.Update(func(s *state.State) {
		s.Nodes[name].Phase, s.Nodes[name].Since, s.Nodes[name].Error = state.Pending, time.Now(), "reprovisioning"
	}); err != nil {
		return res, err
	}
	endpoint := talosapi.Endpoint(ip, o.TalosPort)
	if err := resetThroughTalos(ctx, o, m, endpoint); err == nil {
		res.How = "talos reset"
	} else if m.BMC != nil {
		o.Log.Info("the Talos API does not take the reset: power-cycling into a network boot through the BMC", "machine", name, "err", err)
		if _, err := power.Netboot(ctx, m, bmc.DefaultTimeout); err != nil {
			return res, fmt.Errorf("the Talos API at %s: reset refused or unreachable, and the BMC: %w", endpoint, err)
		}
		res.How = "bmc"
	} else {
		return res, fmt.Errorf("the Talos API at %s: %w; no bmc in the rack to power-cycle it", endpoint, err)
	}
	if _, err := leave.DeleteNode(ctx, lo, name); err != nil {
		return res, err
	}
	res.Back = waitMaintenance(ctx, o, endpoint)
	if !res.Back {
		o.Log.Warn("not back in maintenance mode at its old address; the next bootstrap finds it wherever it netboots", "machine", name, "ip", ip)
	}
	return res, nil
}

// resetThroughTalos resets a configured node: a one-time network boot
// first if it has a BMC, so the reboot lands in the netboot server's
// maintenance mode whatever the boot order.
func resetThroughTalos(ctx context.Context, o ReprovisionOptions, m *rack.Machine, endpoint string) error {
	tc, err := clientconfig.Open(filepath.Join(o.StateDir, TalosDir, "talosconfig"))
	if err != nil {
		return err
	}
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	c, err := talosapi.Secure(cctx, tc, endpoint)
	if err != nil {
		return err
	}
	defer c.Close()
	if _, err := c.Version(cctx); err != nil {
		return err
	}
	if m.BMC != nil {
		if _, err := power.BootOnce(ctx, m, bmc.DefaultTimeout); err != nil {
			return fmt.Errorf("one-time network boot through the BMC: %w", err)
		}
	}
	mode := machine.ResetRequest_SYSTEM_DISK
	if o.Wipe == WipeAll {
		mode = machine.ResetRequest_ALL
	}
	return c.ResetGeneric(cctx, &machine.ResetRequest{Graceful: true, Reboot: true, Mode: mode})
}

// waitMaintenance waits until the node answers in maintenance mode.
func waitMaintenance(ctx context.Context, o ReprovisionOptions, endpoint string) bool {
	ctx, cancel := context.WithTimeout(ctx, o.Timeout)
	defer cancel()
	for {
		if c, err := talosapi.Maintenance(ctx, endpoint); err == nil {
			cctx, ccancel := context.WithTimeout(ctx, 10*time.Second)
			f, err := talosapi.ReadFacts(cctx, c)
			ccancel()
			c.Close()
			if err == nil && f.Stage == "maintenance" {
				return true
			}
		}
		select {
		case <-ctx.Done():
			return false
		case <-time.After(2 * time.Second):
		}
	}
}
