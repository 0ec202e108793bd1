// Package netboot derives the netboot server's settings from a rack file:
// which interface and DHCP mode, the pool, the gateway and DNS, fixed
// addresses for machines with a static address on the provisioning
// network, and which machines to boot. `cozyctl pxe serve --rack` and
// `cozyctl bootstrap` both use it.
package netboot

import (
	"cmp"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"time"

	"cozy.dev/cozy/bootstrap/rack"
	"cozy.dev/cozy/pxe"
	"cozy.dev/cozy/pxe/lease"
)

// Config returns the pxe.Config fields the rack decides. Boot files,
// ports and the state dir are the caller's.
func Config(r *rack.Rack) (pxe.Config, error) {
	n := r.Network
	cfg := pxe.Config{
		Interface: n.Interface,
		Mode:      n.DHCP.Mode,
		Talos:     true,
	}
	var err error
	if cfg.LeaseTime, err = time.ParseDuration(n.DHCP.LeaseTime); err != nil {
		return cfg, fmt.Errorf("network.dhcp.leaseTime: %w", err)
	}
	subnet, err := netip.ParsePrefix(n.Subnet)
	if err != nil {
		return cfg, fmt.Errorf("network.subnet: %w", err)
	}
	if n.DHCP.Mode == rack.DHCPModeFull {
		local := pxe.Network{Subnet: subnet, DNS: ipv4s(n.DNS)}
		if local.Pool, err = lease.ParsePool(n.DHCP.Range); err != nil {
			return cfg, fmt.Errorf("network.dhcp.range: %w", err)
		}
		if n.Gateway != "" {
			local.Gateway = netip.MustParseAddr(n.Gateway)
		}
		cfg.Networks = append(cfg.Networks, local)
		for i, p := range n.DHCP.Relayed {
			nw := pxe.Network{DNS: ipv4s(p.DNS)}
			if nw.Subnet, err = netip.ParsePrefix(p.Subnet); err != nil {
				return cfg, fmt.Errorf("network.dhcp.relayed[%d].subnet: %w", i, err)
			}
			if nw.Pool, err = lease.ParsePool(p.Range); err != nil {
				return cfg, fmt.Errorf("network.dhcp.relayed[%d].range: %w", i, err)
			}
			if p.Gateway != "" {
				if nw.Gateway, err = netip.ParseAddr(p.Gateway); err != nil {
					return cfg, fmt.Errorf("network.dhcp.relayed[%d].gateway: %w", i, err)
				}
			}
			cfg.Networks = append(cfg.Networks, nw)
		}
	}
	// The networks the server leases on (full mode only).
	var networks []netip.Prefix
	for _, nw := range cfg.Networks {
		networks = append(networks, nw.Subnet)
	}
	for _, m := range r.Machines {
		if m.IPXE == rack.IPXESNPOnly {
			cfg.SNPOnly = append(cfg.SNPOnly, cmp.Or(m.MAC, m.UUID))
		}
		if m.MAC == "" {
			continue // found by UUID: only --allow-unknown boots it
		}
		hw, err := net.ParseMAC(m.MAC)
		if err != nil {
			return cfg, fmt.Errorf("machine %s: %w", m.Hostname, err)
		}
		cfg.AllowMACs = append(cfg.AllowMACs, hw)
		// A machine keeps in maintenance mode the address it will have
		// once configured, so discovery finds it where the rack says.
		if a := provisioningAddress(&m, networks); a.IsValid() {
			if cfg.Reservations == nil {
				cfg.Reservations = map[string]netip.Addr{}
			}
			cfg.Reservations[hw.String()] = a
		}
	}
	return cfg, nil
}

// NeedsUnknown reports whether some machine is known only by its UUID, so
// the server must boot unknown MACs for it to be found.
func NeedsUnknown(r *rack.Rack) bool {
	for _, m := range r.Machines {
		if m.MAC == "" {
			return true
		}
	}
	return false
}

// CheckBoot says what a netboot server cfg for rack r still lacks: leave
// to boot machines known only by UUID, or the Talos kernel and initramfs
// (with the Image Factory URLs to fetch them from).
func CheckBoot(r *rack.Rack, cfg pxe.Config) error {
	if NeedsUnknown(r) && !cfg.AllowUnknown {
		return errors.New("some machines of the rack have only a uuid: add --allow-unknown so they can netboot and be found")
	}
	if cfg.Kernel == "" || len(cfg.Initrds) == 0 {
		kernel, _ := r.BootAssetURL("kernel-amd64")
		initrd, _ := r.BootAssetURL("initramfs-amd64.xz")
		return fmt.Errorf("give the Talos kernel and initramfs of the rack's schematic with --kernel and --initrd; download them from\n  %s\n  %s\n(arm64 machines: --kernel-arm64 and --initrd-arm64, from the same URLs with arm64)", kernel, initrd)
	}
	return nil
}

// provisioningAddress is the machine's static address on the NIC it
// netboots from, when that address is on a network the server leases on
// (the provisioning subnet, or one behind a relay).
func provisioningAddress(m *rack.Machine, networks []netip.Prefix) netip.Addr {
	for _, in := range m.Interfaces {
		if in.MAC != m.MAC && !(in.Bond != nil && contains(in.Bond.MACs, m.MAC)) {
			continue
		}
		for _, s := range in.Addresses {
			p, err := netip.ParsePrefix(s)
			if err != nil {
				continue
			}
			for _, n := range networks {
				if n.Contains(p.Addr()) {
					return p.Addr()
				}
			}
		}
	}
	return netip.Addr{}
}

// ipv4s are the IPv4 addresses among list (the rack allows IPv6 DNS
// servers too; DHCPv4 cannot hand them out).
func ipv4s(list []string) []netip.Addr {
	var out []netip.Addr
	for _, d := range list {
		if a, err := netip.ParseAddr(d); err == nil && a.Is4() {
			out = append(out, a)
		}
	}
	return out
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}
