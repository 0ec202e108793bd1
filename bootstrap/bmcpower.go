package bootstrap

import (
	"context"
	"fmt"
	"time"

	"cozy.dev/cozy/bmc"
	"cozy.dev/cozy/bootstrap/power"
	"cozy.dev/cozy/bootstrap/rack"
	"cozy.dev/cozy/bootstrap/state"
)

// powerAttempts is how many times the bootstrap powers a machine into a
// network boot through its BMC before it reports it: once, and once more
// for firmware that missed the first (a NIC link that came up late).
const powerAttempts = 2

// powerer powers one machine into a network boot through its BMC while
// discover waits for it. A machine without a BMC, or one the state dir
// has seen already (a rerun must not cycle a machine mid-install), is
// left to the person at the rack.
type powerer struct {
	b *run
	m *rack.Machine
	// enabled: the machine has a BMC and the state dir has not seen it.
	enabled  bool
	attempts int
	last     time.Time
	change   bmc.BootChange
	// restoreTried: the fallback's restore was tried, once, whatever
	// came of it (a warning says if it failed).
	restoreTried bool
}

func (b *run) newPowerer(m *rack.Machine) *powerer {
	return &powerer{b: b, m: m, enabled: m.BMC != nil && b.st.Node(m.Hostname).Phase == state.Pending}
}

// power is called while the netboot server has not seen the machine: it
// powers it on at first, cycles it once more after NetbootTimeout, and
// fails when that did not help either.
func (p *powerer) power(ctx context.Context) error {
	if !p.enabled || p.attempts > 0 && time.Since(p.last) < p.b.opts.NetbootTimeout {
		return nil
	}
	if p.attempts == powerAttempts {
		return fmt.Errorf("powered on through its BMC %d times (%s), but it did not netboot within %s each time: check its boot order and that its NIC %s is on the provisioning network (serial console via the BMC)",
			powerAttempts, p.m.BMC.Address, p.b.opts.NetbootTimeout, p.m.MAC)
	}
	p.attempts++
	p.last = time.Now()
	ch, err := power.Netboot(ctx, p.m, bmc.DefaultTimeout)
	if err != nil {
		return fmt.Errorf("power on through its BMC: %w", err)
	}
	p.change = ch
	msg := fmt.Sprintf("powered on through its BMC for a network boot (attempt %d of %d)", p.attempts, powerAttempts)
	if ch.Fallback {
		msg += fmt.Sprintf("; the BMC refused a one-time boot, so network boot is set until the machine netboots, then %s %s again", ch.Previous.Target, ch.Previous.Enabled)
	}
	p.b.opts.Log.Info(msg, "node", p.m.Hostname, "bmc", p.m.BMC.Address)
	p.b.emit(p.m.Hostname, msg)
	return nil
}

// netbooted is called once the netboot server has seen the machine: a
// continuous override set as a fallback is put back now, so that the
// machine boots its disk once installed.
func (p *powerer) netbooted(ctx context.Context) {
	if !p.change.Fallback || p.restoreTried {
		return
	}
	p.restoreTried = true
	if err := power.RestoreBoot(ctx, p.m, p.change.Previous, bmc.DefaultTimeout); err != nil {
		p.b.opts.Log.Warn("could not restore the boot override after the network boot: the machine will netboot every time until it is", "node", p.m.Hostname, "err", err)
		return
	}
	p.b.opts.Log.Info("boot override restored", "node", p.m.Hostname, "target", p.change.Previous.Target, "enabled", p.change.Previous.Enabled)
}

// hint is what the timeout error suggests.
func (p *powerer) hint() string {
	if p.attempts > 0 {
		return fmt.Sprintf("powered on through its BMC %s; is it netbooting on the provisioning network?", p.m.BMC.Address)
	}
	return "is it powered on and netbooting?"
}
