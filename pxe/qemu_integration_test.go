//go:build integration

package pxe_test

import (
	"bytes"
	"context"
	"encoding/json"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"cozy.dev/cozy/internal/testing/cozyctl"
	"cozy.dev/cozy/internal/testing/netnstest"
	"cozy.dev/cozy/internal/testing/prereq"
	"cozy.dev/cozy/internal/testing/syncbuf"
	"cozy.dev/cozy/lab/initramfs"
	"cozy.dev/cozy/pxe/inventory"
)

// The proof a VM booted: its kernel's busybox fetches the VM's iPXE script
// from the netboot server once more, with wget instead of iPXE.
const initScript = `#!/bin/sh
/bin/busybox --install -s /bin
export PATH=/bin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
echo "cozy-initramfs: kernel $(uname -r) $(uname -m) booted"
for m in $(cat /lib/modules/modules.order); do insmod /lib/modules/$m; done
ip link set eth0 up
udhcpc -i eth0 -n -q -t 20 -s /bin/udhcpc.script
mac=$(tr : - </sys/class/net/eth0/address)
server=$(sed -n 's/.*cozy.server=\([^ ]*\).*/\1/p' /proc/cmdline)
if wget -q -O /tmp/script "http://$server/ipxe/$mac.ipxe"; then
	echo "cozy-initramfs: fetched http://$server/ipxe/$mac.ipxe"
fi
poweroff -f
`

const udhcpcScript = `#!/bin/sh
case "$1" in bound|renew) ip addr add "$ip/${mask:-24}" dev "$interface" ;; esac
`

// bootInitramfs builds the test's initramfs: static busybox, the virtio NIC
// modules of the Debian kernel in assets, and initScript.
func bootInitramfs(t *testing.T, assets, busybox string) string {
	t.Helper()
	var a initramfs.Archive
	bb, err := os.ReadFile(busybox)
	if err != nil {
		prereq.Missing(t, "static busybox (Debian busybox-static): %v", err)
	}
	a.File("bin/busybox", 0o755, bb)
	a.Symlink("bin/sh", "busybox")
	a.File("init", 0o755, []byte(initScript))
	a.File("bin/udhcpc.script", 0o755, []byte(udhcpcScript))
	for _, d := range []string{"proc", "sys", "dev", "tmp"} {
		a.Dir(d, 0o755)
	}
	order, err := os.ReadFile(filepath.Join(assets, "modules.order"))
	if err != nil {
		t.Fatal(err)
	}
	a.File("lib/modules/modules.order", 0o644, order)
	for _, m := range strings.Fields(string(order)) {
		ko, err := os.ReadFile(filepath.Join(assets, "modules", m))
		if err != nil {
			t.Fatal(err)
		}
		a.File("lib/modules/"+m, 0o644, ko)
	}
	p := filepath.Join(t.TempDir(), filepath.Base(assets)+".gz")
	f, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := a.WriteTo(f); err != nil {
		t.Fatal(err)
	}
	return p
}

type vm struct {
	name     string
	arch     string // amd64 or arm64
	firmware string // bios or uefi
	uuid     string // SMBIOS system UUID, which PXE sends as option 97
	mac      net.HardwareAddr
	tap      string
	serial   string
	// httpBoot turns OVMF's PXE off (fw_cfg knobs OVMF reads at start),
	// so its boot manager goes on to UEFI HTTP boot, as on a server
	// whose firmware is set to HTTP boot only.
	httpBoot bool
}

// nicROM picks the NIC's boot ROM. SeaBIOS can only netboot through an
// option ROM, and QEMU's is iPXE itself (it gets the script at once). OVMF
// gets none, so it uses its own UEFI PXE, as a server's firmware would:
// DHCP, TFTP of Debian's ipxe.efi, then iPXE's script.
func nicROM(firmware string) string {
	if firmware == "uefi" {
		return ",romfile="
	}
	return ""
}

// qemu is the emulator of the VM's architecture.
func (v *vm) qemu() string {
	if v.arch == "arm64" {
		return "qemu-system-aarch64"
	}
	return "qemu-system-x86_64"
}

// firmwareFiles are the UEFI code and the variable store to copy per VM:
// OVMF on x86-64, AAVMF on arm64 (Debian's ovmf and qemu-efi-aarch64).
func (v *vm) firmwareFiles() (code, vars string) {
	if v.arch == "arm64" {
		return "/usr/share/AAVMF/AAVMF_CODE.fd", "/usr/share/AAVMF/AAVMF_VARS.fd"
	}
	return "/usr/share/OVMF/OVMF_CODE_4M.fd", "/usr/share/OVMF/OVMF_VARS_4M.fd"
}

func (v *vm) args(t *testing.T, dir string) []string {
	t.Helper()
	disk := filepath.Join(dir, v.name+".raw")
	if err := os.WriteFile(disk, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(disk, 1<<30); err != nil { // an empty disk, as on a new server
		t.Fatal(err)
	}
	args := []string{
		"-accel", "tcg", // KVM breaks real-mode firmware on these machines (DESIGN.md)
		"-m", "512", "-smp", "1", "-uuid", v.uuid,
		"-display", "none", "-monitor", "none", "-no-reboot",
		"-serial", "file:" + v.serial,
		"-netdev", "tap,id=n0,ifname=" + v.tap + ",script=no,downscript=no",
		"-device", "virtio-net-pci,netdev=n0,mac=" + v.mac.String() + nicROM(v.firmware),
		"-drive", "file=" + disk + ",format=raw,if=none,id=d0", "-device", "virtio-blk-pci,drive=d0",
	}
	if v.firmware == "uefi" {
		code, template := v.firmwareFiles()
		vars := filepath.Join(dir, v.name+"-vars.fd")
		b, err := os.ReadFile(template)
		if err != nil {
			prereq.Missing(t, "UEFI firmware (Debian ovmf, qemu-efi-aarch64): %v", err)
		}
		if err := os.WriteFile(vars, b, 0o644); err != nil {
			t.Fatal(err)
		}
		machine := "q35"
		if v.arch == "arm64" {
			// cortex-a57 rather than max: no pointer authentication to
			// emulate, which makes TCG much slower.
			machine = "virt"
			args = append(args, "-cpu", "cortex-a57")
		}
		args = append(args, "-machine", machine,
			"-drive", "if=pflash,format=raw,unit=0,readonly=on,file="+code,
			"-drive", "if=pflash,format=raw,unit=1,file="+vars)
		if v.httpBoot {
			for _, knob := range []string{"IPv4PXESupport", "IPv6PXESupport", "IPv6Support"} {
				args = append(args, "-fw_cfg", "name=opt/org.tianocore/"+knob+",string=no")
			}
		}
	} else {
		args = append(args, "-machine", "pc")
	}
	if v.arch != "arm64" {
		args = append(args, "-boot", "order=n")
	}
	return args
}

// TestQEMUNetboot netboots a SeaBIOS VM (PXE), an OVMF VM (UEFI PXE) and
// an OVMF VM with PXE turned off (UEFI HTTP boot) from `cozyctl pxe
// serve` in proxy mode, beside dnsmasq handing out the addresses, into a
// Debian kernel and a busybox initramfs; and two arm64 VMs (AAVMF, one with
// UEFI PXE, one with UEFI HTTP boot) from the same server into Debian's
// arm64 kernel.
func TestQEMUNetboot(t *testing.T) {
	for _, bin := range []string{"qemu-system-x86_64", "dnsmasq"} {
		if _, err := exec.LookPath(bin); err != nil {
			prereq.Missing(t, "%s is not installed (see hack/install-deps.sh)", bin)
		}
	}
	assets := os.Getenv("COZY_BOOT_ASSETS")
	if assets == "" {
		prereq.Missing(t, "COZY_BOOT_ASSETS is not set: run `make test`, or export COZY_BOOT_ASSETS=$(hack/boot-assets.sh)")
	}
	initrd := bootInitramfs(t, assets, "/bin/busybox")
	// The arm64 VMs: Debian's arm64 kernel and busybox, and Debian 13's
	// ipxe-arm64.efi, all from hack/boot-assets.sh arm64.
	armAssets := os.Getenv("COZY_BOOT_ASSETS_ARM64")
	if _, err := exec.LookPath("qemu-system-aarch64"); err != nil {
		armAssets = ""
	}
	if armAssets == "" {
		if prereq.InCI() {
			prereq.Missing(t, "the arm64 VMs need qemu-system-aarch64 (Debian qemu-system-arm) and COZY_BOOT_ASSETS_ARM64=$(hack/boot-assets.sh arm64)")
		}
		t.Log("no arm64 VMs: install qemu-system-arm and qemu-efi-aarch64 and export COZY_BOOT_ASSETS_ARM64=$(hack/boot-assets.sh arm64)")
	}
	dir := t.TempDir() // disks, firmware variables
	logDir := dir
	if d := os.Getenv("COZY_TEST_ARTIFACTS"); d != "" {
		// Keep serial logs for people reading a CI run.
		logDir = filepath.Join(d, "qemu-netboot")
		if err := os.MkdirAll(logDir, 0o755); err != nil {
			t.Fatal(err)
		}
	}

	ns := netnstest.New(t, "rack")
	const server = "10.77.1.1"
	ns.IP(t, "link", "add", "br0", "type", "bridge")
	ns.IP(t, "addr", "add", server+"/24", "dev", "br0")
	ns.IP(t, "link", "set", "br0", "up")
	vms := []*vm{
		{name: "bios", arch: "amd64", firmware: "bios", uuid: "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0", mac: net.HardwareAddr{0x52, 0x54, 0, 0xc0, 0x21, 0x10}, tap: "tap0"},
		{name: "uefi", arch: "amd64", firmware: "uefi", uuid: "12345678-9abc-def0-1234-56789abcdef0", mac: net.HardwareAddr{0x52, 0x54, 0, 0xc0, 0x21, 0x11}, tap: "tap1"},
		{name: "uefi-http", arch: "amd64", firmware: "uefi", httpBoot: true, uuid: "9abcdef0-1234-5678-9abc-def012345678", mac: net.HardwareAddr{0x52, 0x54, 0, 0xc0, 0x21, 0x12}, tap: "tap2"},
	}
	if armAssets != "" {
		vms = append(vms, &vm{name: "arm64", arch: "arm64", firmware: "uefi", uuid: "fedcba98-7654-3210-fedc-ba9876543210", mac: net.HardwareAddr{0x52, 0x54, 0, 0xc0, 0x21, 0x13}, tap: "tap3"})
		vms = append(vms, &vm{name: "arm64-http", arch: "arm64", firmware: "uefi", httpBoot: true, uuid: "76543210-fedc-ba98-7654-3210fedcba98", mac: net.HardwareAddr{0x52, 0x54, 0, 0xc0, 0x21, 0x14}, tap: "tap4"})
	}
	for _, v := range vms {
		ns.IP(t, "tuntap", "add", v.tap, "mode", "tap")
		ns.IP(t, "link", "set", v.tap, "master", "br0", "up")
		v.serial = filepath.Join(logDir, v.name+"-serial.log")
	}

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	// dnsmasq owns the addresses; Cozy only adds boot information.
	dnsmasqLog := &syncbuf.Buffer{}
	dnsmasq := ns.Command(ctx, "dnsmasq", "--keep-in-foreground", "--no-daemon", "--port=0",
		"--interface=br0", "--bind-interfaces", "--dhcp-range=10.77.1.100,10.77.1.199,255.255.255.0,1h",
		"--dhcp-leasefile="+filepath.Join(dir, "dnsmasq.leases"), "--no-resolv", "--no-hosts", "--log-dhcp",
		"--pid-file=", "--conf-file=/dev/null")
	dnsmasq.Stderr = dnsmasqLog
	if err := dnsmasq.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = dnsmasq.Process.Kill(); _ = dnsmasq.Wait() }()

	serverLog := &syncbuf.Buffer{}
	state := filepath.Join(dir, "state")
	args := []string{"pxe", "serve", "--interface", "br0", "--state-dir", state,
		"--kernel", filepath.Join(assets, "vmlinuz"), "--initrd", initrd,
		"--cmdline", "console=ttyS0 panic=-1 cozy.server=" + server + ":8080"}
	for _, v := range vms {
		args = append(args, "--allow-mac", v.mac.String())
	}
	// The OVMF PXE VM, named by its SMBIOS UUID as a rack may, loads
	// snponly.efi: iPXE through OVMF's own virtio-net driver.
	args = append(args, "--snponly", strings.ToUpper(vms[1].uuid))
	if armAssets != "" {
		args = append(args, "--kernel-arm64", filepath.Join(armAssets, "vmlinuz"),
			"--initrd-arm64", bootInitramfs(t, armAssets, filepath.Join(armAssets, "busybox")),
			"--cmdline-arm64", "console=ttyAMA0 panic=-1 cozy.server="+server+":8080",
			"--ipxe-arm64", filepath.Join(armAssets, "ipxe-arm64.efi"))
	}
	srv := ns.Command(ctx, cozyctl.Path(t), args...)
	srv.Stderr = serverLog
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		_ = srv.Process.Signal(syscall.SIGTERM)
		_ = srv.Wait()
	}()

	var qemus []*exec.Cmd
	for _, v := range vms {
		q := ns.Command(ctx, v.qemu(), v.args(t, dir)...)
		q.Stderr = &syncbuf.Buffer{}
		if err := q.Start(); err != nil {
			t.Fatal(err)
		}
		qemus = append(qemus, q)
	}
	defer func() {
		for _, q := range qemus {
			_ = q.Process.Kill()
			_ = q.Wait()
		}
	}()

	// iPXE fetches the script first, then the booted kernel's wget does.
	deadline := time.Now().Add(10 * time.Minute)
	pending := map[string]*vm{}
	for _, v := range vms {
		pending[v.name] = v
	}
	for len(pending) > 0 && time.Now().Before(deadline) {
		log := serverLog.String()
		for name, v := range pending {
			path := "path=/ipxe/" + strings.ReplaceAll(v.mac.String(), ":", "-") + ".ipxe"
			if hasLine(log, path, "agent=iPXE") && hasLine(log, path, "agent=Wget") {
				t.Logf("%s VM netbooted its kernel", name)
				delete(pending, name)
			}
		}
		time.Sleep(time.Second)
	}
	if len(pending) > 0 {
		for _, v := range vms {
			serial, _ := os.ReadFile(v.serial)
			t.Logf("--- %s serial (last 3000 bytes):\n%s", v.name, tail(serial, 3000))
		}
		t.Logf("--- dnsmasq:\n%s", tail([]byte(dnsmasqLog.String()), 3000))
		t.Fatalf("VMs not booted after 10 minutes: %v\n--- server log:\n%s", keys(pending), tail([]byte(serverLog.String()), 6000))
	}
	// The boot chain, for whoever reads the test output.
	for _, line := range strings.Split(serverLog.String(), "\n") {
		if strings.Contains(line, "dhcp reply") || strings.Contains(line, "tftp sent") || strings.Contains(line, "msg=http") {
			t.Log(line)
		}
	}
	// The UEFI VM took the firmware PXE path: TFTP of Debian's
	// snponly.efi, which it was given by its UUID.
	if !hasLine(serverLog.String(), "dhcp reply", "mac="+vms[1].mac.String(), "file=snponly.efi") ||
		!hasLine(serverLog.String(), "tftp sent", "file=snponly.efi") {
		t.Errorf("UEFI VM did not load snponly.efi over TFTP:\n%s", serverLog.String())
	}
	// The HTTP boot VMs: an offer with the URL of their iPXE, which the
	// firmware's own HTTP client then fetched. The arm64 PXE VM: TFTP of
	// the arm64 iPXE. Both arm64 VMs: iPXE loaded the arm64 kernel.
	bootFile := map[string]string{"amd64": "ipxe.efi", "arm64": "ipxe-arm64.efi"}
	for _, v := range vms {
		var want [][]string
		if v.httpBoot {
			want = append(want, []string{"dhcp reply", "mac=" + v.mac.String(), "file=http://" + server + ":8080/boot/" + bootFile[v.arch]},
				[]string{"msg=http", "method=GET", "path=/boot/" + bootFile[v.arch], "agent=UefiHttpBoot", "status=200"})
		}
		if v.arch == "arm64" {
			want = append(want, []string{"msg=http", "path=/assets/arm64-kernel", "status=200"},
				[]string{"msg=http", "path=/assets/arm64-initrd0", "status=200"})
			if !v.httpBoot {
				want = append(want, []string{"tftp sent", "file=ipxe-arm64.efi"})
			}
		}
		for _, w := range want {
			if !hasLine(serverLog.String(), w...) {
				t.Errorf("%s VM: no server log line with %q:\n%s", v.name, w, serverLog.String())
			}
		}
	}
	for _, v := range vms {
		serial, _ := os.ReadFile(v.serial)
		machine := map[string]string{"amd64": "x86_64", "arm64": "aarch64"}[v.arch]
		if !bytes.Contains(serial, []byte(machine+" booted")) || !bytes.Contains(serial, []byte("cozy-initramfs: fetched")) {
			t.Errorf("%s serial console lacks the initramfs's own report of an %s kernel", v.name, machine)
		}
	}

	// What `cozyctl pxe machines` shows once the inventory is flushed.
	want := map[string]*vm{}
	for _, v := range vms {
		want[v.mac.String()] = v
	}
	var machines []inventory.Machine
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		out, err := exec.Command(cozyctl.Path(t), "pxe", "machines", "--state-dir", state, "-o", "json").Output()
		if err != nil {
			continue
		}
		if err := json.Unmarshal(out, &machines); err != nil {
			t.Fatalf("pxe machines -o json: %v\n%s", err, out)
		}
		done := 0
		for _, m := range machines {
			if m.Phase == inventory.PhaseInitrd {
				done++
			}
		}
		if done == len(want) {
			break
		}
	}
	if len(machines) != len(want) {
		t.Fatalf("pxe machines lists %d machines, want %d: %+v", len(machines), len(want), machines)
	}
	for _, m := range machines {
		v := want[m.MAC]
		if v == nil || v.firmware != m.Firmware || m.Phase != inventory.PhaseInitrd || !m.IP.IsValid() || !m.Allowed || m.Arch != v.arch {
			t.Errorf("pxe machines: %+v; want firmware %s, arch %s, phase initrd, an IP", m, v.firmware, v.arch)
			continue
		}
		// Option 97 as the firmware sends it, read back as dmidecode shows it.
		if m.UUID != v.uuid {
			t.Errorf("%s: UUID %q from DHCP, want the VM's SMBIOS UUID %s", v.name, m.UUID, v.uuid)
		}
	}
}

func hasLine(log string, subs ...string) bool {
	for _, line := range strings.Split(log, "\n") {
		all := true
		for _, s := range subs {
			all = all && strings.Contains(line, s)
		}
		if all {
			return true
		}
	}
	return false
}

func tail(b []byte, n int) string {
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return string(b)
}

func keys(m map[string]*vm) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}
