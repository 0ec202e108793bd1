package cli

import (
	"time"

	"github.com/spf13/cobra"

	"cozy.dev/cozy/bootstrap/rack"
	"cozy.dev/cozy/bootstrap/rackapi"
	"cozy.dev/cozy/bootstrap/upgrade"
	"cozy.dev/cozy/internal/output"
)

func newUpgradeCommand(g *Globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "upgrade",
		Short: "Move the rack to the versions its rack file names, one node at a time",
	}
	cmd.AddCommand(newUpgradeTalosCommand(g), newUpgradeKubernetesCommand(g))
	return cmd
}

func newUpgradeTalosCommand(g *Globals) *cobra.Command {
	var f upgradeFlags
	cmd := &cobra.Command{
		Use:   "talos",
		Short: "Upgrade every node to the rack's talos.version, control planes first, one at a time",
		Long: `Upgrade the rack's nodes to the Talos version its rack file names
(talos.version; --version, if given, must be the same: the rack is what the
rack runs and what new machines install), through Talos's Upgrade API with
the rack's installer image:

  1. every node is asked for its version first; a node that does not
     answer, a downgrade, or a jump of more than one minor version refuses
     the whole upgrade before anything changes;
  2. control planes first, in rack order but the one that holds the VIP
     last (so that the VIP moves once), then workers, one node at a time:
     etcd must be healthy with every member before a node goes; then the
     upgrade; then the wait (--timeout) for the node back on the new
     version, its Node Ready (if Kubernetes has one), and etcd healthy
     with every member again;
  3. it stops at the first failure with the node and the reason.

Run again, it goes on where it stopped: nodes on the new version are
skipped, a node still upgrading or rebooting is waited for, not asked
again. --dry-run prints the plan.`,
		Example: "  cozyctl upgrade talos --rack rack.yaml --dry-run\n  cozyctl upgrade talos --rack rack.yaml --version v1.13.1",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			r, err := f.open()
			if err != nil {
				return err
			}
			res, err := upgrade.Talos(cmd.Context(), upgrade.Options{Rack: r, Version: f.version, DryRun: f.dryRun, Timeout: f.timeout, Log: g.Logger()})
			if len(res.Nodes) > 0 {
				if perr := g.Print(upgradeTable(res)); perr != nil && err == nil {
					err = perr
				}
			}
			return err
		},
	}
	f.register(cmd, "talos.version", "node", 15*time.Minute)
	return cmd
}

// upgradeFlags are what both upgrades take.
type upgradeFlags struct {
	rackFlags
	version string
	dryRun  bool
	timeout time.Duration
	port    int
}

// register adds the flags; field is the rack's version field, step what
// --timeout bounds the wait for.
func (f *upgradeFlags) register(cmd *cobra.Command, field, step string, timeout time.Duration) {
	f.rackFlags.register(cmd)
	fl := cmd.Flags()
	fl.StringVar(&f.version, "version", "", "the version to upgrade to: must be the rack's "+field+" (default: that)")
	fl.BoolVar(&f.dryRun, "dry-run", false, "print the plan; change nothing")
	fl.DurationVar(&f.timeout, "timeout", timeout, "bound on the wait for each "+step)
	fl.IntVar(&f.port, "talos-port", 50000, "the Talos API port on the nodes")
	_ = fl.MarkHidden("talos-port")
}

// open reads the rack file and opens its bootstrapped rack.
func (f *upgradeFlags) open() (*rackapi.Rack, error) {
	r, err := rack.Load(f.rackFile)
	if err != nil {
		return nil, err
	}
	return rackapi.Open(r, defaultStateDir(f.stateDir, f.rackFile, r), f.port)
}

type upgradeTable upgrade.Result

func (t upgradeTable) Header() []string {
	return []string{"NODE", "ROLE", "FROM", "TO", "RESULT", "TOOK"}
}

func (t upgradeTable) Rows() [][]string {
	var rows [][]string
	for _, s := range t.Nodes {
		took := "-"
		if s.Took > 0 {
			took = s.Took.String()
		}
		rows = append(rows, []string{s.Node, s.Role, dash(s.From), s.To, s.Result, took})
	}
	return rows
}

var _ output.Tabular = upgradeTable{}

func newUpgradeKubernetesCommand(g *Globals) *cobra.Command {
	var f upgradeFlags
	cmd := &cobra.Command{
		Use:   "kubernetes",
		Short: "Upgrade the control plane, kube-proxy and every kubelet to the rack's cluster.kubernetesVersion",
		Long: `Upgrade the rack's Kubernetes to the version its rack file names
(cluster.kubernetesVersion; --version, if given, must be the same), as
talosctl upgrade-k8s does, through each node's machine config:

  1. every node's config is read first, and every node pre-pulls the
     images it is to run; a node that does not answer, a downgrade, a jump
     of more than one minor version, a version a node's Talos does not
     run, or an image a node cannot pull refuses the whole upgrade before
     anything changes;
  2. kube-apiserver on each control plane in turn (in rack order, the one
     that holds the VIP last, so that the VIP moves once), then the
     controller-manager, then the scheduler: the image patched into the
     node's config (applied without a reboot), then the wait (--timeout)
     until the node's static pod runs the new version and is Ready;
  3. kube-proxy: the image in the control planes' configs and the
     kube-proxy DaemonSet, rolled out;
  4. every kubelet, control planes first: until its Node reports the new
     version and is Ready;
  5. it stops at the first failure with the node, the component and the
     reason.

Run again, it goes on where it stopped: a component whose config names the
new version is waited for, not patched again. --dry-run prints the plan.`,
		Example: "  cozyctl upgrade kubernetes --rack rack.yaml --dry-run\n  cozyctl upgrade kubernetes --rack rack.yaml --version v1.36.3",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			r, err := f.open()
			if err != nil {
				return err
			}
			res, err := upgrade.Kubernetes(cmd.Context(), upgrade.KubernetesOptions{Rack: r, Version: f.version, DryRun: f.dryRun, Timeout: f.timeout, Log: g.Logger()})
			if len(res.Steps) > 0 {
				if perr := g.Print(kubernetesTable(res)); perr != nil && err == nil {
					err = perr
				}
			}
			return err
		},
	}
	f.register(cmd, "cluster.kubernetesVersion", "component", 10*time.Minute)
	return cmd
}

type kubernetesTable upgrade.KubernetesResult

func (t kubernetesTable) Header() []string {
	return []string{"NODE", "COMPONENT", "FROM", "TO", "RESULT", "TOOK"}
}

func (t kubernetesTable) Rows() [][]string {
	var rows [][]string
	for _, s := range t.Steps {
		took := "-"
		if s.Took > 0 {
			took = s.Took.String()
		}
		rows = append(rows, []string{s.Node, s.Component, dash(s.From), s.To, s.Result, took})
	}
	return rows
}

var _ output.Tabular = kubernetesTable{}
