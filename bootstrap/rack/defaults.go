package rack

import (
	"fmt"
	"net/netip"
	"strings"

	"github.com/siderolabs/talos/pkg/machinery/constants"
	"github.com/siderolabs/talos/pkg/machinery/gendata"
)

// Defaults a rack gets for fields it leaves out. They suit a lab; `cozyctl
// rack init` writes them out.
var (
	DefaultTalosVersion      = strings.TrimSpace(gendata.VersionTag)
	DefaultKubernetesVersion = constants.DefaultKubernetesVersion
	// DefaultBackupsKept is how many scheduled etcd snapshots are kept.
	DefaultBackupsKept = 7
	DefaultFactory     = "https://factory.talos.dev"
	// DefaultExtensions are what the platform needs: DRBD for LINSTOR and
	// ZFS for its ZFS storage pools.
	DefaultExtensions     = []string{"siderolabs/drbd", "siderolabs/zfs"}
	DefaultPodSubnets     = []string{"10.244.0.0/16"}
	DefaultServiceSubnets = []string{"10.96.0.0/16"}
)

const (
	DefaultDNSDomain      = "cozy.local"
	DefaultLeaseTime      = "1h"
	DefaultStorageBackend = "lvm-thin"
	DefaultBondMode       = "802.3ad"
	DefaultGitBranch      = "main"
	// APIPort is the Kubernetes API port on control planes and the VIP.
	APIPort = 6443
)

func (r *Rack) setDefaults() {
	c := &r.Cluster
	if c.KubernetesVersion == "" {
		c.KubernetesVersion = DefaultKubernetesVersion
	}
	c.KubernetesVersion = strings.TrimPrefix(c.KubernetesVersion, "v")
	if c.PodSubnets == nil {
		c.PodSubnets = DefaultPodSubnets
	}
	if c.ServiceSubnets == nil {
		c.ServiceSubnets = DefaultServiceSubnets
	}
	if c.DNSDomain == "" {
		c.DNSDomain = DefaultDNSDomain
	}
	if c.AllowSchedulingOnControlPlanes == nil {
		c.AllowSchedulingOnControlPlanes = new(true)
	}
	if c.CNI == "" {
		c.CNI = CNINone
	}

	if b := &r.Etcd.Backups; b.Every != "" && b.Keep == 0 {
		b.Keep = DefaultBackupsKept
	}

	t := &r.Talos
	if t.Version == "" {
		t.Version = DefaultTalosVersion
	}
	if !strings.HasPrefix(t.Version, "v") {
		t.Version = "v" + t.Version
	}
	if t.Factory == "" {
		t.Factory = DefaultFactory
	}
	t.Factory = strings.TrimSuffix(t.Factory, "/")
	if t.Schematic.ID == "" && t.Schematic.Extensions == nil {
		t.Schematic.Extensions = DefaultExtensions
	}

	d := &r.Network.DHCP
	if d.Mode == "" {
		d.Mode = DHCPModeProxy
	}
	if d.LeaseTime == "" {
		d.LeaseTime = DefaultLeaseTime
	}

	for i := range r.Machines {
		m := &r.Machines[i]
		if m.Role == "" {
			m.Role = RoleWorker
		}
		m.MAC = strings.ToLower(m.MAC)
		m.UUID = strings.ToLower(m.UUID)
		for j := range m.Interfaces {
			in := &m.Interfaces[j]
			in.MAC = strings.ToLower(in.MAC)
			if in.Name == "" && in.MAC != "" {
				in.Name = fmt.Sprintf("net%d", j)
			}
			if in.Bond != nil && in.Bond.Mode == "" {
				in.Bond.Mode = DefaultBondMode
			}
		}
	}
	for i := range r.Patches {
		if r.Patches[i].Target == "" {
			r.Patches[i].Target = "all"
		}
	}
	if c.Endpoint == "" {
		if host := r.defaultEndpointHost(); host.IsValid() {
			c.Endpoint = fmt.Sprintf("https://%s", netip.AddrPortFrom(host, APIPort))
		}
	}

	p := &r.Platform
	if p.Storage.Backend == "" {
		p.Storage.Backend = DefaultStorageBackend
	}
	if p.Git.Branch == "" {
		p.Git.Branch = DefaultGitBranch
	}
	if p.Git.Path == "" && r.Metadata.Name != "" {
		p.Git.Path = "clusters/" + r.Metadata.Name
	}
}

// defaultEndpointHost is the VIP, or the first control plane's first
// static address.
func (r *Rack) defaultEndpointHost() netip.Addr {
	if a, err := netip.ParseAddr(r.Cluster.VIP); err == nil {
		return a
	}
	for _, m := range r.Machines {
		if m.Role != RoleControlPlane {
			continue
		}
		if a := m.StaticAddress(); a.IsValid() {
			return a
		}
		return netip.Addr{}
	}
	return netip.Addr{}
}

// StaticAddress is the machine's first static address (interfaces, then
// VLANs), or the zero Addr when it has none.
func (m *Machine) StaticAddress() netip.Addr {
	for _, in := range m.Interfaces {
		for _, a := range in.Addresses {
			if p, err := netip.ParsePrefix(a); err == nil {
				return p.Addr()
			}
		}
	}
	for _, in := range m.Interfaces {
		for _, v := range in.VLANs {
			for _, a := range v.Addresses {
				if p, err := netip.ParsePrefix(a); err == nil {
					return p.Addr()
				}
			}
		}
	}
	return netip.Addr{}
}

// ControlPlanes and Workers return the machines of each role, in file order.
func (r *Rack) ControlPlanes() []Machine { return r.byRole(RoleControlPlane) }
func (r *Rack) Workers() []Machine       { return r.byRole(RoleWorker) }

func (r *Rack) byRole(role string) []Machine {
	var out []Machine
	for _, m := range r.Machines {
		if m.Role == role {
			out = append(out, m)
		}
	}
	return out
}
