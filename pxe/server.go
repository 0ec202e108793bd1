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

// Serve runs the netboot server until ctx ends, then shuts it down: HTTP
// downloads in flight get 10 s to finish, TFTP transfers are cut (PXE ROMs
// retry), and the inventory is flushed.
func Serve(ctx context.Context, cfg Config) error {
	p, err := cfg.resolve()
	if err != nil {
		return err
	}
	s, err := newServer(p)
	if err != nil {
		return err
	}
	defer s.close()
	return s.run(ctx)
}

// server is one run of the netboot server: what it serves and the state it
// keeps, wired to the dhcp, tftp and httpboot packages by its methods.
type server struct {
	cfg  plan
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

func newServer(cfg plan) (*server, error) {
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
	for i, n := range cfg.Networks {
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
		b.Cmdline = TalosCmdline(cpu, img.Cmdline)
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
	for i, n := range cfg.Networks {
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

// TalosCmdline is the command line of a Talos kernel: the platform, the
// default arguments of the pinned Talos release, a console unless the
// user chose one (the serial port's name differs per architecture, as in
// Talos's own metal images), then the user's own arguments.
func TalosCmdline(cpu dhcp.CPU, user string) string {
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
