package cli

import (
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"

	"cozy.dev/cozy/pxe"
)

func newPXECommand(g *Globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "pxe",
		Short: "Netboot servers into Talos Linux (DHCP, TFTP, HTTP)",
	}
	cmd.AddCommand(newPXEServeCommand(g))
	return cmd
}

func newPXEServeCommand(g *Globals) *cobra.Command {
	var (
		cfg       pxe.Config
		serverIP  string
		mode      string
		allowMACs []string
	)
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Run the netboot server on one interface",
		Long: `Run proxyDHCP (ports 67 and 4011), TFTP and HTTP on one interface and boot
PXE clients, BIOS and UEFI, through iPXE into a kernel and initramfs.

Proxy mode hands out no addresses: it runs beside the network's DHCP server
and only adds boot information. Only the machines listed with --allow-mac
are answered, unless --allow-unknown is given.`,
		Example: `  cozyctl pxe serve --interface br0 --kernel vmlinuz --initrd initramfs.xz \
    --cmdline "console=ttyS0" --allow-unknown`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if mode != "proxy" {
				return fmt.Errorf("--mode %s: only proxy mode is available in this version; full DHCP mode (address pool, leases) is not implemented yet", mode)
			}
			if serverIP != "" {
				ip, err := netip.ParseAddr(serverIP)
				if err != nil || !ip.Is4() {
					return fmt.Errorf("--server-ip %q: want an IPv4 address", serverIP)
				}
				cfg.ServerIP = ip
			}
			for _, s := range allowMACs {
				mac, err := net.ParseMAC(s)
				if err != nil || len(mac) != 6 {
					return fmt.Errorf("--allow-mac %q: want a MAC address like 52:54:00:12:34:56", s)
				}
				cfg.AllowMACs = append(cfg.AllowMACs, mac)
			}
			cfg.Log = g.Logger()
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			return pxe.Serve(ctx, cfg)
		},
	}
	f := cmd.Flags()
	f.StringVar(&cfg.Interface, "interface", "", "boot network interface (required)")
	f.StringVar(&serverIP, "server-ip", "", "this host's IPv4 address on the interface (default: the interface's first)")
	f.IntVar(&cfg.HTTPPort, "http-port", 8080, "HTTP port for iPXE scripts and boot assets")
	f.StringVar(&mode, "mode", "proxy", "DHCP mode: proxy (no addresses handed out)")
	f.StringVar(&cfg.Kernel, "kernel", "", "kernel to boot")
	f.StringArrayVar(&cfg.Initrds, "initrd", nil, "initramfs to boot (repeatable, loaded in order)")
	f.StringVar(&cfg.Cmdline, "cmdline", "", "kernel command line")
	f.BoolVar(&cfg.AllowUnknown, "allow-unknown", false, "boot every PXE client on the interface, not only --allow-mac ones")
	f.StringArrayVar(&allowMACs, "allow-mac", nil, "MAC address of a machine to boot (repeatable)")
	f.StringVar(&cfg.BIOSBootFile, "ipxe-bios", pxe.DefaultBIOSBootFile, "iPXE binary for BIOS clients")
	f.StringVar(&cfg.UEFIBootFile, "ipxe-uefi", pxe.DefaultUEFIBootFile, "iPXE binary for x86-64 UEFI clients (snponly.efi uses the firmware's NIC driver)")
	f.StringVar(&cfg.ARM64BootFile, "ipxe-arm64", "", "iPXE binary for arm64 UEFI clients (none by default)")
	_ = cmd.MarkFlagRequired("interface")
	_ = cmd.MarkFlagFilename("kernel")
	_ = cmd.MarkFlagFilename("initrd")
	return cmd
}
