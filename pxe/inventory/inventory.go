// Package inventory records the machines the netboot server has seen and
// how far each got in booting, so people and `cozyctl bootstrap` can tell
// which servers are up. It is kept in memory and flushed to a JSON file in
// the server's state directory, which `cozyctl pxe machines` reads.
package inventory

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"cozy.dev/cozy/internal/atomicfile"
)

// Phase is how far a machine got, in boot order.
type Phase string

// Phases, in the order a netbooting machine passes them.
const (
	PhaseDHCP       Phase = "dhcp"        // answered by DHCP
	PhaseIPXEBinary Phase = "ipxe-binary" // iPXE sent over TFTP or HTTP
	PhaseIPXEScript Phase = "ipxe-script" // iPXE fetched its script
	PhaseKernel     Phase = "kernel"      // kernel downloaded
	PhaseInitrd     Phase = "initrd"      // initramfs downloaded: next, the kernel runs
	PhaseConfig     Phase = "config"      // the booted OS fetched its machine config
)

// Machine is what the server knows of one machine.
type Machine struct {
	MAC         string     `json:"mac"`
	UUID        string     `json:"uuid,omitempty"`
	Arch        string     `json:"arch,omitempty"`     // amd64, arm64
	Firmware    string     `json:"firmware,omitempty"` // bios, uefi
	IP          netip.Addr `json:"ip,omitzero"`
	VendorClass string     `json:"vendorClass,omitempty"`
	Phase       Phase      `json:"phase"`
	// Allowed is whether the server boots it (rack file, --allow-mac or
	// --allow-unknown); machines it ignores are listed too.
	Allowed bool `json:"allowed"`
	// Installed: a boot of this machine fetched its config (so the OS
	// installed itself) and the machine has booted again since.
	Installed bool      `json:"installed"`
	FirstSeen time.Time `json:"firstSeen"`
	LastSeen  time.Time `json:"lastSeen"`
}

// DHCPSighting is what a DHCP request tells about a machine.
type DHCPSighting struct {
	MAC, UUID, Arch, Firmware, VendorClass string
	IP                                     netip.Addr // zero if unknown
	Allowed                                bool
	// Answered: the server replied with boot information.
	Answered bool
	// IPXE: the request came from iPXE, not from the firmware.
	IPXE bool
}

// Inventory is the set of machines seen.
type Inventory struct {
	path string
	now  func() time.Time

	mu       sync.Mutex
	machines map[string]*Machine
	byIP     map[netip.Addr]string
	dirty    bool
}

// File is the inventory's file name in the state directory.
const File = "machines.json"

// Open loads the inventory kept in dir, if any, so machines seen before a
// restart stay listed.
func Open(dir string, now func() time.Time) (*Inventory, error) {
	if now == nil {
		now = time.Now
	}
	inv := &Inventory{path: filepath.Join(dir, File), now: now, machines: map[string]*Machine{}, byIP: map[netip.Addr]string{}}
	// What a crash during a flush left behind.
	temps, _ := filepath.Glob(filepath.Join(dir, "."+File+".tmp*"))
	for _, t := range temps {
		os.Remove(t)
	}
	list, err := Load(dir)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	for i := range list {
		m := list[i]
		inv.machines[m.MAC] = &m
		if m.IP.IsValid() {
			inv.byIP[m.IP] = m.MAC
		}
	}
	return inv, nil
}

// Load reads the machines a server recorded in dir, sorted by MAC.
func Load(dir string) ([]Machine, error) {
	data, err := os.ReadFile(filepath.Join(dir, File))
	if err != nil {
		return nil, err
	}
	var list []Machine
	if err := json.Unmarshal(data, &list); err != nil {
		return nil, fmt.Errorf("%s: %w", filepath.Join(dir, File), err)
	}
	return list, nil
}

func (inv *Inventory) get(mac string) *Machine {
	m := inv.machines[mac]
	if m == nil {
		m = &Machine{MAC: mac, FirstSeen: inv.now().UTC()}
		inv.machines[mac] = m
	}
	m.LastSeen = inv.now().UTC()
	inv.dirty = true
	return m
}

func (inv *Inventory) setIP(m *Machine, ip netip.Addr) {
	if !ip.IsValid() || ip == m.IP {
		return
	}
	if m.IP.IsValid() && inv.byIP[m.IP] == m.MAC {
		delete(inv.byIP, m.IP)
	}
	m.IP = ip
	inv.byIP[ip] = m.MAC
}

// SawDHCP records a DHCP request. A machine that asks DHCP again is
// (re)booting, so its phase starts over.
func (inv *Inventory) SawDHCP(s DHCPSighting) {
	inv.mu.Lock()
	defer inv.mu.Unlock()
	m := inv.get(s.MAC)
	for dst, v := range map[*string]string{&m.UUID: s.UUID, &m.Arch: s.Arch, &m.Firmware: s.Firmware, &m.VendorClass: s.VendorClass} {
		if v != "" {
			*dst = v
		}
	}
	m.Allowed = s.Allowed
	inv.setIP(m, s.IP)
	if !s.Answered {
		return
	}
	// The firmware asking is a new boot. iPXE asking is one too, unless it
	// is the iPXE this boot just loaded (it asks right after ipxe-binary).
	switch m.Phase {
	case PhaseIPXEBinary, PhaseIPXEScript:
		if !s.IPXE {
			m.Phase = PhaseDHCP
		}
	default:
		if m.Phase == PhaseConfig {
			m.Installed = true
		}
		m.Phase = PhaseDHCP
	}
}

var order = map[Phase]int{"": 0, PhaseDHCP: 1, PhaseIPXEBinary: 2, PhaseIPXEScript: 3, PhaseKernel: 4, PhaseInitrd: 5, PhaseConfig: 6}

// Advance records that the machine with mac (or, if mac is empty, the one
// at ip) reached phase. Phases only move forward: a download repeated
// later in the same boot does not undo progress; only DHCP starts a new
// boot. It returns false when the machine is unknown.
func (inv *Inventory) Advance(mac string, ip netip.Addr, phase Phase) bool {
	inv.mu.Lock()
	defer inv.mu.Unlock()
	if mac == "" {
		mac = inv.byIP[ip]
	}
	if mac == "" {
		return false
	}
	m := inv.get(mac)
	inv.setIP(m, ip)
	if order[phase] > order[m.Phase] {
		m.Phase = phase
	}
	return true
}

// MACAt returns the MAC of the machine last seen at ip.
func (inv *Inventory) MACAt(ip netip.Addr) (string, bool) {
	inv.mu.Lock()
	defer inv.mu.Unlock()
	mac, ok := inv.byIP[ip]
	return mac, ok
}

// Get returns one machine.
func (inv *Inventory) Get(mac string) (Machine, bool) {
	inv.mu.Lock()
	defer inv.mu.Unlock()
	m, ok := inv.machines[mac]
	if !ok {
		return Machine{}, false
	}
	return *m, true
}

// List returns every machine, sorted by MAC.
func (inv *Inventory) List() []Machine {
	inv.mu.Lock()
	defer inv.mu.Unlock()
	return inv.listLocked()
}

func (inv *Inventory) listLocked() []Machine {
	out := make([]Machine, 0, len(inv.machines))
	for _, m := range inv.machines {
		out = append(out, *m)
	}
	slices.SortFunc(out, func(a, b Machine) int {
		if a.MAC < b.MAC {
			return -1
		}
		if a.MAC > b.MAC {
			return 1
		}
		return 0
	})
	return out
}

// Flush writes the inventory file if anything changed, crash-safely.
func (inv *Inventory) Flush() error {
	inv.mu.Lock()
	if !inv.dirty {
		inv.mu.Unlock()
		return nil
	}
	data, err := json.MarshalIndent(inv.listLocked(), "", "  ")
	inv.dirty = false
	inv.mu.Unlock()
	if err != nil {
		return err
	}
	// Synced before it replaces the old file: after a crash the list is
	// the last one flushed, never empty or torn.
	if err := atomicfile.Write(inv.path, append(data, '\n'), 0o644); err != nil {
		return fmt.Errorf("write inventory: %w", err)
	}
	return nil
}

// Run flushes every interval until ctx ends, then once more.
func (inv *Inventory) Run(ctx context.Context, interval time.Duration) error {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return inv.Flush()
		case <-t.C:
			if err := inv.Flush(); err != nil {
				return err
			}
		}
	}
}
