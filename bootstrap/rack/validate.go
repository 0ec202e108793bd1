package rack

import (
	"fmt"
	"maps"
	"net"
	"net/netip"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/siderolabs/talos/pkg/machinery/api/machine"
	"github.com/siderolabs/talos/pkg/machinery/compatibility"
	"github.com/siderolabs/talos/pkg/machinery/config"
	"github.com/siderolabs/talos/pkg/machinery/config/types/v1alpha1"

	"cozy.dev/cozy/internal/imageref"
)

// MinTalosVersion is the oldest Talos a rack may ask for: the first with
// the multi-document network config Cozy generates.
const MinTalosVersion = "v1.12.0"

var (
	dnsLabel   = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$`)
	hexID      = regexp.MustCompile(`^[0-9a-f]{64}$`)
	extension  = regexp.MustCompile(`^[a-z0-9-]+/[a-z0-9][a-z0-9._-]*$`)
	uuidRE     = regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$`)
	linkName   = regexp.MustCompile(`^[a-zA-Z0-9][a-zA-Z0-9._-]{0,14}$`)
	bondModes  = []string{"balance-rr", "active-backup", "balance-xor", "broadcast", "802.3ad", "balance-tlb", "balance-alb"}
	diskTypes  = []string{"ssd", "hdd", "nvme", "sd"}
	roles      = []string{RoleControlPlane, RoleWorker}
	dhcpModes  = []string{DHCPModeProxy, DHCPModeFull}
	ipxeBuilds = []string{IPXEDefault, IPXESNPOnly}
	targets    = []string{"all", RoleControlPlane, RoleWorker}
	backends   = []string{"lvm-thin", "zfs"}
	listOf     = func(s []string) string { return strings.Join(s, ", ") }
	errorf     = func(path, format string, a ...any) Problem {
		return Problem{Path: path, Message: fmt.Sprintf(format, a...)}
	}
)

// validate checks a defaulted rack; every problem names its field.
func (r *Rack) validate() []Problem {
	var ps []Problem
	add := func(p Problem) { ps = append(ps, p) }

	if r.APIVersion != APIVersion {
		add(errorf("apiVersion", "must be %q, not %q", APIVersion, r.APIVersion))
	}
	if r.Kind != Kind {
		add(errorf("kind", "must be %q, not %q", Kind, r.Kind))
	}
	switch {
	case r.Metadata.Name == "":
		add(errorf("metadata.name", "required: the cluster's name"))
	case !dnsLabel.MatchString(r.Metadata.Name):
		add(errorf("metadata.name", "%q must be a DNS label: lower-case letters, digits and '-', at most 63", r.Metadata.Name))
	}

	ps = append(ps, r.validateVersions()...)
	ps = append(ps, r.validateCluster()...)
	ps = append(ps, r.validateNetwork()...)
	ps = append(ps, r.validateMachines()...)

	ps = append(ps, r.validateRegistries()...)
	for i, p := range r.Patches {
		if !slices.Contains(targets, p.Target) {
			add(errorf(fmt.Sprintf("patches[%d].target", i), "%q is not one of %s", p.Target, listOf(targets)))
		}
	}

	pl := r.Platform
	for i, a := range pl.LoadBalancerPool {
		if _, err := parseRangeOrPrefix(a); err != nil {
			add(errorf(fmt.Sprintf("platform.loadBalancerPool[%d]", i), "%v", err))
		}
	}
	if !slices.Contains(backends, pl.Storage.Backend) {
		add(errorf("platform.storage.backend", "%q is not one of %s", pl.Storage.Backend, listOf(backends)))
	}
	for i, d := range pl.Storage.Devices {
		if !strings.HasPrefix(d, "/dev/") {
			add(errorf(fmt.Sprintf("platform.storage.devices[%d]", i), "%q is not a device path under /dev/", d))
		}
	}
	if b := r.Etcd.Backups; b.Every != "" || b.Keep != 0 {
		if d, err := time.ParseDuration(b.Every); err != nil || d < time.Minute {
			add(errorf("etcd.backups.every", "%q is not a duration of at least 1m, such as 6h", b.Every))
		}
		if b.Keep < 1 {
			add(errorf("etcd.backups.keep", "%d: keep at least 1 snapshot", b.Keep))
		}
	}
	if pl.Mirror != "" {
		if _, err := ParseChartMirror(pl.Mirror); err != nil {
			add(errorf("platform.mirror", "%v", err))
		}
	}
	if pl.Git.URL != "" {
		if u, err := url.Parse(pl.Git.URL); err != nil || u.Scheme == "" || (u.Host == "" && u.Scheme != "file") {
			add(errorf("platform.git.url", "%q is not a Git URL (https://, ssh:// or file://)", pl.Git.URL))
		}
	}
	return ps
}

func (r *Rack) validateRegistries() []Problem {
	var ps []Problem
	reg := r.Registries
	if reg.Mirror != "" {
		if !imageref.IsMirrorURL(reg.Mirror) {
			ps = append(ps, errorf("registries.mirror", "%q is not a registry's base URL such as http://10.0.0.1:5000 (http or https, a host, no path: images are under /v2/<upstream host>/...)", reg.Mirror))
		}
	}
	covered := map[string]bool{}
	if reg.Mirror != "" {
		for _, h := range r.MirrorHosts() {
			covered[h] = true
		}
	}
	hosts := slices.Sorted(maps.Keys(reg.Mirrors))
	for _, host := range hosts {
		eps := reg.Mirrors[host]
		path := "registries.mirrors." + host
		for _, p := range imageref.CheckRegistryHost(host) {
			ps = append(ps, errorf(path, "%s", p))
		}
		if covered[host] {
			ps = append(ps, errorf(path, "%s is already mirrored by registries.mirror (%s); keep one of the two", host, reg.Mirror))
		}
		if len(eps) == 0 {
			ps = append(ps, errorf(path, "needs at least one mirror endpoint URL"))
		}
		for i, ep := range eps {
			if !imageref.IsEndpointURL(ep) {
				ps = append(ps, errorf(fmt.Sprintf("%s[%d]", path, i), "%q is not an http(s) URL with a host", ep))
			}
		}
	}
	return ps
}

// MirrorHosts are the registry hosts registries.mirror stands in for:
// those of imageref.MirrorHosts and the installer image's. (Talos config
// generation adds the hosts of any other image the configs name.) Empty
// without registries.mirror.
func (r *Rack) MirrorHosts() []string {
	if r.Registries.Mirror == "" {
		return nil
	}
	hosts := slices.Clone(imageref.MirrorHosts)
	if img, err := r.InstallImage(); err == nil {
		if ref, err := imageref.Parse(img); err == nil {
			hosts = append(hosts, ref.Host)
		}
	}
	slices.Sort(hosts)
	return slices.Compact(hosts)
}

func (r *Rack) validateVersions() []Problem {
	var ps []Problem
	t := r.Talos
	contract, err := config.ParseContractFromVersion(t.Version)
	minimum, _ := config.ParseContractFromVersion(MinTalosVersion)
	switch {
	case err != nil:
		ps = append(ps, errorf("talos.version", "%q is not a Talos version such as %s", t.Version, DefaultTalosVersion))
	case !contract.Greater(minimum) && *contract != *minimum:
		ps = append(ps, errorf("talos.version", "%s is older than %s, the oldest Talos Cozy generates configs for", t.Version, MinTalosVersion))
	case contract.Greater(config.TalosVersionCurrent):
		ps = append(ps, errorf("talos.version", "%s is newer than this cozyctl knows (%s); upgrade cozyctl", t.Version, DefaultTalosVersion))
	default:
		tv, terr := compatibility.ParseTalosVersion(&machine.VersionInfo{Tag: t.Version})
		kv, kerr := compatibility.ParseKubernetesVersion(r.Cluster.KubernetesVersion)
		switch {
		case terr != nil:
			ps = append(ps, errorf("talos.version", "%v", terr))
		case kerr != nil:
			ps = append(ps, errorf("cluster.kubernetesVersion", "%q is not a Kubernetes version such as %s", r.Cluster.KubernetesVersion, DefaultKubernetesVersion))
		default:
			if err := kv.SupportedWith(tv); err != nil {
				ps = append(ps, errorf("cluster.kubernetesVersion", "%s does not run on Talos %s: %v", r.Cluster.KubernetesVersion, t.Version, err))
			}
		}
	}
	if u, err := url.Parse(t.Factory); err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" || (u.Path != "" && u.Path != "/") {
		ps = append(ps, errorf("talos.factory", "%q is not an Image Factory URL such as %s", t.Factory, DefaultFactory))
	}
	s := t.Schematic
	switch {
	case s.ID != "" && (len(s.Extensions) > 0 || len(s.ExtraKernelArgs) > 0):
		ps = append(ps, errorf("talos.schematic", "set either id or extensions/extraKernelArgs, not both"))
	case s.ID != "" && !hexID.MatchString(s.ID):
		ps = append(ps, errorf("talos.schematic.id", "%q is not a schematic ID (64 lower-case hex digits)", s.ID))
	}
	for i, e := range s.Extensions {
		if !extension.MatchString(e) {
			ps = append(ps, errorf(fmt.Sprintf("talos.schematic.extensions[%d]", i), "%q is not an official extension name such as siderolabs/drbd", e))
		}
	}
	return ps
}

func (r *Rack) validateCluster() []Problem {
	var ps []Problem
	c := r.Cluster
	if c.Endpoint == "" {
		ps = append(ps, errorf("cluster.endpoint", "required when there is no cluster.vip and the first control plane has no static address"))
	} else if u, err := url.Parse(c.Endpoint); err != nil || u.Scheme != "https" || u.Hostname() == "" || (u.Path != "" && u.Path != "/") {
		ps = append(ps, errorf("cluster.endpoint", "%q must be an https URL such as https://192.168.100.10:6443", c.Endpoint))
	}
	if c.VIP != "" {
		vip, err := netip.ParseAddr(c.VIP)
		switch {
		case err != nil || !vip.Is4() && !vip.Is6():
			ps = append(ps, errorf("cluster.vip", "%q is not an IP address", c.VIP))
		case r.vipLink(vip) == "" && len(r.ControlPlanes()) > 0:
			ps = append(ps, errorf("cluster.vip", "%s is not in the subnet of any control plane's interface or of network.subnet", vip))
		default:
			for i, m := range r.Machines {
				if m.Role == RoleControlPlane && r.VIPLink(&m) == "" {
					ps = append(ps, errorf(fmt.Sprintf("machines[%d]", i), "cannot carry the VIP %s: give it a mac, or an interface with an address in the VIP's subnet", vip))
				}
			}
		}
	}
	var all []netip.Prefix
	subnets := func(field string, list []string) {
		if len(list) == 0 {
			ps = append(ps, errorf(field, "needs at least one CIDR"))
		}
		for i, s := range list {
			p, err := netip.ParsePrefix(s)
			path := fmt.Sprintf("%s[%d]", field, i)
			if err != nil || p != p.Masked() {
				ps = append(ps, errorf(path, "%q is not a network CIDR such as 10.244.0.0/16", s))
				continue
			}
			for _, q := range all {
				if p.Overlaps(q) {
					ps = append(ps, errorf(path, "%s overlaps %s", p, q))
				}
			}
			all = append(all, p)
		}
	}
	subnets("cluster.podSubnets", c.PodSubnets)
	subnets("cluster.serviceSubnets", c.ServiceSubnets)
	if n, err := netip.ParsePrefix(r.Network.Subnet); err == nil {
		for _, q := range all {
			if n.Overlaps(q) {
				ps = append(ps, errorf("network.subnet", "%s overlaps the cluster's pod or service subnet %s", n, q))
			}
		}
	}
	if c.CNI != CNINone && c.CNI != CNIFlannel {
		ps = append(ps, errorf("cluster.cni", "%q: use %s (the platform brings Kube-OVN and Cilium) or %s (Talos's flannel, with kube-proxy)", c.CNI, CNINone, CNIFlannel))
	}
	if !strings.Contains(c.DNSDomain, ".") && !dnsLabel.MatchString(c.DNSDomain) || strings.HasSuffix(c.DNSDomain, ".") {
		ps = append(ps, errorf("cluster.dnsDomain", "%q is not a DNS domain such as %s", c.DNSDomain, DefaultDNSDomain))
	}
	for _, label := range strings.Split(c.DNSDomain, ".") {
		if !dnsLabel.MatchString(label) {
			ps = append(ps, errorf("cluster.dnsDomain", "%q is not a DNS domain such as %s", c.DNSDomain, DefaultDNSDomain))
			break
		}
	}
	return ps
}

func (r *Rack) validateNetwork() []Problem {
	var ps []Problem
	n := r.Network
	if n.Interface == "" {
		ps = append(ps, errorf("network.interface", "required: the netboot server's interface on the provisioning network"))
	}
	subnet, err := netip.ParsePrefix(n.Subnet)
	if err != nil || !subnet.Addr().Is4() || subnet != subnet.Masked() {
		ps = append(ps, errorf("network.subnet", "%q is not an IPv4 network CIDR such as 192.168.100.0/24", n.Subnet))
		subnet = netip.Prefix{}
	}
	inSubnet := func(path, s string) {
		a, err := netip.ParseAddr(s)
		switch {
		case err != nil || !a.Is4():
			ps = append(ps, errorf(path, "%q is not an IPv4 address", s))
		case subnet.IsValid() && !subnet.Contains(a):
			ps = append(ps, errorf(path, "%s is outside network.subnet %s", a, subnet))
		}
	}
	if n.Gateway != "" {
		inSubnet("network.gateway", n.Gateway)
	}
	for i, d := range n.DNS {
		if _, err := netip.ParseAddr(d); err != nil {
			ps = append(ps, errorf(fmt.Sprintf("network.dns[%d]", i), "%q is not an IP address", d))
		}
	}
	d := n.DHCP
	if !slices.Contains(dhcpModes, d.Mode) {
		ps = append(ps, errorf("network.dhcp.mode", "%q is not one of %s", d.Mode, listOf(dhcpModes)))
	}
	switch {
	case d.Range == "" && d.Mode == DHCPModeFull:
		ps = append(ps, errorf("network.dhcp.range", "required in full mode: the FROM-TO addresses to lease"))
	case d.Range != "":
		ps = append(ps, validateRange("network.dhcp.range", d.Range, subnet, "network.subnet")...)
	}
	if lt, err := time.ParseDuration(d.LeaseTime); err != nil || lt < time.Minute {
		ps = append(ps, errorf("network.dhcp.leaseTime", "%q is not a duration of at least 1m, such as 1h", d.LeaseTime))
	}
	if len(d.Relayed) > 0 && d.Mode != DHCPModeFull {
		ps = append(ps, errorf("network.dhcp.relayed", "pools behind relays are leased in full mode only: set network.dhcp.mode to full"))
	}
	networks := []netip.Prefix{subnet}
	for i, p := range d.Relayed {
		path := fmt.Sprintf("network.dhcp.relayed[%d]", i)
		sub, err := netip.ParsePrefix(p.Subnet)
		if err != nil || !sub.Addr().Is4() || sub != sub.Masked() {
			ps = append(ps, errorf(path+".subnet", "%q is not an IPv4 network CIDR such as 10.80.1.0/24", p.Subnet))
			continue
		}
		if j := slices.IndexFunc(networks, func(o netip.Prefix) bool { return o.IsValid() && o.Overlaps(sub) }); j >= 0 {
			ps = append(ps, errorf(path+".subnet", "%s overlaps %s: each address must belong to one pool", sub, networks[j]))
		}
		networks = append(networks, sub)
		if p.Range == "" {
			ps = append(ps, errorf(path+".range", "required: the FROM-TO addresses to lease on %s", sub))
		} else {
			ps = append(ps, validateRange(path+".range", p.Range, sub, path+".subnet")...)
		}
		if p.Gateway != "" {
			if a, err := netip.ParseAddr(p.Gateway); err != nil || !a.Is4() || !sub.Contains(a) {
				ps = append(ps, errorf(path+".gateway", "%q is not an IPv4 address in %s", p.Gateway, sub))
			}
		}
		for j, dns := range p.DNS {
			if a, err := netip.ParseAddr(dns); err != nil || !a.Is4() {
				ps = append(ps, errorf(fmt.Sprintf("%s.dns[%d]", path, j), "%q is not an IPv4 address", dns))
			}
		}
	}
	return ps
}

// validateRange checks a FROM-TO pool at path against its network
// (named subnetPath in messages).
func validateRange(path, r string, subnet netip.Prefix, subnetPath string) []Problem {
	from, to, ok := strings.Cut(r, "-")
	a, aerr := netip.ParseAddr(strings.TrimSpace(from))
	b, berr := netip.ParseAddr(strings.TrimSpace(to))
	switch {
	case !ok || aerr != nil || berr != nil || !a.Is4() || !b.Is4():
		return []Problem{errorf(path, "%q is not FROM-TO, e.g. 192.168.100.100-192.168.100.199", r)}
	case b.Less(a):
		return []Problem{errorf(path, "%s comes after %s", a, b)}
	case subnet.IsValid() && (!subnet.Contains(a) || !subnet.Contains(b)):
		return []Problem{errorf(path, "%s is not inside %s %s", r, subnetPath, subnet)}
	}
	return nil
}

func (r *Rack) validateMachines() []Problem {
	var ps []Problem
	if len(r.Machines) == 0 {
		return append(ps, errorf("machines", "a rack needs at least one machine"))
	}
	if len(r.ControlPlanes()) == 0 {
		ps = append(ps, errorf("machines", "no machine has role controlplane; a cluster needs one (or three for high availability)"))
	}
	seen := map[string]string{} // "kind value" -> first path
	unique := func(path, kind, value string) {
		if value == "" {
			return
		}
		key := kind + " " + value
		if first, ok := seen[key]; ok {
			ps = append(ps, errorf(path, "%s %s is also used by %s", kind, value, first))
			return
		}
		seen[key] = path
	}
	for i, m := range r.Machines {
		path := fmt.Sprintf("machines[%d]", i)
		switch {
		case m.Hostname == "":
			ps = append(ps, errorf(path+".hostname", "required"))
		case !dnsLabel.MatchString(m.Hostname):
			ps = append(ps, errorf(path+".hostname", "%q must be a DNS label: lower-case letters, digits and '-'", m.Hostname))
		}
		unique(path+".hostname", "hostname", m.Hostname)
		if !slices.Contains(roles, m.Role) {
			ps = append(ps, errorf(path+".role", "%q is not one of %s", m.Role, listOf(roles)))
		}
		if m.MAC == "" && m.UUID == "" {
			ps = append(ps, errorf(path, "needs mac or uuid to be recognised when it netboots"))
		}
		if m.MAC != "" {
			if !isMAC(m.MAC) {
				ps = append(ps, errorf(path+".mac", "%q is not a MAC address such as 52:54:00:12:34:56", m.MAC))
			}
			unique(path+".mac", "MAC", m.MAC)
		}
		if m.UUID != "" {
			if !uuidRE.MatchString(m.UUID) {
				ps = append(ps, errorf(path+".uuid", "%q is not an SMBIOS UUID such as 4c4c4544-0042-3510-8052-b4c04f333432", m.UUID))
			}
			unique(path+".uuid", "UUID", m.UUID)
		}
		if m.IPXE != "" && !slices.Contains(ipxeBuilds, m.IPXE) {
			ps = append(ps, errorf(path+".ipxe", "%q is not one of %s", m.IPXE, listOf(ipxeBuilds)))
		}
		ps = append(ps, validateInstall(path+".install", m.Install)...)
		names := map[string]bool{}
		for j, in := range m.Interfaces {
			ip := fmt.Sprintf("%s.interfaces[%d]", path, j)
			ps = append(ps, validateInterface(ip, in, names)...)
			for k, a := range in.Addresses {
				if p, err := netip.ParsePrefix(a); err == nil {
					unique(fmt.Sprintf("%s.addresses[%d]", ip, k), "address", p.Addr().String())
				}
			}
			for k, v := range in.VLANs {
				for l, a := range v.Addresses {
					if p, err := netip.ParsePrefix(a); err == nil {
						unique(fmt.Sprintf("%s.vlans[%d].addresses[%d]", ip, k, l), "address", p.Addr().String())
					}
				}
			}
		}
	}
	if vip, err := netip.ParseAddr(r.Cluster.VIP); err == nil {
		if first, ok := seen["address "+vip.String()]; ok {
			ps = append(ps, errorf("cluster.vip", "%s is also a machine address (%s); the VIP must be free", vip, first))
		}
	}
	return ps
}

func validateInstall(path string, in Install) []Problem {
	var ps []Problem
	switch {
	case in.Disk != "" && in.DiskSelector != nil:
		ps = append(ps, errorf(path, "set either disk or diskSelector, not both"))
	case in.Disk == "" && in.DiskSelector == nil:
		ps = append(ps, errorf(path, "set disk (such as /dev/sda) or diskSelector (such as size: \">= 100GB\")"))
	case in.Disk != "" && !strings.HasPrefix(in.Disk, "/dev/"):
		ps = append(ps, errorf(path+".disk", "%q is not a device path under /dev/", in.Disk))
	}
	if s := in.DiskSelector; s != nil {
		if *s == (DiskSelector{}) {
			ps = append(ps, errorf(path+".diskSelector", "empty: match on size, model, serial, type or busPath"))
		}
		if s.Size != "" {
			var m v1alpha1.InstallDiskSizeMatcher
			if err := m.UnmarshalYAML(func(v any) error { *(v.(*string)) = s.Size; return nil }); err != nil {
				ps = append(ps, errorf(path+".diskSelector.size", "%q is not a size comparison such as \">= 100GB\": %v", s.Size, err))
			}
		}
		if s.Type != "" && !slices.Contains(diskTypes, s.Type) {
			ps = append(ps, errorf(path+".diskSelector.type", "%q is not one of %s", s.Type, listOf(diskTypes)))
		}
	}
	return ps
}

func validateInterface(path string, in Interface, names map[string]bool) []Problem {
	var ps []Problem
	switch {
	case in.Name == "" && in.MAC == "":
		ps = append(ps, errorf(path, "needs name (such as eth0 or bond0) or mac"))
	case in.Name != "" && !linkName.MatchString(in.Name):
		ps = append(ps, errorf(path+".name", "%q is not a link name (at most 15 letters, digits, '.', '_' or '-')", in.Name))
	case names[in.Name]:
		ps = append(ps, errorf(path+".name", "%q is used by another interface of this machine", in.Name))
	}
	names[in.Name] = true
	if in.MAC != "" && !isMAC(in.MAC) {
		ps = append(ps, errorf(path+".mac", "%q is not a MAC address", in.MAC))
	}
	ps = append(ps, validateAddressing(path, in.Addresses, in.DHCP, in.Gateway, in.MTU)...)
	if b := in.Bond; b != nil {
		if in.MAC != "" {
			ps = append(ps, errorf(path+".mac", "a bond is named, not selected by MAC; put member MACs in bond.macs"))
		}
		if len(b.Links)+len(b.MACs) == 0 {
			ps = append(ps, errorf(path+".bond", "needs member links or macs"))
		}
		for k, mac := range b.MACs {
			if !isMAC(mac) {
				ps = append(ps, errorf(fmt.Sprintf("%s.bond.macs[%d]", path, k), "%q is not a MAC address", mac))
			}
		}
		if !slices.Contains(bondModes, b.Mode) {
			ps = append(ps, errorf(path+".bond.mode", "%q is not one of %s", b.Mode, listOf(bondModes)))
		}
	}
	ids := map[int]bool{}
	for k, v := range in.VLANs {
		vp := fmt.Sprintf("%s.vlans[%d]", path, k)
		switch {
		case v.ID < 1 || v.ID > 4094:
			ps = append(ps, errorf(vp+".id", "%d is not a VLAN ID (1-4094)", v.ID))
		case ids[v.ID]:
			ps = append(ps, errorf(vp+".id", "VLAN %d appears twice on this interface", v.ID))
		}
		ids[v.ID] = true
		ps = append(ps, validateAddressing(vp, v.Addresses, v.DHCP, v.Gateway, v.MTU)...)
	}
	return ps
}

func validateAddressing(path string, addrs []string, dhcp bool, gateway string, mtu int) []Problem {
	var ps []Problem
	var prefixes []netip.Prefix
	for k, a := range addrs {
		p, err := netip.ParsePrefix(a)
		if err != nil {
			ps = append(ps, errorf(fmt.Sprintf("%s.addresses[%d]", path, k), "%q is not an address with prefix length, such as 192.168.100.11/24", a))
			continue
		}
		prefixes = append(prefixes, p)
	}
	if gateway != "" {
		g, err := netip.ParseAddr(gateway)
		switch {
		case err != nil:
			ps = append(ps, errorf(path+".gateway", "%q is not an IP address", gateway))
		case !slices.ContainsFunc(prefixes, func(p netip.Prefix) bool { return p.Masked().Contains(g) }) && !dhcp:
			ps = append(ps, errorf(path+".gateway", "%s is not in the subnet of any of this interface's addresses", g))
		}
	}
	if mtu != 0 && (mtu < 576 || mtu > 9216) {
		ps = append(ps, errorf(path+".mtu", "%d is not an MTU between 576 and 9216", mtu))
	}
	return ps
}

// vipLink names the control-plane link that carries the VIP: the interface
// or VLAN with an address in the VIP's subnet, else the provisioning link
// when the VIP is in network.subnet. Empty when neither holds.
func (r *Rack) vipLink(vip netip.Addr) string {
	for _, m := range r.ControlPlanes() {
		if l := m.linkFor(vip); l != "" {
			return l
		}
	}
	if n, err := netip.ParsePrefix(r.Network.Subnet); err == nil && n.Contains(vip) {
		return ProvisioningLink
	}
	return ""
}

// ProvisioningLink is the alias Cozy gives the NIC a machine netboots
// from, selected by its MAC.
const ProvisioningLink = "prov0"

// linkFor is the name of this machine's link with an address whose subnet
// contains a, or "".
func (m *Machine) linkFor(a netip.Addr) string {
	for _, in := range m.Interfaces {
		for _, s := range in.Addresses {
			if p, err := netip.ParsePrefix(s); err == nil && p.Masked().Contains(a) {
				return in.Name
			}
		}
		for _, v := range in.VLANs {
			for _, s := range v.Addresses {
				if p, err := netip.ParsePrefix(s); err == nil && p.Masked().Contains(a) {
					return fmt.Sprintf("%s.%d", in.Name, v.ID)
				}
			}
		}
	}
	return ""
}

// VIPLink is the link this control plane carries the VIP on.
func (r *Rack) VIPLink(m *Machine) string {
	vip, err := netip.ParseAddr(r.Cluster.VIP)
	if err != nil {
		return ""
	}
	if l := m.linkFor(vip); l != "" {
		return l
	}
	if n, err := netip.ParsePrefix(r.Network.Subnet); err == nil && n.Contains(vip) && m.MAC != "" {
		if in := m.interfaceForMAC(m.MAC); in != nil {
			return in.Name
		}
		return ProvisioningLink
	}
	return ""
}

// interfaceForMAC is the configured interface selected by mac, if any.
func (m *Machine) interfaceForMAC(mac string) *Interface {
	for i := range m.Interfaces {
		if mac != "" && m.Interfaces[i].MAC == mac {
			return &m.Interfaces[i]
		}
	}
	return nil
}

func isMAC(s string) bool {
	hw, err := net.ParseMAC(s)
	return err == nil && len(hw) == 6
}

// parseRangeOrPrefix accepts 10.0.0.0/24 or 10.0.0.10-10.0.0.20.
func parseRangeOrPrefix(s string) ([2]netip.Addr, error) {
	if p, err := netip.ParsePrefix(s); err == nil {
		if p != p.Masked() {
			return [2]netip.Addr{}, fmt.Errorf("%q has host bits set; did you mean %s?", s, p.Masked())
		}
		return [2]netip.Addr{p.Addr(), p.Addr()}, nil
	}
	from, to, ok := strings.Cut(s, "-")
	a, aerr := netip.ParseAddr(strings.TrimSpace(from))
	b, berr := netip.ParseAddr(strings.TrimSpace(to))
	if !ok || aerr != nil || berr != nil || a.Is4() != b.Is4() || b.Less(a) {
		return [2]netip.Addr{}, fmt.Errorf("%q is not a CIDR or a FROM-TO address range", s)
	}
	return [2]netip.Addr{a, b}, nil
}
