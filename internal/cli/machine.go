package cli

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"cozy.dev/cozy/bmc"
	"cozy.dev/cozy/bootstrap"
	"cozy.dev/cozy/bootstrap/power"
	"cozy.dev/cozy/bootstrap/rack"
	"cozy.dev/cozy/internal/output"
)

func newMachineCommand(g *Globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "machine",
		Short: "Power machines, netboot them once and read their hardware, through their BMCs",
		Long: `Drive the rack's machines through their baseboard management controllers
(each machine's bmc in the rack file: a Redfish address and a credentials
file). Machines are named by hostname, or all those with a bmc by --all; they
are driven at once, at most --parallel at a time, and each gets its own row:
one BMC that fails or hangs (each request is bounded by --timeout) does not
hold up the others. The command fails if any machine failed.`,
	}
	// Its former name, kept working; not cobra's Deprecated, which
	// writes its notice to stdout, into -o json.
	reprovision := newReprovisionCommand(g, "reprovision")
	reprovision.Hidden = true
	run := reprovision.RunE
	reprovision.RunE = func(cmd *cobra.Command, args []string) error {
		g.Logger().Warn("cozyctl machine reprovision is now cozyctl node reset")
		return run(cmd, args)
	}
	cmd.AddCommand(newMachinePowerCommand(g), newMachineBootCommand(g), newMachineInspectCommand(g), reprovision)
	return cmd
}

// machineFlags are the flags every machine subcommand takes.
type machineFlags struct {
	rackFile string
	all      bool
	opts     power.Options
}

func (f *machineFlags) register(cmd *cobra.Command) {
	cmd.Flags().StringVar(&f.rackFile, "rack", "", "the rack file (required)")
	cmd.Flags().BoolVar(&f.all, "all", false, "every machine in the rack that has a bmc")
	cmd.Flags().IntVar(&f.opts.Parallel, "parallel", bmc.DefaultParallel, "how many BMCs to drive at once")
	cmd.Flags().DurationVar(&f.opts.Timeout, "timeout", bmc.DefaultTimeout, "bound on each request to a BMC")
	_ = cmd.MarkFlagRequired("rack")
	_ = cmd.MarkFlagFilename("rack", "yaml", "yml")
}

// run loads the rack, runs op on the machines named and prints a row each.
func (f *machineFlags) run(ctx context.Context, g *Globals, names []string, op power.Op, view func([]power.Row) any) error {
	r, err := rack.Load(f.rackFile)
	if err != nil {
		return err
	}
	ms, err := power.Select(r, names, f.all)
	if err != nil {
		return err
	}
	f.opts.Log = g.Logger()
	rows := power.Run(ctx, ms, f.opts, op)
	if err := g.Print(view(rows)); err != nil {
		return err
	}
	if n := power.Failed(rows); n > 0 {
		return fmt.Errorf("%d of %d machines failed", n, len(rows))
	}
	return nil
}

func newMachinePowerCommand(g *Globals) *cobra.Command {
	var f machineFlags
	cmd := &cobra.Command{
		Use:   "power status|on|off|soft|cycle|reset [NAME...]",
		Short: "Read or change machines' power",
		Long: `Read or change machines' power through their BMCs:

  status  the power state
  on      power on (a machine already on is left alone)
  off     cut power at once (Redfish ForceOff)
  soft    ask the operating system to shut down (GracefulShutdown)
  cycle   off, then on (PowerCycle where the BMC offers it); an off machine
          is powered on
  reset   restart without removing power (ForceRestart)

Each row shows the power state the BMC reports after the action.`,
		Example: `  cozyctl machine power status --all --rack rack.yaml
  cozyctl machine power cycle worker1 worker2 --rack rack.yaml`,
		Args:      cobra.MinimumNArgs(1),
		ValidArgs: []string{"status", "on", "off", "soft", "cycle", "reset"},
		RunE: func(cmd *cobra.Command, args []string) error {
			op := power.Status
			if args[0] != "status" {
				a, err := bmc.ParseAction(args[0])
				if err != nil {
					return fmt.Errorf("%w, or status", err)
				}
				op = power.Act(a)
			}
			return f.run(cmd.Context(), g, args[1:], op, func(rows []power.Row) any { return powerTable(rows) })
		},
	}
	f.register(cmd)
	return cmd
}

func newMachineBootCommand(g *Globals) *cobra.Command {
	var f machineFlags
	once := false
	cmd := &cobra.Command{
		Use:   "boot pxe --once [NAME...]",
		Short: "Make machines' next boot a network boot",
		Long: `Set a one-time network boot (Redfish BootSourceOverrideTarget Pxe, Enabled
Once) on machines' BMCs; it applies at the next power-on or reset (cozyctl
machine power on|cycle|reset) and then reverts to the machine's boot order.

A BMC that refuses a one-time override gets a continuous one instead: the
row says so (FALLBACK) with the previous override, which 'cozyctl bootstrap'
puts back once the machine has netbooted. Put it back by hand in the BMC
otherwise, or the machine netboots every time.`,
		Example: "  cozyctl machine boot pxe --once worker1 --rack rack.yaml && cozyctl machine power cycle worker1 --rack rack.yaml",
		Args:    cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if args[0] != "pxe" {
				return fmt.Errorf("unknown boot device %q: pxe is the one Cozy sets", args[0])
			}
			if !once {
				return fmt.Errorf("give --once: Cozy sets only one-time network boots, so a machine never netboots forever by accident")
			}
			return f.run(cmd.Context(), g, args[1:], power.BootPXEOnce, func(rows []power.Row) any { return bootTable(rows) })
		},
	}
	f.register(cmd)
	cmd.Flags().BoolVar(&once, "once", false, "for the next boot only (required)")
	return cmd
}

func newMachineInspectCommand(g *Globals) *cobra.Command {
	var f machineFlags
	cmd := &cobra.Command{
		Use:   "inspect [NAME...]",
		Short: "Print machines' hardware as their BMCs report it",
		Long: `Print each machine's hardware as its BMC reports it: model, serial number,
SMBIOS UUID, CPUs, memory, NICs with their MACs and disks. -o json gives
everything; the table gives a line per machine.`,
		Example: "  cozyctl machine inspect cp1 -o json --rack rack.yaml",
		RunE: func(cmd *cobra.Command, args []string) error {
			return f.run(cmd.Context(), g, args, power.Inspect, func(rows []power.Row) any { return inventoryTable(rows) })
		},
	}
	f.register(cmd)
	return cmd
}

// result is a row's last column: the error, or ok.
func result(r power.Row) string {
	if r.Error != "" {
		return r.Error
	}
	return "ok"
}

type powerTable []power.Row

func (t powerTable) Header() []string { return []string{"MACHINE", "BMC", "POWER", "RESULT"} }
func (t powerTable) Rows() [][]string {
	var rows [][]string
	for _, r := range t {
		rows = append(rows, []string{r.Machine, r.BMC, dash(string(r.Power)), result(r)})
	}
	return rows
}

type bootTable []power.Row

func (t bootTable) Header() []string {
	return []string{"MACHINE", "BMC", "BOOT", "PREVIOUS", "FALLBACK", "RESULT"}
}
func (t bootTable) Rows() [][]string {
	var rows [][]string
	for _, r := range t {
		boot, prev, fallback := "-", "-", "-"
		if b := r.Boot; b != nil {
			boot, prev, fallback = b.Now.Target+" "+b.Now.Enabled, b.Previous.Target+" "+b.Previous.Enabled, strconv.FormatBool(b.Fallback)
		}
		rows = append(rows, []string{r.Machine, r.BMC, boot, prev, fallback, result(r)})
	}
	return rows
}

type inventoryTable []power.Row

func (t inventoryTable) Header() []string {
	return []string{"MACHINE", "MODEL", "SERIAL", "UUID", "CPUS", "MEMORY", "NICS", "DISKS", "POWER", "RESULT"}
}
func (t inventoryTable) Rows() [][]string {
	var rows [][]string
	for _, r := range t {
		inv := r.Inventory
		if inv == nil {
			rows = append(rows, []string{r.Machine, "-", "-", "-", "-", "-", "-", "-", dash(string(r.Power)), result(r)})
			continue
		}
		var nics, disks []string
		for _, n := range inv.NICs {
			nics = append(nics, n.MAC)
		}
		for _, d := range inv.Disks {
			disks = append(disks, fmt.Sprintf("%s %dG", d.Name, d.CapacityBytes>>30))
		}
		rows = append(rows, []string{
			r.Machine, strings.TrimSpace(inv.Manufacturer + " " + inv.Model), dash(inv.SerialNumber), dash(inv.UUID),
			strconv.Itoa(inv.CPUs), fmt.Sprintf("%.1fGiB", inv.MemoryGiB), dash(strings.Join(nics, ",")),
			dash(strings.Join(disks, ",")), dash(string(inv.PowerState)), result(r),
		})
	}
	return rows
}

var (
	_ output.Tabular = powerTable{}
	_ output.Tabular = bootTable{}
	_ output.Tabular = inventoryTable{}
	_ output.Tabular = reprovisionTable{}
)

// newReprovisionCommand is `cozyctl node reset`; `cozyctl machine
// reprovision`, its former name, is the same command, deprecated.
func newReprovisionCommand(g *Globals, use string) *cobra.Command {
	var (
		rackFile string
		o        bootstrap.ReprovisionOptions
	)
	cmd := &cobra.Command{
		Use:   use + " NAME...",
		Short: "Take installed machines out of the cluster and wipe them back to Talos maintenance mode, for the next bootstrap to install again",
		Long: `Take installed machines out of the cluster and back to Talos maintenance
mode, their install disk wiped, for the next 'cozyctl bootstrap' (same
--rack and --state-dir) to install and join them again:

  - first out of the cluster, as 'cozyctl node remove' does: a control
    plane only if etcd keeps its quorum without it (refused otherwise,
    with the numbers); its Node cordoned and drained; a control plane out
    of etcd (it leaves; if its API is gone, the others remove its member);
  - if the node's Talos API answers (the bootstrap's talosconfig), a Talos
    reset: graceful, wipe (--wipe system: the install disk; all: also the
    user disks Talos manages), reboot, with a one-time network boot set
    first through its BMC if it has one;
  - else, through its BMC, a one-time network boot and a power cycle;
  - then its Node is deleted.

It then waits (--timeout) for the machine to answer in maintenance mode at
its address. The state dir marks each machine pending before it is reset.
Workers go in parallel; control planes one per run.`,
		Example: "  cozyctl node reset w2 --rack rack.yaml --state-dir state && cozyctl bootstrap --rack rack.yaml --state-dir state ...",
		Args:    cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			r, err := rack.Load(rackFile)
			if err != nil {
				return err
			}
			o.Rack, o.Machines, o.Log = r, args, g.Logger()
			rows := bootstrap.Reprovision(cmd.Context(), o)
			if err := g.Print(reprovisionTable(rows)); err != nil {
				return err
			}
			failed := 0
			for _, r := range rows {
				if r.Error != "" {
					failed++
				}
			}
			if failed > 0 {
				return fmt.Errorf("%d of %d machines failed", failed, len(rows))
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&rackFile, "rack", "", "the rack file (required)")
	f.StringVar(&o.StateDir, "state-dir", "", "the bootstrap's state dir (required)")
	f.StringVar(&o.Wipe, "wipe", bootstrap.WipeSystem, "system (the install disk) or all (also the user disks)")
	f.DurationVar(&o.Timeout, "timeout", 10*time.Minute, "how long to wait for each machine to be back in maintenance mode")
	f.IntVar(&o.TalosPort, "talos-port", 50000, "the Talos API port on the nodes")
	_ = f.MarkHidden("talos-port")
	_ = cmd.MarkFlagRequired("rack")
	_ = cmd.MarkFlagRequired("state-dir")
	return cmd
}

type reprovisionTable []bootstrap.Reprovisioned

func (t reprovisionTable) Header() []string {
	return []string{"MACHINE", "IP", "HOW", "MAINTENANCE", "TOOK", "RESULT"}
}
func (t reprovisionTable) Rows() [][]string {
	var rows [][]string
	for _, r := range t {
		back := "-"
		if r.How != "" {
			back = map[bool]string{true: "back", false: "not at its address"}[r.Back]
		}
		res := "ok"
		if r.Error != "" {
			res = r.Error
		}
		rows = append(rows, []string{r.Machine, dash(r.IP), dash(r.How), back, r.Took.String(), res})
	}
	return rows
}
