package cli

import (
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"cozy.dev/cozy/bootstrap"
	"cozy.dev/cozy/bootstrap/rack"
	"cozy.dev/cozy/internal/output"
)

func newNodeCommand(g *Globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "node",
		Short: "Add nodes to the running cluster, take them out for good, or reset them for reuse",
		Long: `Day-2 work on the nodes of a bootstrapped rack, through the Talos API
and the Kubernetes API with the bootstrap's state dir (its talosconfig,
kubeconfig and the addresses it recorded). A control plane is taken out
only while etcd keeps its quorum without it.`,
	}
	cmd.AddCommand(newNodeAddCommand(g), newNodeRemoveCommand(g), newReprovisionCommand(g, "reset"))
	return cmd
}

func newNodeAddCommand(g *Globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "add",
		Short: "Install and join the rack's machines that are not in its cluster yet",
		Long: `Take the machines of the rack file that are not in its cluster yet (new
in the rack file, removed before, or cut short in an earlier run) through
the bootstrap's path: the netboot server, each machine found as it
netboots, its install disk checked, its config applied, back installed; a
control plane joins etcd by itself, and the command waits until it is a
voting member. The machines already in the cluster are not touched (the
bootstrap skips what its state dir has as done), and etcd is never
bootstrapped again.

It takes the flags of cozyctl bootstrap and refuses before anything runs
when the state dir holds no bootstrapped cluster, or when every machine of
the rack is in it already.`,
		Example: "  cozyctl node add --rack rack.yaml --kernel vmlinuz --initrd initramfs.xz",
		Args:    cobra.NoArgs,
	}
	bringUp(g, cmd, func(r *rack.Rack, stateDir string) error {
		names, err := bootstrap.NewMachines(r, stateDir)
		if err != nil {
			return err
		}
		g.Logger().Info("adding to the cluster", "machines", strings.Join(names, ","))
		return nil
	})
	return cmd
}

func newNodeRemoveCommand(g *Globals) *cobra.Command {
	var (
		f rackFlags
		o bootstrap.RemoveOptions
	)
	cmd := &cobra.Command{
		Use:   "remove NAME",
		Short: "Take a machine out of the cluster for good: drain, leave etcd, wipe, power off, delete its Node",
		Long: `Take a machine out of the rack's cluster for good:

  1. a control plane only if etcd can remove its member without it: the
     other healthy members must be a quorum of the current members (so
     the second control plane of three is refused: 1 of 2 is not a
     quorum); the refusal gives the numbers, before anything is changed;
  2. its Node cordoned and drained (the Eviction API, so disruption
     budgets hold; DaemonSet and static pods stay);
  3. a control plane leaves etcd (Talos's EtcdLeaveCluster);
  4. the machine is reset: its disk wiped (--wipe system: the install
     disk; all: also the user disks Talos manages), then powered off;
  5. its Node is deleted.

--lost is for a machine gone for good (a dead board): it is not asked for
anything and not reset; another control plane removes its etcd member.
--dry-run checks and prints the plan. The state dir records each step: a
removal cut short is run again. Take the machine out of the rack file
afterwards; while the rack lists it, the bootstrap waits for it.`,
		Example: "  cozyctl node remove cp3 --rack rack.yaml --dry-run\n  cozyctl node remove cp3 --rack rack.yaml",
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			r, err := rack.Load(f.rackFile)
			if err != nil {
				return err
			}
			o.Rack, o.StateDir, o.Machine, o.Log = r, defaultStateDir(f.stateDir, f.rackFile, r), args[0], g.Logger()
			res, err := bootstrap.Remove(cmd.Context(), o)
			if err != nil {
				return err
			}
			return g.Print(removedTable(res))
		},
	}
	f.register(cmd)
	fl := cmd.Flags()
	fl.StringVar(&o.Wipe, "wipe", bootstrap.WipeSystem, "system (the install disk) or all (also the user disks)")
	fl.BoolVar(&o.Lost, "lost", false, "the machine is gone for good: not asked or reset; its etcd member is removed through another control plane")
	fl.BoolVar(&o.DryRun, "dry-run", false, "check and print the plan; change nothing")
	fl.DurationVar(&o.Timeout, "timeout", 5*time.Minute, "bound on the drain and on the wait for the machine to go down")
	fl.IntVar(&o.TalosPort, "talos-port", 50000, "the Talos API port on the nodes")
	_ = fl.MarkHidden("talos-port")
	return cmd
}

type removedTable bootstrap.Removed

func (t removedTable) Header() []string {
	return []string{"NODE", "ROLE", "ETCD", "MEMBERS", "HEALTHY", "NODE OBJECT", "EVICTED", "RESULT"}
}

func (t removedTable) Rows() [][]string {
	etcd := dash(t.Etcd)
	if t.EtcdLeft != "" {
		etcd = t.EtcdLeft
	}
	object := map[bool]string{true: "yes", false: "none"}[t.HasNode]
	result := ""
	switch {
	case t.Already:
		result = "removed before; nothing left to do"
		if t.NodeDeleted {
			result = "removed before; its Node deleted now"
		}
	case t.DryRun:
		result = "dry run: would drain, leave etcd, reset and delete its Node"
	default:
		result = t.Reset
		if t.NodeDeleted {
			object = "deleted"
		}
		result += fmt.Sprintf(" (%s)", t.Took)
	}
	return [][]string{{t.Node, dash(t.Role), etcd, dash(strings.Join(t.Members, ",")), dash(strings.Join(t.Healthy, ",")),
		object, fmt.Sprint(len(t.Evicted)), result}}
}

var _ output.Tabular = removedTable{}
