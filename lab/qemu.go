package lab

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Firmware files from Debian's ovmf package; SeaBIOS and the iPXE NIC ROMs
// come with qemu-system-x86 and ipxe-qemu.
var (
	OVMFCode = "/usr/share/OVMF/OVMF_CODE_4M.fd"
	OVMFVars = "/usr/share/OVMF/OVMF_VARS_4M.fd"
)

// vmFiles are where one VM keeps its disk, firmware variables, serial log,
// QMP socket and pid.
type vmFiles struct{ dir string }

func (f vmFiles) disk() string   { return filepath.Join(f.dir, "disk.qcow2") }
func (f vmFiles) vars() string   { return filepath.Join(f.dir, "OVMF_VARS.fd") }
func (f vmFiles) serial() string { return filepath.Join(f.dir, "serial.log") }
func (f vmFiles) qmp() string    { return filepath.Join(f.dir, "qmp.sock") }
func (f vmFiles) pid() string    { return filepath.Join(f.dir, "qemu.pid") }

func (c *Config) files(m Machine) vmFiles { return vmFiles{filepath.Join(c.Dir, "vms", m.Name)} }

// vmCPUs is how many vCPUs a VM gets. Under TCG a worker gets one:
// emulated CPUs of several VMs sharing a small host gain nothing from a
// second one. A control plane gets two (multi-threaded TCG runs each on a
// host thread): etcd, the API server, the controllers and a kubelet do
// not fit in one emulated CPU.
func vmCPUs(m Machine, accel string) int {
	if accel == "kvm" || m.Role == "controlplane" {
		return 2
	}
	return 1
}

// qemuArgs is the command line of one VM. accel is kvm or tcg. netboot
// puts the NIC first in the boot order (the BMC's one-time network boot),
// else the disk: a server's usual order. A lab disk holds no boot loader,
// so a VM booting its disk falls through to the network, as a server
// with an empty disk does, and the netboot server decides.
func (c *Config) qemuArgs(m Machine, accel string, netboot bool) []string {
	f := c.files(m)
	nicBoot, diskBoot := "2", "1"
	if netboot {
		nicBoot, diskBoot = "1", "2"
	}
	nic := "virtio-net-pci,netdev=n0,mac=" + m.MACText + ",bootindex=" + nicBoot
	machine := "pc"
	if m.Firmware == FirmwareUEFI {
		// No option ROM: OVMF netboots with its own UEFI PXE, as a
		// server's firmware would (DHCP, TFTP of ipxe.efi, iPXE).
		nic += ",romfile="
		machine = "q35"
	}
	cpus := strconv.Itoa(vmCPUs(m, accel))
	args := []string{
		"-name", "cozy-lab-" + c.Name + "-" + m.Name,
		"-machine", machine, "-accel", accel,
		// Every CPU feature the accelerator offers: TCG's default CPU
		// (qemu64) has no AES-NI, PCLMULQDQ or SSE4.2, so the TLS of
		// every etcd and API request would run Go's slow generic code.
		"-cpu", "max",
		"-m", strconv.Itoa(c.MemoryMiB), "-smp", cpus, "-uuid", m.UUID,
		"-display", "none", "-monitor", "none",
		"-serial", "file:" + f.serial(),
		"-qmp", "unix:" + f.qmp() + ",server=on,wait=off",
		"-netdev", "tap,id=n0,ifname=" + m.Tap + ",script=no,downscript=no",
		"-device", nic,
		// cache=unsafe: a lab disk is thrown away with the lab, and under
		// TCG every guest flush (etcd fsyncs each write) is slow to honour.
		"-drive", "file=" + f.disk() + ",format=qcow2,if=none,id=disk0,cache=unsafe",
		"-device", "virtio-blk-pci,drive=disk0,bootindex=" + diskBoot,
		"-pidfile", f.pid(), "-daemonize",
	}
	if m.Firmware == FirmwareUEFI {
		args = append(args,
			"-drive", "if=pflash,format=raw,unit=0,readonly=on,file="+OVMFCode,
			"-drive", "if=pflash,format=raw,unit=1,file="+f.vars())
	}
	return args
}

// startVM creates the VM's disk and firmware variables on first start and
// starts QEMU, daemonized, inside the lab's namespace.
func (c *Config) startVM(ctx context.Context, m Machine, accel string, netboot bool) error {
	f := c.files(m)
	if err := os.MkdirAll(f.dir, 0o755); err != nil {
		return err
	}
	if _, err := os.Stat(f.disk()); errors.Is(err, os.ErrNotExist) {
		out, err := exec.CommandContext(ctx, "qemu-img", "create", "-q", "-f", "qcow2", f.disk(), fmt.Sprintf("%dG", c.DiskGiB)).CombinedOutput()
		if err != nil {
			return fmt.Errorf("%s: qemu-img: %v: %s", m.Name, err, out)
		}
	}
	if m.Firmware == FirmwareUEFI {
		if _, err := os.Stat(f.vars()); errors.Is(err, os.ErrNotExist) {
			vars, err := os.ReadFile(OVMFVars)
			if err != nil {
				return fmt.Errorf("%s: UEFI variables (Debian package ovmf): %w", m.Name, err)
			}
			if err := os.WriteFile(f.vars(), vars, 0o644); err != nil {
				return err
			}
		}
	}
	_ = os.Remove(f.qmp())
	args := append([]string{"netns", "exec", Namespace(c.Name), "qemu-system-x86_64"}, c.qemuArgs(m, accel, netboot)...)
	out, err := exec.CommandContext(ctx, "ip", args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s: qemu: %v: %s", m.Name, err, strings.TrimSpace(string(out)))
	}
	return nil
}

// vmPID is the VM's QEMU process, or 0 when it is not running.
func (c *Config) vmPID(m Machine) int {
	data, err := os.ReadFile(c.files(m).pid())
	if err != nil {
		return 0
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(data)))
	if err != nil || syscall.Kill(pid, 0) != nil {
		return 0
	}
	// A pid file outlives its process; make sure the pid is still QEMU.
	if cmd, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid)); err != nil || !strings.Contains(string(cmd), c.files(m).pid()) {
		return 0
	}
	return pid
}

// stopVM quits QEMU through QMP, or kills it.
func (c *Config) stopVM(m Machine) {
	pid := c.vmPID(m)
	if pid == 0 {
		return
	}
	// Wait for the process itself to be gone, not only its pid file's
	// claim: `lab down` must leave no QEMU behind.
	gone := func() bool {
		stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		// Exited, or a zombie its parent has not reaped yet.
		return err != nil || strings.Contains(string(stat), ") Z ")
	}
	if err := qmp(c.files(m).qmp(), "quit"); err == nil {
		for range 50 {
			if gone() {
				return
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	_ = syscall.Kill(pid, syscall.SIGKILL)
	for range 50 {
		if gone() {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// VMStatus asks QEMU (QMP query-status) whether the VM runs.
func (c *Config) VMStatus(m Machine) string {
	if c.vmPID(m) == 0 {
		return "stopped"
	}
	var st struct {
		Status string `json:"status"`
	}
	if err := qmpQuery(c.files(m).qmp(), "query-status", &st); err != nil {
		return "unknown"
	}
	return st.Status
}

// qmp runs one QMP command without output.
func qmp(socket, command string) error { return qmpQuery(socket, command, nil) }

// qmpQuery speaks QEMU's machine protocol: read the greeting, enter
// command mode, run one command and decode its return value into out.
func qmpQuery(socket, command string, out any) error {
	conn, err := net.DialTimeout("unix", socket, 2*time.Second)
	if err != nil {
		return err
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
	r := bufio.NewReader(conn)
	if _, err := r.ReadBytes('\n'); err != nil { // greeting
		return err
	}
	for _, cmd := range []string{"qmp_capabilities", command} {
		if _, err := fmt.Fprintf(conn, `{"execute":%q}`+"\n", cmd); err != nil {
			return err
		}
		for {
			line, err := r.ReadBytes('\n')
			if err != nil {
				if cmd == "quit" && errors.Is(err, io.EOF) {
					return nil
				}
				return err
			}
			var resp struct {
				Return json.RawMessage `json:"return"`
				Error  *struct {
					Desc string `json:"desc"`
				} `json:"error"`
				Event string `json:"event"`
			}
			if err := json.Unmarshal(line, &resp); err != nil {
				return err
			}
			if resp.Event != "" {
				continue
			}
			if resp.Error != nil {
				return fmt.Errorf("qmp %s: %s", cmd, resp.Error.Desc)
			}
			if cmd == command && out != nil {
				return json.Unmarshal(resp.Return, out)
			}
			break
		}
	}
	return nil
}
