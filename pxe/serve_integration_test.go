//go:build integration

package pxe_test

import (
	"bytes"
	"context"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/insomniacslk/dhcp/dhcpv4"
	"github.com/insomniacslk/dhcp/dhcpv4/nclient4"
	"github.com/insomniacslk/dhcp/iana"
	"github.com/pin/tftp/v3"

	"cozy.dev/cozy/internal/testing/cozyctl"
	"cozy.dev/cozy/internal/testing/netnstest"
	"cozy.dev/cozy/internal/testing/syncbuf"
)

const (
	serverAddr = "10.77.0.1"
	clientAddr = "10.77.0.2"
)

var clientMAC = net.HardwareAddr{0x52, 0x54, 0x00, 0xc0, 0x21, 0x01}

type rig struct {
	srv, cli *netnstest.NS
	// httpFrom is where HTTP requests start: the server's namespace until
	// the client has an address.
	httpFrom *netnstest.NS
	dir      string // files served
	state    string // the server's --state-dir
	stderr   *syncbuf.Buffer
	kernel   []byte
}

// newRig makes a server namespace and a client namespace joined by a veth
// pair, and the files to serve.
func newRig(t *testing.T) *rig {
	t.Helper()
	srv := netnstest.New(t, "srv")
	cliNS := netnstest.New(t, "cli")
	netnstest.Veth(t, srv, "boot0", serverAddr+"/24", cliNS, "eth0", "")
	r := &rig{srv: srv, cli: cliNS, httpFrom: srv, dir: t.TempDir(), kernel: bytes.Repeat([]byte("K"), 1<<20)}
	r.state = filepath.Join(r.dir, "state")
	for name, content := range map[string][]byte{"vmlinuz": r.kernel, "initrd": []byte("initramfs"), "undionly.kpxe": []byte("bios-ipxe"), "ipxe.efi": []byte("uefi-ipxe")} {
		if err := os.WriteFile(filepath.Join(r.dir, name), content, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return r
}

// proc is one run of `cozyctl pxe serve`.
type proc struct {
	cmd    *exec.Cmd
	exited chan error
	stderr *syncbuf.Buffer
	done   bool
}

// start runs `cozyctl pxe serve` in the server namespace and waits until
// HTTP answers. At the end of the test it is stopped with SIGTERM and must
// exit cleanly.
func (r *rig) start(t *testing.T, extra ...string) *proc {
	t.Helper()
	args := append([]string{"pxe", "serve", "--log-level", "debug",
		"--interface", "boot0", "--state-dir", r.state,
		"--kernel", filepath.Join(r.dir, "vmlinuz"), "--initrd", filepath.Join(r.dir, "initrd"),
		"--cmdline", "console=ttyS0",
		"--ipxe-bios", filepath.Join(r.dir, "undionly.kpxe"), "--ipxe-uefi", filepath.Join(r.dir, "ipxe.efi"),
	}, extra...)
	p := &proc{cmd: r.srv.Command(context.Background(), cozyctl.Path(t), args...), exited: make(chan error, 1), stderr: &syncbuf.Buffer{}}
	p.cmd.Stderr = p.stderr
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	r.stderr = p.stderr
	go func() { p.exited <- p.cmd.Wait() }()
	t.Cleanup(func() { p.stop(t) })

	deadline := time.Now().Add(30 * time.Second)
	for {
		if resp, err := r.get("/healthz", ""); err == nil {
			resp.Body.Close()
			return p
		}
		select {
		case err := <-p.exited:
			t.Fatalf("server exited: %v\n%s", err, p.stderr)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("server not ready after 30s\n%s", p.stderr)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// stop sends SIGTERM and requires a clean exit.
func (p *proc) stop(t *testing.T) {
	if p.done {
		return
	}
	p.done = true
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-p.exited:
		if err != nil {
			t.Errorf("server did not exit cleanly on SIGTERM: %v\n%s", err, p.stderr)
		}
	case <-time.After(20 * time.Second):
		_ = p.cmd.Process.Kill()
		t.Errorf("server ignored SIGTERM for 20s\n%s", p.stderr)
	}
}

// kill9 ends the server the way a crash or power loss would.
func (p *proc) kill9() {
	p.done = true
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	<-p.exited
}

// startServer is newRig + start, for tests that need one server run.
func startServer(t *testing.T, extra ...string) *rig {
	t.Helper()
	r := newRig(t)
	r.start(t, extra...)
	return r
}

// get fetches a path from the server's HTTP port.
func (r *rig) get(path, rangeHdr string) (*http.Response, error) {
	c := &http.Client{Transport: &http.Transport{DialContext: r.httpFrom.DialContext}, Timeout: 10 * time.Second}
	req, _ := http.NewRequest("GET", "http://"+serverAddr+":8080"+path, nil)
	if rangeHdr != "" {
		req.Header.Set("Range", rangeHdr)
	}
	return c.Do(req)
}

func pxeDiscover(arch iana.Arch, ipxe bool) []dhcpv4.Modifier {
	mods := []dhcpv4.Modifier{
		dhcpv4.WithOption(dhcpv4.OptClassIdentifier("PXEClient:Arch:00000:UNDI:002001")),
		dhcpv4.WithOption(dhcpv4.OptClientArch(arch)),
	}
	if ipxe {
		mods = append(mods, dhcpv4.WithGeneric(dhcpv4.OptionUserClassInformation, []byte("iPXE")))
	}
	return mods
}

// discover broadcasts a DHCPDISCOVER from the client namespace with
// nclient4 and returns the offer, or an error after the timeout.
func (r *rig) discover(t *testing.T, mac net.HardwareAddr, mods ...dhcpv4.Modifier) (*dhcpv4.DHCPv4, error) {
	t.Helper()
	c := r.dhcpClient(t, mac)
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return c.DiscoverOffer(ctx, mods...)
}

// dhcpClient is an nclient4 client on the client namespace's eth0.
func (r *rig) dhcpClient(t *testing.T, mac net.HardwareAddr) *nclient4.Client {
	t.Helper()
	var c *nclient4.Client
	if err := r.cli.Do(func() error {
		var err error
		c, err = nclient4.New("eth0", nclient4.WithHWAddr(mac), nclient4.WithTimeout(2*time.Second), nclient4.WithRetry(1))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	return c
}

func TestServeProxyDHCP(t *testing.T) {
	r := startServer(t, "--allow-mac", clientMAC.String())

	tests := []struct {
		name     string
		mac      net.HardwareAddr
		mods     []dhcpv4.Modifier
		wantFile string // "" = no offer expected
	}{
		{"BIOS ROM", clientMAC, pxeDiscover(iana.INTEL_X86PC, false), "undionly.kpxe"},
		{"UEFI x64", clientMAC, pxeDiscover(iana.EFI_X86_64, false), "ipxe.efi"},
		{"iPXE", clientMAC, pxeDiscover(iana.INTEL_X86PC, true), "http://10.77.0.1:8080/ipxe/52-54-00-c0-21-01.ipxe"},
		{"machine not in the allow list", net.HardwareAddr{0x52, 0x54, 0, 0xde, 0xad, 0x01}, pxeDiscover(iana.INTEL_X86PC, false), ""},
		{"ordinary DHCP client", clientMAC, nil, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			offer, err := r.discover(t, tc.mac, tc.mods...)
			if tc.wantFile == "" {
				if err == nil {
					t.Fatalf("got an offer, want silence: %s", offer.Summary())
				}
				return
			}
			if err != nil {
				t.Fatalf("no offer: %v\n%s", err, r.stderr)
			}
			if offer.BootFileName != tc.wantFile || !offer.ServerIPAddr.Equal(net.ParseIP(serverAddr)) {
				t.Errorf("offer file %q next-server %v, want %q from %s", offer.BootFileName, offer.ServerIPAddr, tc.wantFile, serverAddr)
			}
			if !offer.YourIPAddr.IsUnspecified() {
				t.Errorf("proxy mode handed out %v", offer.YourIPAddr)
			}
		})
	}
}

func TestServeBootServerTFTPAndHTTP(t *testing.T) {
	r := startServer(t, "--allow-mac", clientMAC.String())
	r.cli.IP(t, "addr", "add", clientAddr+"/24", "dev", "eth0")
	r.httpFrom = r.cli

	// The PXE boot-server request on 4011, as OVMF sends it after DHCP.
	req, err := dhcpv4.New(dhcpv4.WithMessageType(dhcpv4.MessageTypeRequest), dhcpv4.WithHwAddr(clientMAC),
		dhcpv4.WithClientIP(net.ParseIP(clientAddr)))
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range pxeDiscover(iana.EFI_X86_64, false) {
		m(req)
	}
	var ack *dhcpv4.DHCPv4
	err = r.cli.Do(func() error {
		conn, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.ParseIP(clientAddr)})
		if err != nil {
			return err
		}
		defer conn.Close()
		if _, err := conn.WriteToUDP(req.ToBytes(), &net.UDPAddr{IP: net.ParseIP(serverAddr), Port: 4011}); err != nil {
			return err
		}
		_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
		buf := make([]byte, 1500)
		n, err := conn.Read(buf)
		if err != nil {
			return err
		}
		ack, err = dhcpv4.FromBytes(buf[:n])
		return err
	})
	if err != nil {
		t.Fatalf("boot-server request: %v\n%s", err, r.stderr)
	}
	if ack.MessageType() != dhcpv4.MessageTypeAck || ack.BootFileName != "ipxe.efi" {
		t.Errorf("4011 answer: %s", ack.Summary())
	}

	// TFTP: the file the offer named, with tsize, as a firmware fetches it.
	var got bytes.Buffer
	err = r.cli.Do(func() error {
		c, err := tftp.NewClient(serverAddr + ":69")
		if err != nil {
			return err
		}
		c.RequestTSize(true)
		wt, err := c.Receive("undionly.kpxe", "octet")
		if err != nil {
			return err
		}
		_, err = wt.WriteTo(&got)
		return err
	})
	if err != nil || got.String() != "bios-ipxe" {
		t.Fatalf("tftp: %q, %v", got.String(), err)
	}

	// HTTP: the iPXE script points at assets that download, also in parts.
	resp, err := r.get("/ipxe/52-54-00-c0-21-01.ipxe", "")
	if err != nil {
		t.Fatal(err)
	}
	script, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	want := "kernel --name kernel http://10.77.0.1:8080/assets/kernel initrd=initrd0 console=ttyS0\n"
	if resp.StatusCode != 200 || !strings.Contains(string(script), want) {
		t.Fatalf("script %d:\n%s\nwant a line %q", resp.StatusCode, script, want)
	}
	resp, err = r.get("/assets/kernel", "bytes=1000-")
	if err != nil {
		t.Fatal(err)
	}
	part, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusPartialContent || !bytes.Equal(part, r.kernel[1000:]) {
		t.Errorf("kernel range: status %d, %d bytes", resp.StatusCode, len(part))
	}
	if resp, err := r.get("/ipxe/52-54-00-de-ad-01.ipxe", ""); err != nil || resp.StatusCode != 404 {
		t.Errorf("script for a machine not allowed: %v %v", resp.StatusCode, err)
	}

	// Everything above, as Prometheus sees it.
	metrics := r.metrics(t)
	for _, want := range []string{
		`cozy_pxe_dhcp_packets_total{outcome="ack",port="4011",type="REQUEST"} 1`,
		`cozy_pxe_tftp_transfers_total{result="sent"} 1`,
		`cozy_pxe_tftp_bytes_total 9`,
		`cozy_pxe_http_requests_total{code="206",kind="asset"} 1`,
		`cozy_pxe_http_requests_total{code="404",kind="script"} 1`,
		`cozy_pxe_machines{phase="kernel"} 1`, // the Range request reached the end of the kernel
	} {
		if !strings.Contains(metrics, want+"\n") {
			t.Errorf("/metrics lacks %s", want)
		}
	}
}

func (r *rig) metrics(t *testing.T) string {
	t.Helper()
	resp, err := r.get("/metrics", "")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

func TestServeRefusesToAnswerEveryone(t *testing.T) {
	srv := netnstest.New(t, "srv")
	dir := t.TempDir()
	for _, f := range []string{"k", "i"} {
		_ = os.WriteFile(filepath.Join(dir, f), []byte("x"), 0o644)
	}
	cmd := srv.Command(context.Background(), cozyctl.Path(t), "pxe", "serve", "--interface", "lo",
		"--kernel", filepath.Join(dir, "k"), "--initrd", filepath.Join(dir, "i"))
	out, err := cmd.CombinedOutput()
	if err == nil || !strings.Contains(string(out), "--allow-unknown") {
		t.Fatalf("want a refusal naming --allow-unknown, got %v: %s", err, out)
	}
}

// SIGTERM lets a download in flight finish (within the grace period) and
// the server exit 0.
func TestServeShutdownFinishesDownloads(t *testing.T) {
	r := newRig(t)
	big := filepath.Join(r.dir, "big-initrd")
	f, err := os.Create(big)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(32 << 20); err != nil {
		t.Fatal(err)
	}
	f.Close()
	p := r.start(t, "--allow-unknown", "--initrd", big)

	resp, err := r.get("/assets/initrd1", "")
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("start download: %v %v", resp, err)
	}
	defer resp.Body.Close()
	buf := make([]byte, 1<<20)
	n, _ := io.ReadFull(resp.Body, buf)
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	total := int64(n)
	for { // a slow client: the rest in 1 MiB reads with pauses
		time.Sleep(20 * time.Millisecond)
		n, err := io.ReadFull(resp.Body, buf)
		total += int64(n)
		if err != nil {
			break
		}
	}
	if total != 32<<20 {
		t.Errorf("download cut at %d of %d bytes by shutdown", total, 32<<20)
	}
	select {
	case err := <-p.exited:
		p.done = true
		if err != nil {
			t.Errorf("exit after SIGTERM: %v\n%s", err, p.stderr)
		}
	case <-time.After(20 * time.Second):
		t.Errorf("server still running 20 s after SIGTERM\n%s", p.stderr)
	}
}
