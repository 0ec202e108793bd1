package pxe

import (
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/insomniacslk/dhcp/dhcpv4"
	"github.com/insomniacslk/dhcp/iana"

	"cozy.dev/cozy/internal/kernelimage"
	"cozy.dev/cozy/pxe/dhcp"
	"cozy.dev/cozy/pxe/inventory"
)

// bootFiles writes stand-ins for the files a server serves into a new
// directory and returns it.
func bootFiles(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	for _, name := range []string{"vmlinuz", "initrd", "vmlinuz-arm64", "initrd-arm64", "undionly.kpxe", "ipxe.efi", "ipxe-arm64.efi"} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(name), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// startServer checks cfg and makes a server of it (no sockets), closed
// when the test ends.
func startServer(t *testing.T, cfg Config) *server {
	t.Helper()
	p, err := cfg.resolve()
	if err != nil {
		t.Fatal(err)
	}
	s, err := newServer(p)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.close)
	return s
}

func archConfig(dir string) Config {
	return Config{
		Interface: "boot0", ServerIP: netip.MustParseAddr("10.77.0.1"), StateDir: filepath.Join(dir, "state"), AllowUnknown: true,
		Kernel: filepath.Join(dir, "vmlinuz"), Initrds: []string{filepath.Join(dir, "initrd")}, Cmdline: "console=ttyS0",
		BIOSBootFile: filepath.Join(dir, "undionly.kpxe"), UEFIBootFile: filepath.Join(dir, "ipxe.efi"),
	}
}

func TestResolveARM64(t *testing.T) {
	dir := bootFiles(t)
	arm := kernelimage.Image{Kernel: filepath.Join(dir, "vmlinuz-arm64"), Initrds: []string{filepath.Join(dir, "initrd-arm64")}}
	// An arm64 Image as the only kernel: its header says so.
	image := make([]byte, 0x400)
	copy(image[0x38:], "ARM\x64")
	armImage := filepath.Join(dir, "Image")
	if err := os.WriteFile(armImage, image, 0o644); err != nil {
		t.Fatal(err)
	}
	main := kernelimage.Image{Kernel: filepath.Join(dir, "vmlinuz"), Initrds: []string{filepath.Join(dir, "initrd")}, Cmdline: "console=ttyS0"}
	tests := []struct {
		name        string
		cfg         func(*Config)
		haveDefault bool // DefaultARM64BootFile exists (Debian 13's ipxe)
		wantErr     string
		want        kernelimage.Image // ARM64 afterwards
		wantFile    string            // ARM64BootFile afterwards
	}{
		{name: "x86 only: arm64 machines are not answered", cfg: func(*Config) {}, haveDefault: true},
		{name: "an arm64 kernel and Debian's iPXE", cfg: func(c *Config) { c.ARM64 = arm }, haveDefault: true,
			want: kernelimage.Image{Kernel: arm.Kernel, Initrds: arm.Initrds, Cmdline: "console=ttyS0"}, wantFile: "default"},
		{name: "an arm64 kernel, its own command line and iPXE", cfg: func(c *Config) {
			c.ARM64 = arm
			c.ARM64.Cmdline = "console=ttyAMA0"
			c.ARM64BootFile = filepath.Join(dir, "ipxe-arm64.efi")
		}, want: kernelimage.Image{Kernel: arm.Kernel, Initrds: arm.Initrds, Cmdline: "console=ttyAMA0"}, wantFile: filepath.Join(dir, "ipxe-arm64.efi")},
		{name: "an arm64 iPXE alone: the one kernel boots every client", cfg: func(c *Config) { c.ARM64BootFile = filepath.Join(dir, "ipxe-arm64.efi") },
			want: main, wantFile: filepath.Join(dir, "ipxe-arm64.efi")},
		{name: "the one kernel is arm64, and Debian's arm64 iPXE is there", cfg: func(c *Config) { c.Kernel = armImage }, haveDefault: true,
			want: kernelimage.Image{Kernel: armImage, Initrds: main.Initrds, Cmdline: main.Cmdline}, wantFile: "default"},
		{name: "the one kernel is arm64, no arm64 iPXE: not answered", cfg: func(c *Config) { c.Kernel = armImage }},
		{name: "no arm64 iPXE anywhere", cfg: func(c *Config) { c.ARM64 = arm }, wantErr: "no iPXE for arm64 UEFI"},
		{name: "an arm64 kernel without an initramfs", cfg: func(c *Config) { c.ARM64.Kernel = arm.Kernel }, haveDefault: true,
			wantErr: "--initrd-arm64"},
		{name: "an arm64 initramfs without a kernel", cfg: func(c *Config) { c.ARM64.Initrds = arm.Initrds }, wantErr: "--kernel-arm64"},
		{name: "a missing arm64 kernel", cfg: func(c *Config) {
			c.ARM64 = arm
			c.ARM64.Kernel = filepath.Join(dir, "nope")
		}, haveDefault: true, wantErr: "arm64 boot file"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			defaultARM64BootFile = filepath.Join(dir, "absent.efi")
			if tc.haveDefault {
				defaultARM64BootFile = filepath.Join(dir, "ipxe-arm64.efi")
			}
			t.Cleanup(func() { defaultARM64BootFile = DefaultARM64BootFile })
			cfg := archConfig(dir)
			tc.cfg(&cfg)
			p, err := cfg.resolve()
			if failed(t, err, tc.wantErr) {
				return
			}
			wantFile := tc.wantFile
			if wantFile == "default" {
				wantFile = defaultARM64BootFile
			}
			if fmt.Sprint(p.ARM64) != fmt.Sprint(tc.want) || p.ARM64BootFile != wantFile {
				t.Errorf("arm64 machines boot %+v with iPXE %q, want %+v with %q", p.ARM64, p.ARM64BootFile, tc.want, wantFile)
			}
		})
	}
}

// TestScriptByArch: each machine's iPXE script loads the kernel of the
// architecture its DHCP requests named.
func TestScriptByArch(t *testing.T) {
	x86 := net.HardwareAddr{0x52, 0x54, 0, 0, 0, 1}
	arm := net.HardwareAddr{0x52, 0x54, 0, 0, 0, 2}
	unseen := net.HardwareAddr{0x52, 0x54, 0, 0, 0, 3}
	tests := []struct {
		name    string
		arm64   bool // the server has an arm64 kernel
		talos   bool
		mac     net.HardwareAddr
		want    []string // in the script
		wantNot []string
		refused bool
	}{
		{name: "x86", arm64: true, mac: x86, want: []string{"/assets/kernel ", "/assets/initrd0", "console=ttyS0"}, wantNot: []string{"arm64"}},
		{name: "arm64", arm64: true, mac: arm, want: []string{"/assets/arm64-kernel ", "/assets/arm64-initrd0", "console=ttyAMA0"}, wantNot: []string{"/assets/kernel ", "ttyS0"}},
		{name: "not seen by DHCP: x86", arm64: true, mac: unseen, want: []string{"/assets/kernel "}},
		{name: "arm64 without an arm64 kernel", mac: arm, refused: true},
		{name: "Talos on arm64: its serial console", arm64: true, talos: true, mac: arm,
			want: []string{"/assets/arm64-kernel ", "talos.platform=metal", "console=tty0 console=ttyAMA0", "pti=on"}, wantNot: []string{"ttyS0"}},
		{name: "Talos on x86", arm64: true, talos: true, mac: x86, want: []string{"/assets/kernel ", "console=tty0 console=ttyS0"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dir := bootFiles(t)
			cfg := archConfig(dir)
			cfg.Cmdline = ""
			cfg.Talos = tc.talos
			if !tc.talos {
				cfg.Cmdline = "console=ttyS0"
			}
			if tc.arm64 {
				cfg.ARM64 = kernelimage.Image{Kernel: filepath.Join(dir, "vmlinuz-arm64"), Initrds: []string{filepath.Join(dir, "initrd-arm64")}}
				cfg.ARM64BootFile = filepath.Join(dir, "ipxe-arm64.efi")
				if !tc.talos {
					cfg.ARM64.Cmdline = "console=ttyAMA0"
				}
			}
			s := startServer(t, cfg)
			s.inv.SawDHCP(inventory.DHCPSighting{MAC: x86.String(), Arch: string(dhcp.AMD64), Firmware: string(dhcp.UEFI), Allowed: true, Answered: true})
			s.inv.SawDHCP(inventory.DHCPSighting{MAC: arm.String(), Arch: string(dhcp.ARM64), Firmware: string(dhcp.UEFI), Allowed: true, Answered: tc.arm64})
			script, ok := s.script(tc.mac)
			if ok == tc.refused {
				t.Fatalf("script served: %v, want %v:\n%s", ok, !tc.refused, script)
			}
			for _, w := range tc.want {
				if !strings.Contains(script, w) {
					t.Errorf("script lacks %q:\n%s", w, script)
				}
			}
			for _, w := range tc.wantNot {
				if strings.Contains(script, w) {
					t.Errorf("script has %q:\n%s", w, script)
				}
			}
		})
	}
}

// TestSNPOnly: machines named by MAC or SMBIOS UUID load snponly.efi,
// x86-64 UEFI only; everyone else gets the usual iPXE.
func TestSNPOnly(t *testing.T) {
	dir := bootFiles(t)
	if err := os.WriteFile(filepath.Join(dir, "snponly.efi"), []byte("snponly"), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg := archConfig(dir)
	cfg.SNPOnly = []string{"52:54:00:00:00:01", "0F1E2D3C-4B5A-6978-8796-A5B4C3D2E1F0"}
	cfg.SNPOnlyBootFile = filepath.Join(dir, "snponly.efi")
	s := startServer(t, cfg)
	// Option 97 as firmware sends it: type 0, then the SMBIOS bytes,
	// whose first three fields are little-endian.
	guid := []byte{0, 0x3c, 0x2d, 0x1e, 0x0f, 0x5a, 0x4b, 0x78, 0x69, 0x87, 0x96, 0xa5, 0xb4, 0xc3, 0xd2, 0xe1, 0xf0}
	tests := []struct {
		name string
		mac  net.HardwareAddr
		arch iana.Arch
		guid bool
		want string
	}{
		{"listed by MAC", net.HardwareAddr{0x52, 0x54, 0, 0, 0, 1}, iana.EFI_X86_64, false, "snponly.efi"},
		{"listed by UUID", net.HardwareAddr{0x52, 0x54, 0, 0, 0, 2}, iana.EFI_X86_64, true, "snponly.efi"},
		{"not listed", net.HardwareAddr{0x52, 0x54, 0, 0, 0, 3}, iana.EFI_X86_64, false, "ipxe.efi"},
		{"listed, but BIOS", net.HardwareAddr{0x52, 0x54, 0, 0, 0, 1}, iana.INTEL_X86PC, false, "undionly.kpxe"},
		{"listed, HTTP boot", net.HardwareAddr{0x52, 0x54, 0, 0, 0, 1}, iana.EFI_X86_64_HTTP, false, "http://10.77.0.1:8080/boot/snponly.efi"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			class := "PXEClient"
			if tc.arch == iana.EFI_X86_64_HTTP {
				class = "HTTPClient"
			}
			mods := []dhcpv4.Modifier{
				dhcpv4.WithOption(dhcpv4.OptClassIdentifier(fmt.Sprintf("%s:Arch:%05d:UNDI:003016", class, tc.arch))),
				dhcpv4.WithOption(dhcpv4.OptClientArch(tc.arch)),
			}
			if tc.guid {
				mods = append(mods, dhcpv4.WithGeneric(dhcpv4.OptionClientMachineIdentifier, guid))
			}
			req, err := dhcpv4.NewDiscovery(tc.mac, mods...)
			if err != nil {
				t.Fatal(err)
			}
			d, err := s.responder.Decide(req, dhcp.PortDHCP)
			if err != nil || d.Reply == nil {
				t.Fatalf("no reply: %v", err)
			}
			if d.Reply.BootFileName != tc.want {
				t.Errorf("boot file %q, want %q", d.Reply.BootFileName, tc.want)
			}
		})
	}
	if s.bootFiles["snponly.efi"] != cfg.SNPOnlyBootFile {
		t.Errorf("snponly.efi is not served: %v", s.bootFiles)
	}
}

func TestSNPOnlyRefused(t *testing.T) {
	dir := bootFiles(t)
	other := filepath.Join(dir, "other")
	if err := os.MkdirAll(other, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{filepath.Join(dir, "snponly.efi"), filepath.Join(other, "snponly.efi")} {
		if err := os.WriteFile(p, []byte("snponly"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	tests := []struct {
		name    string
		cfg     func(*Config)
		wantErr string
	}{
		{"neither a MAC nor a UUID", func(c *Config) { c.SNPOnly = []string{"cp-1"} }, `snponly.efi for "cp-1"`},
		{"a missing snponly.efi", func(c *Config) {
			c.SNPOnly = []string{"52:54:00:00:00:01"}
			c.SNPOnlyBootFile = filepath.Join(dir, "nope.efi")
		}, "snponly boot file"},
		{"two files named snponly.efi", func(c *Config) {
			c.SNPOnly = []string{"52:54:00:00:00:01"}
			c.UEFIBootFile = filepath.Join(other, "snponly.efi")
			c.SNPOnlyBootFile = filepath.Join(dir, "snponly.efi")
		}, "two files named snponly.efi"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg := archConfig(dir)
			tc.cfg(&cfg)
			if _, err := cfg.resolve(); !failed(t, err, tc.wantErr) {
				t.Fatalf("no error, want %q", tc.wantErr)
			}
		})
	}
}
