package cli

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"cozy.dev/cozy/bootstrap/netboot"
	"cozy.dev/cozy/bootstrap/rack"
	"cozy.dev/cozy/pxe"
	"cozy.dev/cozy/pxe/inventory"
	"cozy.dev/cozy/pxe/lease"
)

func newPXECommand(g *Globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "pxe",
		Short: "Netboot servers into Talos Linux (DHCP, TFTP, HTTP)",
	}
	cmd.AddCommand(newPXEServeCommand(g), newPXEMachinesCommand(g))
	return cmd
}

func newPXEMachinesCommand(g *Globals) *cobra.Command {
	stateDir := pxe.DefaultStateDir
	cmd := &cobra.Command{
		Use:   "machines",
		Short: "List the machines the netboot server has seen and how far each booted",
		Long: `List the machines a running (or stopped) cozyctl pxe serve has seen: MAC,
SMBIOS UUID, architecture, firmware, IP, vendor class, boot phase, and when
it was first and last seen. The server keeps this in its state directory and
updates it every second.

Phases, in boot order: dhcp, ipxe-binary, ipxe-script, kernel, initrd, config.`,
		Args: cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			list, err := inventory.Load(stateDir)
			if errors.Is(err, os.ErrNotExist) {
				return fmt.Errorf("no machines recorded in %s: is cozyctl pxe serve running with --state-dir %s?", stateDir, stateDir)
			}
			if err != nil {
				return err
			}
			return g.Print(machineTable(list))
		},
	}
	cmd.Flags().StringVar(&stateDir, "state-dir", stateDir, "the server's state directory")
	return cmd
}

// machineTable shows machines as a table; JSON and YAML print the list.
type machineTable []inventory.Machine

func (m machineTable) Header() []string {
	return []string{"MAC", "UUID", "ARCH", "FIRMWARE", "IP", "VENDOR CLASS", "PHASE", "ALLOWED", "INSTALLED", "FIRST SEEN", "LAST SEEN"}
}

func (m machineTable) Rows() [][]string {
	rows := make([][]string, 0, len(m))
	for _, x := range m {
		ip := ""
		if x.IP.IsValid() {
			ip = x.IP.String()
		}
		rows = append(rows, []string{x.MAC, dash(x.UUID), dash(x.Arch), dash(x.Firmware), dash(ip), dash(x.VendorClass),
			string(x.Phase), fmt.Sprint(x.Allowed), fmt.Sprint(x.Installed), x.FirstSeen.Format(time.RFC3339), x.LastSeen.Format(time.RFC3339)})
	}
	return rows
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func newPXEServeCommand(g *Globals) *cobra.Command {
	var flags pxeServeFlags
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Run the netboot server on one interface",
		Long: `Run proxyDHCP (ports 67 and 4011), TFTP and HTTP on one interface and boot
PXE clients, BIOS and UEFI, through iPXE into a kernel and initramfs; arm64
UEFI machines boot their own (--kernel-arm64, --initrd-arm64).

Proxy mode (the default) hands out no addresses: it runs beside the
network's DHCP server and only adds boot information. Full mode makes this
server the network's DHCP server: addresses from --range, leases kept in
--state-dir and never lost to a crash. More networks, behind DHCP relay
agents, get pools of their own with --pool: a relayed request is answered
from the pool of the network its relay (giaddr) is on. Only the machines listed with
--allow-mac are answered, unless --allow-unknown is given (in full mode:
every DHCP client on the interface gets an address).`,
		Example: `  # Beside an existing DHCP server:
  cozyctl pxe serve --interface br0 --kernel vmlinuz --initrd initramfs.xz \
    --cmdline "console=ttyS0" --allow-unknown

  # As the provisioning network's DHCP server:
  cozyctl pxe serve --interface br0 --mode full --range 10.8.0.100-10.8.0.199 \
    --gateway 10.8.0.1 --dns 10.8.0.1 --kernel vmlinuz --initrd initramfs.xz --allow-unknown

  # x86-64 and arm64 machines on one network, each booting its own kernel:
  cozyctl pxe serve --interface br0 --kernel vmlinuz --initrd initramfs.xz --cmdline "console=ttyS0" \
    --kernel-arm64 vmlinuz-arm64 --initrd-arm64 initramfs-arm64.xz --cmdline-arm64 "console=ttyAMA0" --allow-unknown

  # ... and of two racks behind relays:
  cozyctl pxe serve --interface br0 --mode full --range 10.8.0.100-10.8.0.199 --gateway 10.8.0.1 \
    --pool 10.80.1.0/24,10.80.1.100-10.80.1.199,gateway=10.80.1.1,dns=10.8.0.1 \
    --pool 10.80.2.0/24,10.80.2.100-10.80.2.199,gateway=10.80.2.1,dns=10.8.0.1 \
    --kernel vmlinuz --initrd initramfs.xz --allow-unknown`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := flags.config(cmd.Flags().Changed)
			if err != nil {
				return err
			}
			cfg.Log = g.Logger()
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			return pxe.Serve(ctx, cfg)
		},
	}
	flags.register(cmd)
	return cmd
}

// pxeServeFlags are pxe serve's flags: most set a pxe.Config field; the
// rest are parsed into it by config. pxe.Serve checks the result.
type pxeServeFlags struct {
	cfg                                      pxe.Config
	local                                    pxe.Network // --subnet, --gateway (--range and --dns are parsed)
	poolRange, rackFile                      string
	dns, pools, reserve, allowMACs, mconfigs []string
}

func (p *pxeServeFlags) register(cmd *cobra.Command) {
	cfg, f := &p.cfg, cmd.Flags()
	f.StringVar(&cfg.Interface, "interface", "", "boot network interface (required)")
	f.TextVar(&cfg.ServerIP, "server-ip", netip.Addr{}, "this host's IPv4 address on the interface (default: the interface's first)")
	f.IntVar(&cfg.HTTPPort, "http-port", 8080, "HTTP port for iPXE scripts and boot assets")
	f.StringVar(&cfg.Mode, "mode", "proxy", "DHCP mode: proxy (no addresses handed out) or full (this is the network's DHCP server)")
	f.StringVar(&p.poolRange, "range", "", "full mode: address pool FROM-TO")
	f.TextVar(&p.local.Subnet, "subnet", netip.Prefix{}, "full mode: the pool's network (default: the interface's); another network is served through its DHCP relay only")
	f.TextVar(&p.local.Gateway, "gateway", netip.Addr{}, "full mode: router to announce")
	f.StringArrayVar(&p.pools, "pool", nil, "full mode: one more pool, on its own network (behind a DHCP relay, or the interface's if --range is not given): SUBNET,FROM-TO[,gateway=IP][,dns=IP...] (repeatable)")
	f.StringArrayVar(&p.dns, "dns", nil, "full mode: DNS server to announce (repeatable)")
	f.DurationVar(&cfg.LeaseTime, "lease-time", time.Hour, "full mode: lease time")
	f.StringArrayVar(&p.reserve, "reserve", nil, "full mode: fixed address MAC=IP (repeatable)")
	f.StringVar(&cfg.StateDir, "state-dir", pxe.DefaultStateDir, "where the machine inventory and (full mode) leases are kept")
	f.StringVar(&cfg.Kernel, "kernel", "", "kernel to boot")
	f.StringArrayVar(&cfg.Initrds, "initrd", nil, "initramfs to boot (repeatable, loaded in order)")
	f.StringVar(&cfg.Cmdline, "cmdline", "", "kernel command line")
	f.StringVar(&cfg.ARM64.Kernel, "kernel-arm64", "", "kernel for arm64 UEFI machines (without it they boot --kernel if --ipxe-arm64 is given or --kernel is an arm64 one, else they are not answered)")
	f.StringArrayVar(&cfg.ARM64.Initrds, "initrd-arm64", nil, "initramfs for arm64 machines (repeatable, loaded in order)")
	f.StringVar(&cfg.ARM64.Cmdline, "cmdline-arm64", "", "kernel command line of arm64 machines (default: --cmdline)")
	f.BoolVar(&cfg.AllowUnknown, "allow-unknown", false, "boot every PXE client on the interface, not only --allow-mac ones")
	f.StringArrayVar(&p.allowMACs, "allow-mac", nil, "MAC address of a machine to boot (repeatable)")
	f.BoolVar(&cfg.Talos, "talos", false, "the kernel is Talos Linux: add talos.platform=metal and Talos's default kernel arguments")
	f.StringArrayVar(&p.mconfigs, "machine-config", nil, "MAC=FILE: Talos machine config served only to that machine via talos.config= (file mode 0600; implies --talos)")
	f.BoolVar(&cfg.LocalDiskAfterInstall, "local-disk-after-install", false,
		"once a machine has fetched its config and booted again, boot it from its disk (iPXE exit) instead of the network")
	f.StringVar(&cfg.BIOSBootFile, "ipxe-bios", pxe.DefaultBIOSBootFile, "iPXE binary for BIOS clients")
	f.StringVar(&cfg.UEFIBootFile, "ipxe-uefi", pxe.DefaultUEFIBootFile, "iPXE binary for x86-64 UEFI clients")
	f.StringArrayVar(&cfg.SNPOnly, "snponly", nil, "MAC or SMBIOS UUID of an x86-64 UEFI machine that loads snponly.efi (iPXE through the firmware's NIC driver) instead (repeatable)")
	f.StringVar(&cfg.SNPOnlyBootFile, "ipxe-snponly", pxe.DefaultSNPOnlyBootFile, "the snponly.efi for --snponly machines")
	f.StringVar(&cfg.ARM64BootFile, "ipxe-arm64", "", "iPXE binary for arm64 UEFI clients (default "+pxe.DefaultARM64BootFile+", from Debian 13's ipxe, when there is an arm64 kernel)")
	f.StringVar(&p.rackFile, "rack", "", "serve the machines of this rack file: its interface, DHCP mode, pool, gateway, DNS, fixed addresses and MACs (flags given too override it)")
	_ = cmd.MarkFlagFilename("rack", "yaml", "yml")
	for _, name := range []string{"kernel", "initrd", "kernel-arm64", "initrd-arm64"} {
		_ = cmd.MarkFlagFilename(name)
	}
}

// config parses the flags that need it and applies the rack, if one is
// given, where set (which flags the user gave) leaves it room.
func (p *pxeServeFlags) config(set func(string) bool) (pxe.Config, error) {
	cfg, local := p.cfg, p.local
	var relayed []pxe.Network
	var err error
	if p.poolRange != "" {
		if local.Pool, err = lease.ParsePool(p.poolRange); err != nil {
			return cfg, fmt.Errorf("--range: %w", err)
		}
	}
	for _, d := range p.dns {
		ip, err := parseIPv4("--dns", d)
		if err != nil {
			return cfg, err
		}
		local.DNS = append(local.DNS, ip)
	}
	for _, s := range p.pools {
		n, err := parsePoolFlag(s)
		if err != nil {
			return cfg, err
		}
		relayed = append(relayed, n)
	}
	if cfg.Reservations, err = parseReservations(p.reserve); err != nil {
		return cfg, err
	}
	for _, s := range p.allowMACs {
		mac, err := net.ParseMAC(s)
		if err != nil || len(mac) != 6 {
			return cfg, fmt.Errorf("--allow-mac %q: want a MAC address like 52:54:00:12:34:56", s)
		}
		cfg.AllowMACs = append(cfg.AllowMACs, mac)
	}
	for _, c := range p.mconfigs {
		mac, path, err := parseMACPair("--machine-config", c, "MAC=FILE")
		if err != nil {
			return cfg, err
		}
		if cfg.MachineConfigs == nil {
			cfg.MachineConfigs = map[string]string{}
		}
		cfg.MachineConfigs[mac] = path
	}
	if p.rackFile != "" {
		if err := applyRack(&cfg, &local, &relayed, p.rackFile, set); err != nil {
			return cfg, err
		}
	}
	// The interface's pool (or the network --subnet, --gateway or --dns
	// describe without one, which pxe.Serve refuses) comes first.
	if local.Subnet.IsValid() || local.Pool.First.IsValid() || local.Gateway.IsValid() || len(local.DNS) > 0 {
		cfg.Networks = append(cfg.Networks, local)
	}
	cfg.Networks = append(cfg.Networks, relayed...)
	return cfg, nil
}

// parseReservations reads --reserve MAC=IP flags.
func parseReservations(flags []string) (map[string]netip.Addr, error) {
	var out map[string]netip.Addr
	for _, r := range flags {
		mac, ipText, err := parseMACPair("--reserve", r, "MAC=IP, e.g. 52:54:00:12:34:56=10.8.0.21")
		if err != nil {
			return nil, err
		}
		ip, err := parseIPv4("--reserve", ipText)
		if err != nil {
			return nil, err
		}
		if out == nil {
			out = map[string]netip.Addr{}
		}
		out[mac] = ip
	}
	return out, nil
}

// applyRack fills cfg and the pools from a rack file, except what flags
// set explicitly: a flag of the interface's pool replaces that setting of
// the rack's, --pool the rack's relayed pools.
func applyRack(cfg *pxe.Config, local *pxe.Network, relayed *[]pxe.Network, file string, set func(string) bool) error {
	r, err := rack.Load(file)
	if err != nil {
		return err
	}
	base, err := netboot.Config(r)
	if err != nil {
		return err
	}
	fromRack(set, "interface", &cfg.Interface, base.Interface)
	fromRack(set, "mode", &cfg.Mode, base.Mode)
	fromRack(set, "lease-time", &cfg.LeaseTime, base.LeaseTime)
	// A full-mode rack's fixed addresses and pools, its own pool first,
	// unless --mode proxy overrides its mode.
	if len(base.Networks) > 0 && cfg.Mode == "full" {
		rl := base.Networks[0]
		fromRack(set, "reserve", &cfg.Reservations, base.Reservations)
		fromRack(set, "range", &local.Pool, rl.Pool)
		fromRack(set, "subnet", &local.Subnet, rl.Subnet)
		fromRack(set, "gateway", &local.Gateway, rl.Gateway)
		fromRack(set, "dns", &local.DNS, rl.DNS)
		fromRack(set, "pool", relayed, base.Networks[1:])
	}
	cfg.AllowMACs = append(cfg.AllowMACs, base.AllowMACs...)
	cfg.SNPOnly = append(cfg.SNPOnly, base.SNPOnly...)
	cfg.Talos = true
	return netboot.CheckBoot(r, *cfg)
}

// fromRack sets *dst to the rack's value unless the user gave flag.
func fromRack[T any](set func(string) bool, flag string, dst *T, rackValue T) {
	if !set(flag) {
		*dst = rackValue
	}
}

// parsePoolFlag reads --pool SUBNET,FROM-TO[,gateway=IP][,dns=IP...].
func parsePoolFlag(s string) (pxe.Network, error) {
	bad := func(why string) (pxe.Network, error) {
		return pxe.Network{}, fmt.Errorf("--pool %q: %s; want SUBNET,FROM-TO[,gateway=IP][,dns=IP...], e.g. 10.80.1.0/24,10.80.1.100-10.80.1.199,gateway=10.80.1.1", s, why)
	}
	parts := strings.Split(s, ",")
	if len(parts) < 2 {
		return bad("no range")
	}
	var n pxe.Network
	subnet, err := netip.ParsePrefix(parts[0])
	if err != nil || !subnet.Addr().Is4() {
		return bad(fmt.Sprintf("%q is not an IPv4 network", parts[0]))
	}
	n.Subnet = subnet.Masked()
	if n.Pool, err = lease.ParsePool(parts[1]); err != nil {
		return bad(err.Error())
	}
	for _, kv := range parts[2:] {
		key, value, _ := strings.Cut(kv, "=")
		ip, err := netip.ParseAddr(value)
		if err != nil || !ip.Is4() {
			return bad(fmt.Sprintf("%q: want %s=IPv4", kv, key))
		}
		switch {
		case key == "gateway" && !n.Gateway.IsValid():
			n.Gateway = ip
		case key == "dns":
			n.DNS = append(n.DNS, ip)
		default:
			return bad(fmt.Sprintf("%q: only gateway= (once) and dns= may follow the range", kv))
		}
	}
	return n, nil
}

func parseIPv4(flag, s string) (netip.Addr, error) {
	ip, err := netip.ParseAddr(s)
	if err != nil || !ip.Is4() {
		return netip.Addr{}, fmt.Errorf("%s %q: want an IPv4 address", flag, s)
	}
	return ip, nil
}

// parseMACPair splits "MAC=VALUE" and normalises the MAC.
func parseMACPair(flag, s, want string) (mac, value string, err error) {
	macText, value, ok := strings.Cut(s, "=")
	hw, perr := net.ParseMAC(macText)
	if !ok || perr != nil || len(hw) != 6 || value == "" {
		return "", "", fmt.Errorf("%s %q: want %s", flag, s, want)
	}
	return hw.String(), value, nil
}
