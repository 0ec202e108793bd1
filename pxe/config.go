package pxe

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"time"

	"cozy.dev/cozy/internal/kernelimage"
	"cozy.dev/cozy/pxe/lease"
)

// Debian's ipxe package paths, the default iPXE binaries.
const (
	DefaultBIOSBootFile = "/usr/lib/ipxe/undionly.kpxe"
	DefaultUEFIBootFile = "/usr/lib/ipxe/ipxe.efi"
	// DefaultSNPOnlyBootFile is iPXE that drives the NIC through the
	// firmware's own UEFI driver (SNP), for NICs iPXE has no driver for.
	DefaultSNPOnlyBootFile = "/usr/lib/ipxe/snponly.efi"
	// DefaultARM64BootFile is where Debian 13's ipxe package (the first
	// to build arm64) puts it; used when an arm64 kernel is given.
	DefaultARM64BootFile = "/usr/lib/ipxe/ipxe-arm64.efi"
)

// DefaultStateDir keeps the machine inventory, the config-token key and,
// in full mode, the leases.
const DefaultStateDir = "/var/lib/cozy/pxe"

// Config describes what to serve where. It is input only: Serve resolves
// it (defaults, checks, the interface's address) into a plan once, and
// changes nothing in it. Zero fields take the defaults their comments
// name.
type Config struct {
	// Interface is the boot network's interface; DHCP sockets are bound to
	// it, so nothing is answered on any other network.
	Interface string
	// ServerIP is this host's IPv4 address on Interface; zero means the
	// interface's first IPv4 address.
	ServerIP netip.Addr
	HTTPPort int // default 8080

	// Kernel and Initrds are files to boot; Cmdline is the kernel command
	// line. They are what x86-64 machines boot, BIOS and UEFI.
	Kernel  string
	Initrds []string
	Cmdline string
	// ARM64 is what arm64 UEFI machines boot (its Cmdline defaults to
	// Cmdline). Without a kernel, they boot Kernel if ARM64BootFile is
	// given or Kernel is an arm64 kernel, else they are not answered.
	ARM64 kernelimage.Image

	// AllowUnknown boots every PXE client on the interface (and in full
	// mode leases an address to every DHCP client). Without it only
	// AllowMACs (and the machines of MachineConfigs) are answered.
	AllowUnknown bool
	AllowMACs    []net.HardwareAddr

	// Mode is "proxy" (default: hand out no addresses, run beside the
	// network's DHCP server) or "full" (be the network's DHCP server).
	Mode string
	// Networks are full mode's address pools, each on its network: the
	// interface's own (a Network without Subnet is there), or one behind
	// a DHCP relay agent. Then the lease time (default an hour), fixed
	// addresses by MAC (each on the network its address is in), and
	// where leases are kept (default DefaultStateDir, which also keeps
	// the inventory in both modes).
	Networks     []Network
	LeaseTime    time.Duration
	Reservations map[string]netip.Addr
	StateDir     string

	// Talos marks the kernel as Talos Linux: the command line gets
	// talos.platform=metal and the default kernel arguments of the pinned
	// Talos release.
	Talos bool
	// MachineConfigs maps a MAC to the Talos machine config file served to
	// that machine only (talos.config= with a per-machine token). Those
	// machines are allowed to boot, as Talos; the files must be mode 0600.
	MachineConfigs map[string]string
	// LocalDiskAfterInstall makes an installed machine (see
	// inventory.Machine.Installed) boot its disk: its iPXE script exits to
	// the firmware instead of loading the kernel again.
	LocalDiskAfterInstall bool

	// BIOSBootFile and UEFIBootFile are iPXE binaries (Debian's by default);
	// ARM64BootFile is needed with ARM64 (default DefaultARM64BootFile).
	BIOSBootFile, UEFIBootFile, ARM64BootFile string
	// SNPOnly lists x86-64 UEFI machines, each by MAC or SMBIOS UUID, that
	// load SNPOnlyBootFile (default DefaultSNPOnlyBootFile) instead of
	// UEFIBootFile.
	SNPOnly         []string
	SNPOnlyBootFile string

	Log *slog.Logger // default: discard
}

// Network is a pool of addresses on one network, in full mode: the
// server's own link, or a network behind a DHCP relay agent (whose giaddr
// is in Subnet). Gateway and DNS are announced to its clients.
type Network struct {
	Subnet  netip.Prefix // zero: the interface's network
	Pool    lease.Pool
	Gateway netip.Addr
	DNS     []netip.Addr
}

func (n Network) String() string { return n.Subnet.String() + " " + n.Pool.String() }

// plan is a Config resolved for one run: defaults filled in, every file
// checked, the machines that may boot listed, the interface's address and
// network looked up. The server runs from a plan alone.
type plan struct {
	// Config with its defaults; AllowMACs with MachineConfigs' MACs;
	// Networks, a copy, with every Subnet known and masked.
	Config
	// snpOnly is SNPOnly in canonical form (MAC as net prints it, UUID
	// in lower case), as a set.
	snpOnly map[string]bool
}

// resolve checks c and makes the plan to serve it. It is the one place
// that validates a Config.
func (c Config) resolve() (plan, error) {
	p := plan{Config: c.withDefaults()}
	// What the Config alone decides first, then the host's interface,
	// then the files.
	steps := []func() error{p.checkMode, p.resolveAddresses, p.checkBoot, p.resolveARM64, p.resolveSNPOnly, p.resolveMachineConfigs}
	for _, step := range steps {
		if err := step(); err != nil {
			return plan{}, err
		}
	}
	return p, nil
}

// withDefaults fills the zero fields that have a default.
func (c Config) withDefaults() Config {
	if c.Log == nil {
		c.Log = slog.New(slog.DiscardHandler)
	}
	if c.HTTPPort == 0 {
		c.HTTPPort = 8080
	}
	if c.Mode == "" {
		c.Mode = "proxy"
	}
	if c.LeaseTime == 0 {
		c.LeaseTime = time.Hour
	}
	if c.StateDir == "" {
		c.StateDir = DefaultStateDir
	}
	if c.BIOSBootFile == "" {
		c.BIOSBootFile = DefaultBIOSBootFile
	}
	if c.UEFIBootFile == "" {
		c.UEFIBootFile = DefaultUEFIBootFile
	}
	return c
}

// checkBoot checks the x86-64 boot files.
func (p *plan) checkBoot() error {
	if p.Kernel == "" || len(p.Initrds) == 0 {
		return errors.New("nothing to boot: give a kernel and at least one initramfs")
	}
	for _, f := range append([]string{p.Kernel, p.BIOSBootFile, p.UEFIBootFile}, p.Initrds...) {
		if _, err := os.Stat(f); err != nil {
			return fmt.Errorf("boot file: %w", err)
		}
	}
	return nil
}

// resolveMachineConfigs checks the machine config files and allows their
// machines to boot, as Talos.
func (p *plan) resolveMachineConfigs() error {
	// Clipped, so appending never writes into the caller's array.
	p.AllowMACs = slices.Clip(p.AllowMACs)
	for mac, path := range p.MachineConfigs {
		fi, err := os.Stat(path)
		if err != nil {
			return fmt.Errorf("machine config of %s: %w", mac, err)
		}
		if fi.Mode().Perm()&0o077 != 0 {
			return fmt.Errorf("machine config %s holds cluster keys but is readable by others (mode %v): run chmod 600 %s", path, fi.Mode().Perm(), path)
		}
		hw, err := net.ParseMAC(mac)
		if err != nil {
			return fmt.Errorf("machine config for %q: %w", mac, err)
		}
		p.AllowMACs = append(p.AllowMACs, hw)
		p.Talos = true
	}
	if !p.AllowUnknown && len(p.AllowMACs) == 0 {
		return errors.New("no machine may boot: list machines or pass --allow-unknown to boot every PXE client on the interface")
	}
	return nil
}

// checkMode checks that there is an interface, that pools and
// reservations come with full mode, and full mode with a pool.
func (p *plan) checkMode() error {
	if p.Interface == "" {
		return errors.New("no interface: name the boot network's interface (--interface, or a rack whose network.interface names it)")
	}
	switch p.Mode {
	case "proxy":
		if len(p.Networks) > 0 || len(p.Reservations) > 0 {
			return errors.New("address pools and fixed addresses (--range, --subnet, --gateway, --dns, --pool, --reserve) are full mode's: add --mode full")
		}
	case "full":
		if len(p.Networks) == 0 {
			return errors.New("full mode needs an address pool (--range FROM-TO, or --pool SUBNET,FROM-TO)")
		}
	default:
		return fmt.Errorf("mode %q: use proxy or full", p.Mode)
	}
	return nil
}

// resolveAddresses finds the server's address, and the interface's
// network for a pool that names none, then checks the pools.
func (p *plan) resolveAddresses() error {
	onLink := 0
	for _, n := range p.Networks {
		if !n.Subnet.IsValid() {
			onLink++
		}
	}
	if onLink > 1 {
		return errors.New("more than one pool without its network: only one pool can be the interface's own (--range); give the others theirs (--pool SUBNET,FROM-TO)")
	}
	if p.ServerIP.IsValid() && !p.ServerIP.Is4() {
		return fmt.Errorf("server address %s: want an IPv4 address (--server-ip)", p.ServerIP)
	}
	var link netip.Prefix
	if !p.ServerIP.IsValid() || onLink > 0 {
		var err error
		if link, err = interfaceIPv4(p.Interface); err != nil {
			return err
		}
		if !p.ServerIP.IsValid() {
			p.ServerIP = link.Addr()
		}
	}
	// A copy: the caller's Config keeps its own.
	p.Networks = slices.Clone(p.Networks)
	for i := range p.Networks {
		if !p.Networks[i].Subnet.IsValid() {
			p.Networks[i].Subnet = link.Masked()
		}
	}
	return p.checkNetworks()
}

// resolveSNPOnly checks the machines that load snponly.efi and its file.
func (p *plan) resolveSNPOnly() error {
	p.snpOnly = map[string]bool{}
	for _, id := range p.SNPOnly {
		switch hw, err := net.ParseMAC(id); {
		case err == nil && len(hw) == 6:
			p.snpOnly[hw.String()] = true
		case uuidPattern.MatchString(strings.ToLower(id)):
			p.snpOnly[strings.ToLower(id)] = true
		default:
			return fmt.Errorf("snponly.efi for %q: want a MAC such as 52:54:00:12:34:56 or an SMBIOS UUID such as 4c4c4544-0042-3510-8052-b4c04f333432", id)
		}
	}
	if len(p.snpOnly) == 0 {
		return nil
	}
	if p.SNPOnlyBootFile == "" {
		p.SNPOnlyBootFile = DefaultSNPOnlyBootFile
	}
	if _, err := os.Stat(p.SNPOnlyBootFile); err != nil {
		return fmt.Errorf("snponly boot file: %w", err)
	}
	if filepath.Base(p.UEFIBootFile) == snpOnlyName && p.UEFIBootFile != p.SNPOnlyBootFile {
		return fmt.Errorf("two files named %s (%s and %s): the TFTP server serves files by name", snpOnlyName, p.UEFIBootFile, p.SNPOnlyBootFile)
	}
	return nil
}

// snpOnlyName is the name snponly.efi is served under.
const snpOnlyName = "snponly.efi"

var uuidPattern = regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$`)

// defaultARM64BootFile is DefaultARM64BootFile, or a file of a test's.
var defaultARM64BootFile = DefaultARM64BootFile

// resolveARM64 decides what arm64 machines boot. With an arm64 kernel of
// their own (ARM64), that kernel. Without one, the main kernel, when the
// user gave an arm64 iPXE (as with pixiecore, one kernel boots every
// client) or when the main kernel is itself an arm64 one and Debian's arm64
// iPXE is at hand; otherwise arm64 machines are not answered.
func (p *plan) resolveARM64() error {
	a := &p.ARM64
	switch {
	case a.Kernel == "" && len(a.Initrds) > 0:
		return errors.New("an arm64 initramfs without an arm64 kernel: give --kernel-arm64 too")
	case a.Kernel != "" && len(a.Initrds) == 0:
		return errors.New("an arm64 kernel without an initramfs: give --initrd-arm64 too")
	case a.Kernel == "":
		arch, _ := kernelimage.Arch(p.Kernel)
		if p.ARM64BootFile == "" && (arch != kernelimage.ARM64 || !exists(defaultARM64BootFile)) {
			return nil // arm64 machines are not answered
		}
		if arch == kernelimage.AMD64 {
			p.Log.Warn("arm64 machines will be handed the x86 kernel: give them their own with --kernel-arm64 and --initrd-arm64", "kernel", p.Kernel)
		}
		*a = kernelimage.Image{Kernel: p.Kernel, Initrds: p.Initrds, Cmdline: p.Cmdline}
	}
	if p.ARM64BootFile == "" {
		if !exists(defaultARM64BootFile) {
			return fmt.Errorf("an arm64 kernel, but no iPXE for arm64 UEFI: %s is missing (Debian 13's ipxe package has it); give one with --ipxe-arm64", defaultARM64BootFile)
		}
		p.ARM64BootFile = defaultARM64BootFile
	}
	if a.Cmdline == "" {
		a.Cmdline = p.Cmdline
	}
	for _, f := range append([]string{a.Kernel, p.ARM64BootFile}, a.Initrds...) {
		if _, err := os.Stat(f); err != nil {
			return fmt.Errorf("arm64 boot file: %w", err)
		}
	}
	return nil
}

func exists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

// checkNetworks checks that each pool has a range inside its IPv4
// network, that no two networks overlap, and that every reservation is
// on one of them.
func (p *plan) checkNetworks() error {
	for i := range p.Networks {
		n := &p.Networks[i]
		if !n.Pool.First.IsValid() {
			return fmt.Errorf("network %v has no address range: a subnet, gateway or DNS server describes a pool (--range FROM-TO), or give each pool its own (--pool SUBNET,FROM-TO,gateway=IP,dns=IP)", n.Subnet)
		}
		if !n.Subnet.Addr().Is4() {
			return fmt.Errorf("pool %s: its network %v is not an IPv4 network such as 10.8.1.0/24", n.Pool, n.Subnet)
		}
		n.Subnet = n.Subnet.Masked()
	}
	// Each pool inside its network, no two networks overlapping: the
	// lease store's rules, checked before anything is opened. Proxy mode
	// has no pools.
	if len(p.Networks) > 0 {
		if err := lease.CheckNetworks(p.leaseNetworks()); err != nil {
			return err
		}
	}
	for mac, ip := range p.Reservations {
		if p.networkOf(ip) < 0 {
			return fmt.Errorf("reservation %s=%s is on none of the pools' networks (%s)", mac, ip, p.networkList())
		}
	}
	return nil
}

// leaseNetworks are the pools as the lease store keeps them, each with
// the reservations on its network (one on none is checkNetworks' to
// refuse).
func (p *plan) leaseNetworks() []lease.Network {
	nets := make([]lease.Network, len(p.Networks))
	for i, n := range p.Networks {
		nets[i] = lease.Network{Subnet: n.Subnet, Pool: n.Pool}
	}
	for mac, ip := range p.Reservations {
		i := p.networkOf(ip)
		if i < 0 {
			continue
		}
		if nets[i].Reservations == nil {
			nets[i].Reservations = map[string]netip.Addr{}
		}
		nets[i].Reservations[mac] = ip
	}
	return nets
}

func (p *plan) networkOf(ip netip.Addr) int {
	for i, n := range p.Networks {
		if n.Subnet.Contains(ip) {
			return i
		}
	}
	return -1
}

func (p *plan) networkList() string {
	var out []string
	for _, n := range p.Networks {
		out = append(out, n.Subnet.String())
	}
	return strings.Join(out, ", ")
}

// interfaceIPv4 returns the first IPv4 address of an interface, with its
// prefix length.
func interfaceIPv4(name string) (netip.Prefix, error) {
	iface, err := net.InterfaceByName(name)
	if err != nil {
		return netip.Prefix{}, fmt.Errorf("interface %s: %w", name, err)
	}
	addrs, err := iface.Addrs()
	if err != nil {
		return netip.Prefix{}, fmt.Errorf("addresses of %s: %w", name, err)
	}
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok {
			ones, _ := n.Mask.Size()
			if ip, ok := netip.AddrFromSlice(n.IP); ok && ip.Unmap().Is4() {
				return netip.PrefixFrom(ip.Unmap(), ones), nil
			}
		}
	}
	return netip.Prefix{}, fmt.Errorf("interface %s has no IPv4 address: give the server one or pass --server-ip", name)
}
