// Package power drives a rack's machines through their BMCs: the use
// cases behind `cozyctl machine` (power, one-time PXE, inventory) and the
// bootstrap's power-on, each run on many machines at once with a bound
// and a per-machine result.
package power

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"

	"cozy.dev/cozy/bmc"
	"cozy.dev/cozy/bootstrap/rack"
)

// Options bound a run over many BMCs.
type Options struct {
	// Parallel is how many BMCs are driven at once (bmc.DefaultParallel).
	Parallel int
	// Timeout bounds each request to a BMC (bmc.DefaultTimeout).
	Timeout time.Duration
	Log     *slog.Logger
}

// Row is one machine's result.
type Row struct {
	Machine   string          `json:"machine"`
	BMC       string          `json:"bmc"`
	Power     bmc.PowerState  `json:"power,omitempty"`
	Boot      *bmc.BootChange `json:"boot,omitempty"`
	Inventory *bmc.Inventory  `json:"inventory,omitempty"`
	Error     string          `json:"error,omitempty"`
}

// Op is what a run does with one machine's BMC, filling its row.
type Op func(ctx context.Context, c bmc.Controller, row *Row) error

// Status reads the power state.
func Status(ctx context.Context, c bmc.Controller, row *Row) error {
	var err error
	row.Power, err = c.PowerState(ctx)
	return err
}

// Act runs a power action and reads the state it left.
func Act(a bmc.Action) Op {
	return func(ctx context.Context, c bmc.Controller, row *Row) error {
		if err := c.Power(ctx, a); err != nil {
			return err
		}
		return Status(ctx, c, row)
	}
}

// BootPXEOnce sets a one-time network boot.
func BootPXEOnce(ctx context.Context, c bmc.Controller, row *Row) error {
	ch, err := c.BootPXEOnce(ctx)
	if err != nil {
		return err
	}
	row.Boot = &ch
	return nil
}

// Inspect reads the hardware inventory.
func Inspect(ctx context.Context, c bmc.Controller, row *Row) error {
	inv, err := c.Inspect(ctx)
	if err != nil {
		return err
	}
	row.Inventory, row.Power = &inv, inv.PowerState
	return nil
}

// Select picks machines by hostname, or every machine with a BMC when
// all is set. Naming a machine without one is an error that says so.
func Select(r *rack.Rack, names []string, all bool) ([]*rack.Machine, error) {
	switch {
	case all && len(names) > 0:
		return nil, fmt.Errorf("give machine names or --all, not both")
	case all:
		var ms []*rack.Machine
		for i := range r.Machines {
			if r.Machines[i].BMC != nil {
				ms = append(ms, &r.Machines[i])
			}
		}
		if len(ms) == 0 {
			return nil, fmt.Errorf("no machine in the rack has a bmc")
		}
		return ms, nil
	case len(names) == 0:
		return nil, fmt.Errorf("name the machines, or give --all")
	}
	var ms []*rack.Machine
	for _, n := range names {
		i := slices.IndexFunc(r.Machines, func(m rack.Machine) bool { return m.Hostname == n })
		switch {
		case i < 0:
			return nil, fmt.Errorf("no machine %q in the rack (it has %s)", n, hostnames(r))
		case r.Machines[i].BMC == nil:
			return nil, fmt.Errorf("machine %s has no bmc in the rack", n)
		}
		ms = append(ms, &r.Machines[i])
	}
	return ms, nil
}

func hostnames(r *rack.Rack) string {
	var hs []string
	for _, m := range r.Machines {
		hs = append(hs, m.Hostname)
	}
	return strings.Join(hs, ", ")
}

// Run does op on every machine's BMC, at most opts.Parallel at once. A
// machine's failure is in its row; the others go on.
func Run(ctx context.Context, ms []*rack.Machine, opts Options, op Op) []Row {
	byName := map[string]*rack.Machine{}
	var names []string
	for _, m := range ms {
		byName[m.Hostname] = m
		names = append(names, m.Hostname)
	}
	results := bmc.Each(ctx, names, opts.Parallel, func(ctx context.Context, name string) (Row, error) {
		m := byName[name]
		row := Row{Machine: name, BMC: m.BMC.Address}
		c, err := dialMachine(ctx, m, opts.Timeout)
		if err != nil {
			return row, err
		}
		defer c.Close()
		return row, op(ctx, c, &row)
	})
	rows := make([]Row, len(results))
	for i, r := range results {
		rows[i] = r.Value
		rows[i].Machine = r.Machine
		if rows[i].BMC == "" {
			rows[i].BMC = byName[r.Machine].BMC.Address
		}
		if r.Err != nil {
			rows[i].Error = r.Err.Error()
			if opts.Log != nil {
				opts.Log.Warn("BMC failed", "machine", r.Machine, "err", r.Err)
			}
		}
	}
	return rows
}

// Failed counts the rows with an error.
func Failed(rows []Row) int {
	n := 0
	for _, r := range rows {
		if r.Error != "" {
			n++
		}
	}
	return n
}

// Netboot makes a machine netboot now through its BMC: a one-time
// network boot, then power on, or a power cycle if it is on (running an
// old system, or stuck). The change says what to restore if the BMC
// could set only a continuous override.
func Netboot(ctx context.Context, m *rack.Machine, timeout time.Duration) (bmc.BootChange, error) {
	c, err := dialMachine(ctx, m, timeout)
	if err != nil {
		return bmc.BootChange{}, err
	}
	defer c.Close()
	ch, err := c.BootPXEOnce(ctx)
	if err != nil {
		return ch, err
	}
	return ch, c.Power(ctx, bmc.Cycle)
}

// RestoreBoot puts back the override a fallback replaced.
func RestoreBoot(ctx context.Context, m *rack.Machine, b bmc.Boot, timeout time.Duration) error {
	c, err := dialMachine(ctx, m, timeout)
	if err != nil {
		return err
	}
	defer c.Close()
	return c.SetBoot(ctx, b)
}

func dialMachine(ctx context.Context, m *rack.Machine, timeout time.Duration) (bmc.Controller, error) {
	target, err := m.BMCTarget()
	if err != nil {
		return nil, err
	}
	target.Timeout = timeout
	return bmc.Dial(ctx, target)
}

// Discover reads the inventory of each BMC at addrs (all with the same
// credentials) and names the machines as `rack init` writes them: the
// first controlPlanes control planes cp1.. (0: three if there are three
// BMCs or more, else one), then workers w1... Each machine's mac is its
// first NIC with a link (else its first NIC). A BMC that fails fails the
// whole: its row says why.
func Discover(ctx context.Context, addrs []string, creds rack.BMC, controlPlanes int, opts Options) ([]rack.FoundMachine, []Row, error) {
	switch {
	case creds.CredentialsFile == "":
		return nil, nil, fmt.Errorf("the BMCs' credentials file is required: username and password, mode 0600")
	case controlPlanes == 0 && len(addrs) >= 3:
		controlPlanes = 3
	case controlPlanes == 0:
		controlPlanes = 1
	case controlPlanes > len(addrs):
		return nil, nil, fmt.Errorf("%d control planes: only %d BMCs given", controlPlanes, len(addrs))
	}
	ms := make([]*rack.Machine, len(addrs))
	index := map[string]int{}
	for i, a := range addrs {
		b := creds
		b.Address = a
		ms[i] = &rack.Machine{Hostname: fmt.Sprintf("bmc%d", i+1), BMC: &b}
		index[ms[i].Hostname] = i
	}
	found := make([]rack.FoundMachine, len(addrs))
	rows := Run(ctx, ms, opts, func(ctx context.Context, c bmc.Controller, row *Row) error {
		if err := Inspect(ctx, c, row); err != nil {
			return err
		}
		b := creds
		b.Address = c.Address().String()
		found[index[row.Machine]] = foundMachine(*row.Inventory, b)
		return nil
	})
	if n := Failed(rows); n > 0 {
		return nil, rows, fmt.Errorf("%d of %d BMCs failed", n, len(rows))
	}
	for i := range found {
		if i < controlPlanes {
			found[i].Hostname, found[i].Role = fmt.Sprintf("cp%d", i+1), rack.RoleControlPlane
		} else {
			found[i].Hostname, found[i].Role = fmt.Sprintf("w%d", i-controlPlanes+1), rack.RoleWorker
		}
	}
	return found, rows, nil
}

func foundMachine(inv bmc.Inventory, b rack.BMC) rack.FoundMachine {
	f := rack.FoundMachine{UUID: strings.ToLower(inv.UUID), BMC: b, NICs: "none", Disks: "none"}
	var nics, disks []string
	for _, n := range inv.NICs {
		nics = append(nics, strings.TrimSpace(n.Name+" "+n.MAC+" "+n.LinkStatus))
		if f.MAC == "" && n.LinkStatus == "LinkUp" {
			f.MAC = n.MAC
		}
	}
	if f.MAC == "" && len(inv.NICs) > 0 {
		f.MAC = inv.NICs[0].MAC
	}
	for _, d := range inv.Disks {
		disks = append(disks, strings.TrimSpace(fmt.Sprintf("%s %d GiB %s", d.Name, d.CapacityBytes>>30, d.Model)))
	}
	if len(nics) > 0 {
		f.NICs = strings.Join(nics, ", ")
	}
	if len(disks) > 0 {
		f.Disks = strings.Join(disks, ", ")
	}
	return f
}

// BootOnce sets a one-time network boot, for a machine that is about to
// reboot by itself (a Talos reset).
func BootOnce(ctx context.Context, m *rack.Machine, timeout time.Duration) (bmc.BootChange, error) {
	c, err := dialMachine(ctx, m, timeout)
	if err != nil {
		return bmc.BootChange{}, err
	}
	defer c.Close()
	return c.BootPXEOnce(ctx)
}
