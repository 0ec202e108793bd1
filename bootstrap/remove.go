package bootstrap

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/siderolabs/talos/pkg/machinery/api/machine"

	"cozy.dev/cozy/bootstrap/leave"
	"cozy.dev/cozy/bootstrap/rack"
	"cozy.dev/cozy/bootstrap/rackapi"
	"cozy.dev/cozy/bootstrap/state"
	"cozy.dev/cozy/internal/wait"
)

// RemoveOptions of one `cozyctl node remove`.
type RemoveOptions struct {
	Rack     *rack.Rack
	StateDir string
	Machine  string
	// Wipe is WipeSystem (default) or WipeAll.
	Wipe string
	// Lost says the machine is gone for good (see leave.Options.Lost):
	// it is neither asked nor reset.
	Lost bool
	// DryRun only checks and returns the plan.
	DryRun    bool
	TalosPort int
	// Timeout bounds the drain and the wait for the machine to go down.
	Timeout time.Duration
	Log     *slog.Logger
}

// Removed is what Remove did (or, in a dry run, would do).
type Removed struct {
	leave.Left
	// Reset says how the machine's disk went: "wiped (system), powered
	// off", or why it was not reset.
	Reset       string        `json:"reset,omitempty"`
	NodeDeleted bool          `json:"nodeDeleted,omitempty"`
	DryRun      bool          `json:"dryRun,omitempty"`
	Already     bool          `json:"alreadyRemoved,omitempty"`
	Took        time.Duration `json:"took"`
}

// Remove takes a machine out of the rack's cluster for good: it checks
// that etcd keeps its quorum without it (for a control plane), cordons
// and drains its Node, takes it out of etcd, resets it with its disk
// wiped and powers it off, and deletes its Node. The state dir records
// each step before it is taken: run again, a removal cut short goes on
// where it stopped (a machine asked to reset that no longer answers is
// taken as reset).
func Remove(ctx context.Context, o RemoveOptions) (Removed, error) {
	start := time.Now()
	if o.Wipe == "" {
		o.Wipe = WipeSystem
	}
	if o.Wipe != WipeSystem && o.Wipe != WipeAll {
		return Removed{}, fmt.Errorf("--wipe %q: system or all", o.Wipe)
	}
	st, err := state.Open(o.StateDir, o.Rack.Metadata.Name)
	if err != nil {
		return Removed{}, err
	}
	lo, err := leaveOptions(o.Rack, o.StateDir, o.TalosPort, o.Timeout, o.Log)
	if err != nil {
		return Removed{}, err
	}
	lo.Lost = o.Lost
	name := o.Machine
	res := Removed{DryRun: o.DryRun}
	res.Node = name
	if _, err := lo.Rack.Machine(name); err != nil {
		return res, err
	}
	phase := st.Node(name).Phase
	switch {
	case phase == state.Removed:
		// Only the Node may be left, if a run stopped right before.
		res.Already = true
		if !o.DryRun {
			res.NodeDeleted, err = leave.DeleteNode(ctx, lo, name)
		}
		return res, err
	case phase == state.Resetting && talosGone(ctx, lo, name):
		res.Reset = "asked before; no longer answers"
		if o.DryRun {
			return res, nil
		}
		lo.Log.Info("asked to reset before and no longer answering: taken as reset", "node", name)
		return finishRemove(ctx, st, lo, res, start)
	}
	// Every check before the state dir records anything: a refused
	// removal leaves the node as it was, in the cluster and in the state.
	plan, err := leave.Check(ctx, lo, name)
	res.Left = leave.Left{Plan: plan}
	if err != nil || o.DryRun {
		return res, err
	}
	if err := setPhase(st, name, state.Leaving); err != nil {
		return res, err
	}
	res.Left, err = leave.Out(ctx, lo, plan)
	if err != nil {
		return res, err
	}
	if o.Lost {
		res.Reset = "not reset: lost (wipe its disks before it comes back)"
		return finishRemove(ctx, st, lo, res, start)
	}
	if err := setPhase(st, name, state.Resetting); err != nil {
		return res, err
	}
	if err := resetOff(ctx, lo, name, o.Wipe); err != nil {
		return res, err
	}
	res.Reset = "wiped (" + o.Wipe + "), powered off"
	return finishRemove(ctx, st, lo, res, start)
}

func finishRemove(ctx context.Context, st *state.Store, lo leave.Options, res Removed, start time.Time) (Removed, error) {
	var err error
	if err := setPhase(st, res.Node, state.Removed); err != nil {
		return res, err
	}
	res.NodeDeleted, err = leave.DeleteNode(ctx, lo, res.Node)
	res.Took = time.Since(start).Round(100 * time.Millisecond)
	if err == nil {
		lo.Log.Info("removed; take it out of the rack file", "node", res.Node)
	}
	return res, err
}

func setPhase(st *state.Store, name string, p state.Phase) error {
	return st.Update(func(s *state.State) {
		n := s.Nodes[name]
		if n == nil {
			n = &state.Node{Hostname: name}
			s.Nodes[name] = n
		}
		n.Phase, n.Since, n.Error = p, time.Now(), ""
	})
}

// leaveOptions are the leave package's options from the state dir.
func leaveOptions(r *rack.Rack, stateDir string, port int, timeout time.Duration, log *slog.Logger) (leave.Options, error) {
	ra, err := rackapi.Open(r, stateDir, port)
	if err != nil {
		return leave.Options{}, err
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return leave.Options{Rack: ra, Timeout: timeout, Log: log}, nil
}

// resetOff resets the machine with its disk wiped and without a reboot
// (Talos powers it off), then waits until its API is gone. Not graceful:
// the machine has left the cluster already.
func resetOff(ctx context.Context, o leave.Options, name, wipe string) error {
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	c, err := o.Rack.Connect(cctx, name)
	if err != nil {
		return fmt.Errorf("%s: the Talos API at %s: %w", name, o.Rack.Endpoint(name), err)
	}
	defer c.Close()
	mode := machine.ResetRequest_SYSTEM_DISK
	if wipe == WipeAll {
		mode = machine.ResetRequest_ALL
	}
	o.Log.Info("resetting: disk wiped, then powered off", "node", name, "wipe", wipe)
	if err := c.ResetGeneric(cctx, &machine.ResetRequest{Graceful: false, Reboot: false, Mode: mode}); err != nil {
		return fmt.Errorf("%s: reset: %w", name, err)
	}
	return wait.For(ctx, o.Timeout, name+" gone after its reset", func() error {
		if !talosGone(ctx, o, name) {
			return errors.New("its Talos API still answers")
		}
		return nil
	})
}

// talosGone says the machine's configured Talos API does not answer.
func talosGone(ctx context.Context, o leave.Options, name string) bool {
	if o.Rack.Endpoint(name) == "" {
		return true
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	_, err := o.Rack.Version(ctx, name)
	return err != nil
}
