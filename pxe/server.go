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
	"sync"
	"time"

	"github.com/insomniacslk/dhcp/dhcpv4"
	"github.com/insomniacslk/dhcp/dhcpv4/server4"

	"cozy.dev/cozy/pxe/dhcp"
	"cozy.dev/cozy/pxe/httpboot"
	"cozy.dev/cozy/pxe/ipxe"
	"cozy.dev/cozy/pxe/tftp"
)

// Debian's ipxe package paths, the default iPXE binaries.
const (
	DefaultBIOSBootFile = "/usr/lib/ipxe/undionly.kpxe"
	DefaultUEFIBootFile = "/usr/lib/ipxe/ipxe.efi"
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

	// Kernel and Initrds are files to boot; Cmdline is the kernel command line.
	Kernel  string
	Initrds []string
	Cmdline string

	// AllowUnknown boots every PXE client on the interface. Without it
	// only AllowMACs are answered.
	AllowUnknown bool
	AllowMACs    []net.HardwareAddr

	// BIOSBootFile and UEFIBootFile are iPXE binaries (Debian's by default);
	// ARM64BootFile is optional.
	BIOSBootFile, UEFIBootFile, ARM64BootFile string

	Log *slog.Logger
}

func (c *Config) setDefaults() error {
	if c.Log == nil {
		c.Log = slog.New(slog.DiscardHandler)
	}
	if c.HTTPPort == 0 {
		c.HTTPPort = 8080
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
	if c.ARM64BootFile != "" {
		if _, err := os.Stat(c.ARM64BootFile); err != nil {
			return fmt.Errorf("arm64 boot file: %w", err)
		}
	}
	if !c.AllowUnknown && len(c.AllowMACs) == 0 {
		return errors.New("no machine may boot: list machines or pass --allow-unknown to boot every PXE client on the interface")
	}
	if !c.ServerIP.IsValid() {
		ip, err := interfaceIPv4(c.Interface)
		if err != nil {
			return err
		}
		c.ServerIP = ip
	}
	return nil
}

func interfaceIPv4(name string) (netip.Addr, error) {
	iface, err := net.InterfaceByName(name)
	if err != nil {
		return netip.Addr{}, fmt.Errorf("interface %s: %w", name, err)
	}
	addrs, err := iface.Addrs()
	if err != nil {
		return netip.Addr{}, fmt.Errorf("addresses of %s: %w", name, err)
	}
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok {
			if ip, ok := netip.AddrFromSlice(n.IP); ok && ip.Unmap().Is4() {
				return ip.Unmap(), nil
			}
		}
	}
	return netip.Addr{}, fmt.Errorf("interface %s has no IPv4 address: give the server one or pass --server-ip", name)
}

// Serve runs the netboot server until ctx ends, then shuts it down: HTTP
// and TFTP transfers in flight get a grace period to finish.
func Serve(ctx context.Context, cfg Config) error {
	if err := cfg.setDefaults(); err != nil {
		return err
	}
	log := cfg.Log
	base := fmt.Sprintf("http://%s", netip.AddrPortFrom(cfg.ServerIP, uint16(cfg.HTTPPort)))

	assets := map[string]string{"kernel": cfg.Kernel}
	boot := ipxe.Boot{KernelURL: base + "/assets/kernel", Cmdline: cfg.Cmdline}
	for i, p := range cfg.Initrds {
		name := fmt.Sprintf("initrd%d", i)
		assets[name] = p
		boot.InitrdURLs = append(boot.InitrdURLs, base+"/assets/"+name)
	}
	script, err := ipxe.Script(boot)
	if err != nil {
		return err
	}
	bootFiles := map[string]string{
		filepath.Base(cfg.BIOSBootFile): cfg.BIOSBootFile,
		filepath.Base(cfg.UEFIBootFile): cfg.UEFIBootFile,
	}
	files := dhcp.BootFiles{BIOS: filepath.Base(cfg.BIOSBootFile), UEFIAMD64: filepath.Base(cfg.UEFIBootFile)}
	if cfg.ARM64BootFile != "" {
		// Its Debian-style name (ipxe.efi) would clash with the x86 one.
		bootFiles["ipxe-arm64.efi"] = cfg.ARM64BootFile
		files.UEFIARM64 = "ipxe-arm64.efi"
	}
	allowed := func(mac net.HardwareAddr) bool {
		if cfg.AllowUnknown {
			return true
		}
		for _, m := range cfg.AllowMACs {
			if bytes.Equal(m, mac) {
				return true
			}
		}
		return false
	}
	proxy, err := dhcp.NewProxy(dhcp.Config{
		ServerIP: cfg.ServerIP,
		HTTPPort: cfg.HTTPPort,
		Files:    files,
		Allow:    func(c dhcp.Client) bool { return allowed(c.MAC) },
	})
	if err != nil {
		return err
	}

	// Open every socket before serving any, so a port in use fails fast.
	dhcpConn, err := server4.NewIPv4UDPConn(cfg.Interface, &net.UDPAddr{Port: dhcp.PortDHCP})
	if err != nil {
		return fmt.Errorf("listen for DHCP on %s:67 (needs root or CAP_NET_BIND_SERVICE+CAP_NET_RAW): %w", cfg.Interface, err)
	}
	defer dhcpConn.Close()
	pxeConn, err := server4.NewIPv4UDPConn(cfg.Interface, &net.UDPAddr{Port: dhcp.PortPXE})
	if err != nil {
		return fmt.Errorf("listen for PXE on %s:4011: %w", cfg.Interface, err)
	}
	defer pxeConn.Close()
	tftpConn, err := net.ListenPacket("udp4", netip.AddrPortFrom(cfg.ServerIP, 69).String())
	if err != nil {
		return fmt.Errorf("listen for TFTP on %s:69: %w", cfg.ServerIP, err)
	}
	defer tftpConn.Close()
	httpLn, err := net.Listen("tcp4", netip.AddrPortFrom(cfg.ServerIP, uint16(cfg.HTTPPort)).String())
	if err != nil {
		return fmt.Errorf("listen for HTTP on %s:%d: %w", cfg.ServerIP, cfg.HTTPPort, err)
	}
	httpSrv := &http.Server{
		Handler: (&httpboot.Server{
			Script: func(mac net.HardwareAddr) (string, bool) {
				if !allowed(mac) {
					return "", false
				}
				log.Info("ipxe script", "mac", mac.String())
				return script, true
			},
			Assets:    assets,
			BootFiles: bootFiles,
			Log:       log.With("service", "http"),
		}).Handler(),
		ReadHeaderTimeout: 10 * time.Second,
	}

	log.Info("netboot server up", "interface", cfg.Interface, "ip", cfg.ServerIP, "http", base,
		"mode", "proxy", "allowUnknown", cfg.AllowUnknown, "machines", len(cfg.AllowMACs))

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	run := func(name string, f func() error) {
		wg.Go(func() {
			if err := f(); err != nil && ctx.Err() == nil {
				errs <- fmt.Errorf("%s: %w", name, err)
				cancel()
			}
		})
	}
	dhcpLog := log.With("service", "dhcp")
	run("dhcp", func() error { return serveDHCP(ctx, dhcpConn, proxy, dhcp.PortDHCP, dhcpLog) })
	run("pxe", func() error { return serveDHCP(ctx, pxeConn, proxy, dhcp.PortPXE, dhcpLog) })
	run("tftp", func() error {
		return (&tftp.Server{Files: bootFiles, Log: log.With("service", "tftp")}).Serve(ctx, tftpConn)
	})
	run("http", func() error {
		if err := httpSrv.Serve(httpLn); !errors.Is(err, http.ErrServerClosed) {
			return err
		}
		return nil
	})

	<-ctx.Done()
	log.Info("netboot server stopping")
	shutdownCtx, stop := context.WithTimeout(context.Background(), 10*time.Second)
	defer stop()
	_ = httpSrv.Shutdown(shutdownCtx)
	dhcpConn.Close()
	pxeConn.Close()
	wg.Wait()
	close(errs)
	return errors.Join(collect(errs)...)
}

func collect(errs <-chan error) []error {
	var out []error
	for err := range errs {
		out = append(out, err)
	}
	return out
}

// serveDHCP reads requests from conn and sends the proxy's replies: to the
// relay if there is one, else broadcast on the bound interface (the client
// has no address yet) or, on 4011, back to the sender.
func serveDHCP(ctx context.Context, conn *net.UDPConn, proxy *dhcp.Proxy, port int, log *slog.Logger) error {
	buf := make([]byte, 4096)
	for {
		n, peer, err := conn.ReadFromUDP(buf)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		req, err := dhcpv4.FromBytes(buf[:n])
		if err != nil {
			log.Debug("malformed DHCP packet", "from", peer, "err", err)
			continue
		}
		reply, outcome, err := proxy.Reply(req, port)
		if err != nil {
			log.Warn("dhcp request rejected", "mac", req.ClientHWAddr.String(), "port", port, "err", err)
			continue
		}
		if reply == nil {
			log.Debug("dhcp request ignored", "mac", req.ClientHWAddr.String(), "port", port, "outcome", outcome)
			continue
		}
		dst := &net.UDPAddr{IP: net.IPv4bcast, Port: dhcpv4.ClientPort}
		switch {
		case !req.GatewayIPAddr.IsUnspecified() && req.GatewayIPAddr != nil:
			dst = &net.UDPAddr{IP: req.GatewayIPAddr, Port: dhcpv4.ServerPort}
		case port == dhcp.PortPXE:
			dst = peer
		}
		if _, err := conn.WriteToUDP(reply.ToBytes(), dst); err != nil {
			log.Warn("dhcp send", "to", dst, "err", err)
			continue
		}
		log.Info("dhcp reply", "mac", req.ClientHWAddr.String(), "port", port, "outcome", outcome, "file", reply.BootFileName, "to", dst)
	}
}
