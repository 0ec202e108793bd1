// Package pxe is Cozy's netboot server: it runs proxyDHCP (ports 67 and
// 4011), TFTP (69) and HTTP on one interface and boots the machines it is
// allowed to boot into a kernel and initramfs through iPXE. The decisions
// live in the subpackages (dhcp, tftp, ipxe, httpboot); this package owns
// the sockets and their lifetimes.
package pxe

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"time"

	"github.com/insomniacslk/dhcp/dhcpv4"
	"github.com/insomniacslk/dhcp/dhcpv4/server4"
	"github.com/siderolabs/talos/pkg/machinery/constants"
	"github.com/siderolabs/talos/pkg/machinery/gendata"
	"github.com/siderolabs/talos/pkg/machinery/imager/quirks"
	"github.com/siderolabs/talos/pkg/machinery/kernel"

	"cozy.dev/cozy/internal/kernelimage"
	"cozy.dev/cozy/pxe/dhcp"
	"cozy.dev/cozy/pxe/httpboot"
	"cozy.dev/cozy/pxe/inventory"
	"cozy.dev/cozy/pxe/ipxe"
	"cozy.dev/cozy/pxe/lease"
	"cozy.dev/cozy/pxe/tftp"
	"cozy.dev/cozy/pxe/token"
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

// Config describes what to serve where.
type Config struct {
	// Interface is the boot network's interface; DHCP sockets are bound to
	// it, so nothing is answered on any other network.
	Interface string
	// ServerIP is this host's address on Interface; zero means the
	// interface's first IPv4 address.
	ServerIP netip.Addr
	HTTPPort int

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
	// AllowMACs are answered.
	AllowUnknown bool
	AllowMACs    []net.HardwareAddr

	// Mode is "proxy" (default: hand out no addresses, run beside the
	// network's DHCP server) or "full" (be the network's DHCP server).
	Mode string
	// Full mode: an address pool, its network (default: the interface's),
	// the router and DNS servers to announce there; more pools on other
	// networks; the lease time, reservations (each on the network its
	// address is in), and where leases are kept.
	Pool         lease.Pool
	Subnet       netip.Prefix
	Gateway      netip.Addr
	DNS          []netip.Addr
	Networks     []Network
	LeaseTime    time.Duration
	Reservations map[string]netip.Addr
	StateDir     string
	// networks is every pool: Pool (with Subnet, Gateway, DNS) first.
	networks []Network

	// Talos marks the kernel as Talos Linux: the command line gets
	// talos.platform=metal and the default kernel arguments of the pinned
	// Talos release.
	Talos bool
	// MachineConfigs maps a MAC to the Talos machine config file served to
	// that machine only (talos.config= with a per-machine token). Those
	// machines are allowed to boot; the files must be mode 0600.
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
	// snpOnly is SNPOnly in canonical form (MAC as net prints it, UUID
	// in lower case), as a set.
	snpOnly map[string]bool

	Log *slog.Logger
}

// Network is a pool of addresses on one network, in full mode: the
// server's own link, or a network behind a DHCP relay agent (whose giaddr
// is in Subnet).
type Network struct {
	Subnet  netip.Prefix
	Pool    lease.Pool
	Gateway netip.Addr
	DNS     []netip.Addr
}

func (n Network) String() string { return n.Subnet.String() + " " + n.Pool.String() }

func (c *Config) setDefaults() error {
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
	if c.Interface == "" {
		return errors.New("no interface: name the boot network's interface (--interface)")
	}
	if c.Kernel == "" || len(c.Initrds) == 0 {
		return errors.New("nothing to boot: give a kernel and at least one initramfs")
	}
	for _, f := range append([]string{c.Kernel, c.BIOSBootFile, c.UEFIBootFile}, c.Initrds...) {
		if _, err := os.Stat(f); err != nil {
			return fmt.Errorf("boot file: %w", err)
		}
	}
	if err := c.resolveARM64(); err != nil {
		return err
	}
	if err := c.resolveSNPOnly(); err != nil {
		return err
	}
	for mac, path := range c.MachineConfigs {
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
		c.AllowMACs = append(c.AllowMACs, hw)
		c.Talos = true
	}
	if !c.AllowUnknown && len(c.AllowMACs) == 0 {
		return errors.New("no machine may boot: list machines or pass --allow-unknown to boot every PXE client on the interface")
	}
	switch c.Mode {
	case "proxy":
	case "full":
		if !c.Pool.First.IsValid() && len(c.Networks) == 0 {
			return errors.New("full mode needs an address pool (--range FROM-TO, or --pool SUBNET,FROM-TO)")
		}
		if !c.Pool.First.IsValid() && (c.Subnet.IsValid() || c.Gateway.IsValid() || len(c.DNS) > 0) {
			return errors.New("a subnet, gateway or DNS server without a range (--range): give each pool its own (--pool SUBNET,FROM-TO,gateway=IP,dns=IP)")
		}
	default:
		return fmt.Errorf("mode %q: use proxy or full", c.Mode)
	}
	if !c.ServerIP.IsValid() || (c.Mode == "full" && c.Pool.First.IsValid() && !c.Subnet.IsValid()) {
		prefix, err := interfaceIPv4(c.Interface)
		if err != nil {
			return err
		}
		if !c.ServerIP.IsValid() {
			c.ServerIP = prefix.Addr()
		}
		if !c.Subnet.IsValid() && c.Pool.First.IsValid() {
			c.Subnet = prefix.Masked()
		}
	}
	if c.Mode == "full" {
		return c.resolveNetworks()
	}
	return nil
}

// resolveSNPOnly checks the machines that load snponly.efi and its file.
func (c *Config) resolveSNPOnly() error {
	c.snpOnly = map[string]bool{}
	for _, id := range c.SNPOnly {
		switch hw, err := net.ParseMAC(id); {
		case err == nil && len(hw) == 6:
			c.snpOnly[hw.String()] = true
		case uuidPattern.MatchString(strings.ToLower(id)):
			c.snpOnly[strings.ToLower(id)] = true
		default:
			return fmt.Errorf("snponly.efi for %q: want a MAC such as 52:54:00:12:34:56 or an SMBIOS UUID such as 4c4c4544-0042-3510-8052-b4c04f333432", id)
		}
	}
	if len(c.snpOnly) == 0 {
		return nil
	}
	if c.SNPOnlyBootFile == "" {
		c.SNPOnlyBootFile = DefaultSNPOnlyBootFile
	}
	if _, err := os.Stat(c.SNPOnlyBootFile); err != nil {
		return fmt.Errorf("snponly boot file: %w", err)
	}
	if filepath.Base(c.UEFIBootFile) == snpOnlyName && c.UEFIBootFile != c.SNPOnlyBootFile {
		return fmt.Errorf("two files named %s (%s and %s): the TFTP server serves files by name", snpOnlyName, c.UEFIBootFile, c.SNPOnlyBootFile)
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
func (c *Config) resolveARM64() error {
	a := &c.ARM64
	switch {
	case a.Kernel == "" && len(a.Initrds) > 0:
		return errors.New("an arm64 initramfs without an arm64 kernel: give --kernel-arm64 too")
	case a.Kernel != "" && len(a.Initrds) == 0:
		return errors.New("an arm64 kernel without an initramfs: give --initrd-arm64 too")
	case a.Kernel == "":
		arch, _ := kernelimage.Arch(c.Kernel)
		if c.ARM64BootFile == "" && (arch != kernelimage.ARM64 || !exists(defaultARM64BootFile)) {
			return nil // arm64 machines are not answered
		}
		if arch == kernelimage.AMD64 {
			c.Log.Warn("arm64 machines will be handed the x86 kernel: give them their own with --kernel-arm64 and --initrd-arm64", "kernel", c.Kernel)
		}
		*a = kernelimage.Image{Kernel: c.Kernel, Initrds: c.Initrds, Cmdline: c.Cmdline}
	}
	if c.ARM64BootFile == "" {
		if !exists(defaultARM64BootFile) {
			return fmt.Errorf("an arm64 kernel, but no iPXE for arm64 UEFI: %s is missing (Debian 13's ipxe package has it); give one with --ipxe-arm64", defaultARM64BootFile)
		}
		c.ARM64BootFile = defaultARM64BootFile
	}
	if a.Cmdline == "" {
		a.Cmdline = c.Cmdline
	}
	for _, f := range append([]string{a.Kernel, c.ARM64BootFile}, a.Initrds...) {
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

// resolveNetworks lists every pool and checks that each lies in its
// network, that no two networks overlap, and that every reservation is on
// one of them.
func (c *Config) resolveNetworks() error {
	c.networks = nil
	if c.Pool.First.IsValid() {
		c.networks = append(c.networks, Network{Subnet: c.Subnet, Pool: c.Pool, Gateway: c.Gateway, DNS: c.DNS})
	}
	c.networks = append(c.networks, c.Networks...)
	for i := range c.networks {
		n := &c.networks[i]
		if !n.Subnet.IsValid() || !n.Subnet.Addr().Is4() {
			return fmt.Errorf("pool %s: its network %v is not an IPv4 network such as 10.8.1.0/24", n.Pool, n.Subnet)
		}
		n.Subnet = n.Subnet.Masked()
	}
	// Each pool inside its network, no two networks overlapping: the
	// lease store's rules, checked before anything is opened. Proxy mode
	// has no pools.
	if len(c.networks) > 0 {
		if err := lease.CheckNetworks(c.leaseNetworks()); err != nil {
			return err
		}
	}
	for mac, ip := range c.Reservations {
		if c.networkOf(ip) < 0 {
			return fmt.Errorf("reservation %s=%s is on none of the pools' networks (%s)", mac, ip, c.networkList())
		}
	}
	return nil
}

// leaseNetworks are the pools as the lease store keeps them, each with
// the reservations on its network (one on none is resolveNetworks' to
// refuse).
func (c *Config) leaseNetworks() []lease.Network {
	nets := make([]lease.Network, len(c.networks))
	for i, n := range c.networks {
		nets[i] = lease.Network{Subnet: n.Subnet, Pool: n.Pool}
	}
	for mac, ip := range c.Reservations {
		i := c.networkOf(ip)
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

func (c *Config) networkOf(ip netip.Addr) int {
	for i, n := range c.networks {
		if n.Subnet.Contains(ip) {
			return i
		}
	}
	return -1
}

func (c *Config) networkList() string {
	var out []string
	for _, n := range c.networks {
		out = append(out, n.Subnet.String())
	}
	return strings.Join(out, ", ")
}

// DefaultStateDir keeps the machine inventory, the config-token key and,
// in full mode, the leases.
const DefaultStateDir = "/var/lib/cozy/pxe"

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

// Serve runs the netboot server until ctx ends, then shuts it down: HTTP
// downloads in flight get 10 s to finish, TFTP transfers are cut (PXE ROMs
// retry), and the inventory is flushed.
func Serve(ctx context.Context, cfg Config) error {
	if err := cfg.setDefaults(); err != nil {
		return err
	}
	s, err := newServer(cfg)
	if err != nil {
		return err
	}
	defer s.close()
	return s.run(ctx)
}

// server is one run of the netboot server: what it serves and the state it
// keeps, wired to the dhcp, tftp and httpboot packages by its methods.
type server struct {
	cfg  Config
	log  *slog.Logger
	base string // http://IP:PORT

	boots     map[dhcp.CPU]ipxe.Boot // what machines boot, by architecture
	assets    map[string]string      // /assets/ name -> file
	bootFiles map[string]string      // iPXE binaries by TFTP (and /boot/) name
	configs   map[string]string      // MAC -> machine config file
	keys      *token.Keyring

	responder decider
	leases    *lease.Store // full mode only
	inv       *inventory.Inventory
	met       *metrics
}

func newServer(cfg Config) (*server, error) {
	if err := os.MkdirAll(cfg.StateDir, 0o700); err != nil {
		return nil, fmt.Errorf("state dir: %w", err)
	}
	s := &server{
		cfg:     cfg,
		log:     cfg.Log,
		base:    fmt.Sprintf("http://%s", netip.AddrPortFrom(cfg.ServerIP, uint16(cfg.HTTPPort))),
		boots:   map[dhcp.CPU]ipxe.Boot{},
		assets:  map[string]string{},
		configs: map[string]string{},
	}
	if err := s.addBoot(dhcp.AMD64, kernelimage.Image{Kernel: cfg.Kernel, Initrds: cfg.Initrds, Cmdline: cfg.Cmdline}); err != nil {
		return nil, err
	}
	if cfg.ARM64.Kernel != "" {
		if err := s.addBoot(dhcp.ARM64, cfg.ARM64); err != nil {
			return nil, fmt.Errorf("arm64: %w", err)
		}
	}
	var err error
	if s.keys, err = token.Load(cfg.StateDir); err != nil {
		return nil, err
	}
	for mac, path := range cfg.MachineConfigs {
		hw, _ := net.ParseMAC(mac)
		s.configs[hw.String()] = path
	}

	if s.inv, err = inventory.Open(cfg.StateDir, nil); err != nil {
		return nil, err
	}
	bootCfg := s.dhcpBootConfig()
	if cfg.Mode == "full" {
		if s.responder, err = s.fullResponder(bootCfg); err != nil {
			s.close()
			return nil, err
		}
	} else if s.responder, err = dhcp.NewProxy(bootCfg); err != nil {
		return nil, err
	}
	s.met = newMetrics(s.inv, s.leases)
	return s, nil
}

// dhcpBootConfig is the boot information DHCP hands out: the iPXE
// binaries (which it also lists in s.bootFiles for TFTP) and who gets
// them.
func (s *server) dhcpBootConfig() dhcp.Config {
	cfg := s.cfg
	s.bootFiles = map[string]string{
		filepath.Base(cfg.BIOSBootFile): cfg.BIOSBootFile,
		filepath.Base(cfg.UEFIBootFile): cfg.UEFIBootFile,
	}
	files := dhcp.BootFiles{BIOS: filepath.Base(cfg.BIOSBootFile), UEFIAMD64: filepath.Base(cfg.UEFIBootFile)}
	if cfg.ARM64BootFile != "" {
		// Its Debian-style name (ipxe.efi) would clash with the x86 one.
		s.bootFiles["ipxe-arm64.efi"] = cfg.ARM64BootFile
		files.UEFIARM64 = "ipxe-arm64.efi"
	}
	bootCfg := dhcp.Config{
		ServerIP: cfg.ServerIP,
		HTTPPort: cfg.HTTPPort,
		Files:    files,
		Allow:    func(c dhcp.Client) bool { return s.allowed(c.MAC) },
	}
	if len(cfg.snpOnly) > 0 {
		s.bootFiles[snpOnlyName] = cfg.SNPOnlyBootFile
		bootCfg.BootFile = func(c dhcp.Client) string {
			if c.CPU == dhcp.AMD64 && c.Firmware == dhcp.UEFI && (cfg.snpOnly[c.MAC.String()] || cfg.snpOnly[c.UUID]) {
				return snpOnlyName
			}
			return ""
		}
	}
	return bootCfg
}

// fullResponder opens the lease store of every network (each
// reservation on the network its address is in) and answers DHCP as
// their server.
func (s *server) fullResponder(bootCfg dhcp.Config) (*dhcp.Full, error) {
	cfg := s.cfg
	var err error
	if s.leases, err = lease.Open(cfg.StateDir, cfg.leaseNetworks(), nil); err != nil {
		return nil, err
	}
	full := dhcp.FullConfig{
		Boot:         bootCfg,
		AllowAddress: s.allowed,
		LeaseTime:    cfg.LeaseTime,
	}
	for i, n := range cfg.networks {
		dn := dhcp.Network{Subnet: n.Subnet, DNS: n.DNS, Leases: s.leases.Network(i)}
		if n.Gateway.IsValid() {
			dn.Routers = []netip.Addr{n.Gateway}
		}
		full.Networks = append(full.Networks, dn)
	}
	return dhcp.NewFull(full)
}

// addBoot serves img to machines of one architecture: its files under
// /assets/ (named kernel, initrd0, ... for x86-64, arm64-kernel, ... for
// arm64) and the iPXE script that loads them.
func (s *server) addBoot(cpu dhcp.CPU, img kernelimage.Image) error {
	prefix := ""
	if cpu != dhcp.AMD64 {
		prefix = string(cpu) + "-"
	}
	s.assets[prefix+"kernel"] = img.Kernel
	b := ipxe.Boot{KernelURL: s.base + "/assets/" + prefix + "kernel", Cmdline: img.Cmdline}
	for i, p := range img.Initrds {
		name := fmt.Sprintf("%sinitrd%d", prefix, i)
		s.assets[name] = p
		b.InitrdURLs = append(b.InitrdURLs, s.base+"/assets/"+name)
	}
	if s.cfg.Talos {
		b.Cmdline = talosCmdline(cpu, img.Cmdline)
	}
	if _, err := ipxe.Script(b); err != nil {
		return err
	}
	s.boots[cpu] = b
	return nil
}

func (s *server) close() {
	if s.leases != nil {
		s.leases.Close()
	}
}

// allowed reports whether the server boots (and in full mode leases to)
// the machine with mac.
func (s *server) allowed(mac net.HardwareAddr) bool {
	if s.cfg.AllowUnknown {
		return true
	}
	for _, m := range s.cfg.AllowMACs {
		if bytes.Equal(m, mac) {
			return true
		}
	}
	return false
}

// script is the iPXE script of one machine: the boot of its architecture
// (as its DHCP requests said, x86-64 if none was seen), plus, for machines
// with a config, the URL only they can fetch it from; or the local disk
// once installed, if so configured.
func (s *server) script(mac net.HardwareAddr) (string, bool) {
	if !s.allowed(mac) {
		return "", false
	}
	cpu := dhcp.AMD64
	if m, ok := s.inv.Get(mac.String()); ok {
		if m.Installed && s.cfg.LocalDiskAfterInstall {
			s.log.Info("installed machine boots its disk", "mac", mac.String())
			return ipxe.LocalDisk, true
		}
		if m.Arch != "" {
			cpu = dhcp.CPU(m.Arch)
		}
	}
	b, ok := s.boots[cpu]
	if !ok {
		s.log.Warn("no kernel for this machine's architecture", "mac", mac.String(), "arch", cpu)
		return "", false
	}
	if _, ok := s.configs[mac.String()]; ok {
		b.Cmdline += fmt.Sprintf(" talos.config=%s/config/%s/%s.yaml", s.base, strings.ReplaceAll(mac.String(), ":", "-"), s.keys.For(mac))
	}
	script, err := ipxe.Script(b)
	if err != nil {
		s.log.Error("ipxe script", "mac", mac.String(), "err", err)
		return "", false
	}
	return script, true
}

// advance records a phase for the machine at ip; in proxy mode the server
// may not know that IP yet, but the kernel's neighbour table does.
func (s *server) advance(mac string, ip netip.Addr, phase inventory.Phase) {
	if !s.inv.Advance(mac, ip, phase) {
		if mac := neighbourMAC(ip); mac != "" {
			s.inv.Advance(mac, ip, phase)
		}
	}
}

// fetched turns HTTP downloads into boot phases.
func (s *server) fetched(f httpboot.Fetch) {
	switch f.Kind {
	case "script":
		s.advance(f.MAC.String(), f.Remote, inventory.PhaseIPXEScript)
	case "asset":
		phase := inventory.PhaseInitrd
		if strings.TrimPrefix(f.Name, string(dhcp.ARM64)+"-") == "kernel" {
			phase = inventory.PhaseKernel
		}
		s.advance("", f.Remote, phase)
	case "boot":
		s.advance("", f.Remote, inventory.PhaseIPXEBinary)
	case "config":
		s.advance(f.MAC.String(), f.Remote, inventory.PhaseConfig)
	}
}

// sighted counts a DHCP request and records netboot clients in the inventory.
func (s *server) sighted(req *dhcpv4.DHCPv4, d dhcp.Decision, port int, peer *net.UDPAddr) {
	s.met.countDHCP(port, d.RequestType, d.Outcome)
	if !d.Netboot {
		return // not a netboot client: its lease, if any, is in the lease journal
	}
	reply := d.Reply
	var ip netip.Addr
	switch {
	case reply != nil && !reply.YourIPAddr.IsUnspecified():
		ip, _ = netip.AddrFromSlice(reply.YourIPAddr.To4())
	case !req.ClientIPAddr.IsUnspecified():
		ip, _ = netip.AddrFromSlice(req.ClientIPAddr.To4())
	case port == dhcp.PortPXE:
		ip = peer.AddrPort().Addr().Unmap()
	}
	client := d.Client
	s.inv.SawDHCP(inventory.DHCPSighting{
		MAC: req.ClientHWAddr.String(), UUID: client.UUID, Arch: string(client.CPU), Firmware: string(client.Firmware),
		VendorClass: client.VendorClass, IP: ip, Allowed: s.allowed(req.ClientHWAddr),
		Answered: reply != nil && reply.BootFileName != "", IPXE: client.IPXE,
	})
}

// compactLeases rewrites the lease journal whenever it has grown enough,
// while DHCP goes on, until ctx ends.
func (s *server) compactLeases(ctx context.Context, log *slog.Logger) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-s.leases.CompactionDue():
			start := time.Now()
			c, err := s.leases.Compact()
			if err != nil {
				log.Warn("lease journal not compacted; it keeps growing", "err", err)
				continue
			}
			log.Info("lease journal compacted", "took", time.Since(start).Round(time.Millisecond), "records", c.Live,
				"grantsStopped", c.Stopped.Round(time.Microsecond), "acksHeld", c.Held.Round(time.Microsecond))
		}
	}
}

// tftpSent counts a finished TFTP transfer and advances its machine.
func (s *server) tftpSent(name string, ip netip.Addr) {
	s.met.tftpTransfer.WithLabelValues("sent").Inc()
	if fi, err := os.Stat(s.bootFiles[name]); err == nil {
		s.met.tftpBytes.Add(float64(fi.Size()))
	}
	s.advance("", ip, inventory.PhaseIPXEBinary)
}

// sockets are the server's listening sockets.
type sockets struct {
	dhcp, pxe *net.UDPConn
	tftp      net.PacketConn
	http      net.Listener
}

// listen opens every socket before any is served, so a port in use fails
// fast; on an error it closes those it opened.
func (s *server) listen() (_ *sockets, err error) {
	cfg := s.cfg
	ls := &sockets{}
	defer func() {
		if err != nil {
			ls.close()
		}
	}()
	if ls.dhcp, err = server4.NewIPv4UDPConn(cfg.Interface, &net.UDPAddr{Port: dhcp.PortDHCP}); err != nil {
		return nil, fmt.Errorf("listen for DHCP on %s:67 (needs root or CAP_NET_BIND_SERVICE+CAP_NET_RAW): %w", cfg.Interface, err)
	}
	// A rack powering on at once is a burst of DISCOVERs: queue them
	// rather than drop them while the previous ones are answered.
	_ = ls.dhcp.SetReadBuffer(4 << 20)
	if ls.pxe, err = server4.NewIPv4UDPConn(cfg.Interface, &net.UDPAddr{Port: dhcp.PortPXE}); err != nil {
		return nil, fmt.Errorf("listen for PXE on %s:4011: %w", cfg.Interface, err)
	}
	if ls.tftp, err = net.ListenPacket("udp4", netip.AddrPortFrom(cfg.ServerIP, 69).String()); err != nil {
		return nil, fmt.Errorf("listen for TFTP on %s:69: %w", cfg.ServerIP, err)
	}
	if ls.http, err = net.Listen("tcp4", netip.AddrPortFrom(cfg.ServerIP, uint16(cfg.HTTPPort)).String()); err != nil {
		return nil, fmt.Errorf("listen for HTTP on %s:%d: %w", cfg.ServerIP, cfg.HTTPPort, err)
	}
	return ls, nil
}

// close closes what is open; closing twice is harmless.
func (ls *sockets) close() {
	if ls.dhcp != nil {
		_ = ls.dhcp.Close()
	}
	if ls.pxe != nil {
		_ = ls.pxe.Close()
	}
	if ls.tftp != nil {
		_ = ls.tftp.Close()
	}
	if ls.http != nil {
		_ = ls.http.Close()
	}
}

// httpServer serves the boot script, machine configs and boot files.
func (s *server) httpServer() *http.Server {
	return &http.Server{
		Handler: s.met.handler((&httpboot.Server{
			Script:        s.script,
			MachineConfig: s.machineConfig,
			OnRequest:     s.met.countHTTP,
			OnFetch:       s.fetched,
			Assets:        s.assets,
			BootFiles:     s.bootFiles,
			Log:           s.log.With("service", "http"),
		}).Handler()),
		ReadHeaderTimeout: 10 * time.Second,
	}
}

// commitLeases makes the ACKs of a batch wait until their leases are on
// disk, and times that wait (cozy_pxe_lease_journal_sync_seconds).
// Without a lease store (proxy mode) there is nothing to wait for.
func (s *server) commitLeases() func(lease.Seq) error {
	if s.leases == nil {
		return func(lease.Seq) error { return nil }
	}
	return func(seq lease.Seq) error {
		start := time.Now()
		err := s.leases.Sync(seq)
		s.met.journalSync.Observe(time.Since(start).Seconds())
		return err
	}
}

// run opens every socket, then serves until ctx ends.
func (s *server) run(ctx context.Context) error {
	cfg, log := s.cfg, s.log
	ls, err := s.listen()
	if err != nil {
		return err
	}
	defer ls.close()
	httpSrv := s.httpServer()

	attrs := []any{"interface", cfg.Interface, "ip", cfg.ServerIP, "http", s.base,
		"mode", cfg.Mode, "allowUnknown", cfg.AllowUnknown, "machines", len(cfg.AllowMACs)}
	for i, n := range cfg.networks {
		attrs = append(attrs, fmt.Sprintf("pool%d", i), n.String())
	}
	log.Info("netboot server up", attrs...)

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	errs := make(chan error, 5)
	run := func(name string, f func() error) {
		wg.Go(func() {
			if err := f(); err != nil && ctx.Err() == nil {
				errs <- fmt.Errorf("%s: %w", name, err)
				cancel()
			}
		})
	}
	dhcpLog, commit := log.With("service", "dhcp"), s.commitLeases()
	for _, l := range []struct {
		name string
		conn *net.UDPConn
		port int
	}{{"dhcp", ls.dhcp, dhcp.PortDHCP}, {"pxe", ls.pxe, dhcp.PortPXE}} {
		d := &dhcpServer{conn: l.conn, port: l.port, decider: s.responder, commit: commit, sighted: s.sighted, log: dhcpLog}
		run(l.name, func() error { return d.serve(ctx) })
	}
	run("tftp", func() error {
		return (&tftp.Server{Files: s.bootFiles, Log: log.With("service", "tftp"), OnSent: s.tftpSent,
			OnFailed: func() { s.met.tftpTransfer.WithLabelValues("failed").Inc() },
		}).Serve(ctx, ls.tftp)
	})
	run("inventory", func() error { return s.inv.Run(ctx, time.Second) })
	if s.leases != nil {
		run("leases", func() error { s.compactLeases(ctx, dhcpLog); return nil })
	}
	run("http", func() error {
		if err := httpSrv.Serve(ls.http); !errors.Is(err, http.ErrServerClosed) {
			return err
		}
		return nil
	})

	<-ctx.Done()
	log.Info("netboot server stopping")
	shutdownCtx, stop := context.WithTimeout(context.Background(), 10*time.Second)
	defer stop()
	_ = httpSrv.Shutdown(shutdownCtx)
	// The DHCP servers block in a read: closing their sockets ends it.
	ls.dhcp.Close()
	ls.pxe.Close()
	wg.Wait()
	close(errs)
	var all []error
	for err := range errs {
		all = append(all, err)
	}
	return errors.Join(all...)
}

// neighbourMAC looks ip up in the kernel's IPv4 neighbour (ARP) table.
func neighbourMAC(ip netip.Addr) string {
	data, err := os.ReadFile("/proc/net/arp")
	if err != nil {
		return ""
	}
	// IP address  HW type  Flags  HW address  Mask  Device
	for _, line := range strings.Split(string(data), "\n")[1:] {
		f := strings.Fields(line)
		if len(f) >= 4 && f[0] == ip.String() && f[3] != "00:00:00:00:00:00" {
			return f[3]
		}
	}
	return ""
}

// talosCmdline is the command line of a Talos kernel: the platform, the
// default arguments of the pinned Talos release, a console unless the
// user chose one (the serial port's name differs per architecture, as in
// Talos's own metal images), then the user's own arguments.
func talosCmdline(cpu dhcp.CPU, user string) string {
	args := []string{constants.KernelParamPlatform + "=metal"}
	args = append(args, kernel.DefaultArgs(quirks.New(strings.TrimSpace(gendata.VersionTag)))...)
	if !strings.Contains(user, "console=") {
		serial := "ttyS0"
		if cpu == dhcp.ARM64 {
			serial = "ttyAMA0" // the PL011 UART of arm64 servers and QEMU's virt
		}
		args = append(args, "console=tty0", "console="+serial)
	}
	return strings.TrimSpace(strings.Join(args, " ") + " " + user)
}

// machineConfig serves a machine its config, and nobody else: the token
// must be the MAC's, and when the server can tell who is asking (the
// kernel's neighbour table for the requester's IP, else the IP it saw the
// machine at) that must be the same machine.
func (s *server) machineConfig(r httpboot.ConfigRequest) ([]byte, int) {
	mac := r.MAC.String()
	path, ok := s.configs[mac]
	if !ok {
		return nil, http.StatusNotFound
	}
	if !s.keys.Valid(r.MAC, r.Token) {
		s.log.Warn("machine config refused: wrong token", "mac", mac, "client", r.Remote)
		return nil, http.StatusForbidden
	}
	switch asker := neighbourMAC(r.Remote); {
	case asker != "" && asker != mac:
		s.log.Warn("machine config refused: asked for by another machine", "mac", mac, "client", r.Remote, "clientMAC", asker)
		return nil, http.StatusForbidden
	case asker == "":
		if m, ok := s.inv.Get(mac); ok && m.IP.IsValid() && m.IP != r.Remote {
			s.log.Warn("machine config refused: not from the machine's address", "mac", mac, "client", r.Remote, "machineIP", m.IP)
			return nil, http.StatusForbidden
		}
	}
	data, err := os.ReadFile(path)
	if err != nil {
		s.log.Error("machine config unreadable", "mac", mac, "err", err)
		return nil, http.StatusInternalServerError
	}
	s.log.Info("machine config served", "mac", mac, "client", r.Remote, "bytes", len(data))
	return data, http.StatusOK
}
