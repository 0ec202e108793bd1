// Package nodeimage builds the boot image of the lab's emulated Talos
// nodes: a Linux kernel and one initramfs that a QEMU VM netboots (or
// boots with -kernel/-initrd) into cozy-talos-node (lab/talosnode) on the
// VM's own hardware. Its /init, a busybox script, loads the virtio
// drivers, takes the boot NIC's address from the rack's DHCP server, reads
// the SMBIOS UUID, keeps the node's state on the VM's disk (vda, ext2,
// made on first boot), and turns the node's reboots and power-offs into
// the VM's. Everything a Talos node starts rides along: containerd, runc
// (Debian's, with the libraries it links) and the CNI plugins, kubelet,
// and for control planes etcd, kube-apiserver, the controller-manager and
// the scheduler.
//
// Images are reproducible and cached, keyed by a hash of every input, so
// a second Build with the same inputs returns at once.
package nodeimage

import (
	"context"
	"crypto/sha256"
	_ "embed"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"

	"cozy.dev/cozy/lab/initramfs"
	"cozy.dev/cozy/lab/talosnode"
)

// Cmdline is the kernel command line of the image: the serial console
// carries /init's and the node's log, and a kernel panic (PID 1 gone)
// reboots at once instead of hanging. /init also reads BOOTIF= (the boot
// NIC's MAC, as iPXE writes it: BOOTIF=01-52-54-00-12-34-56) and
// cozy.debug (log every API request); UEFI iPXE's initrd= is added by the
// netboot server (pxe/ipxe).
const Cmdline = "console=ttyS0 panic=-1"

// TCGArgs are added to the command line of a VM without KVM, last, so
// that they win over the same options earlier on it:
//
//   - tsc=reliable: under QEMU's TCG the kernel finds the vCPUs' TSCs
//     unsynchronised (TCG's timing of its boot check), marks the TSC
//     unstable and reads time from the HPET, every read a trap into
//     QEMU's device emulation. TCG's TSCs all come from one host clock,
//     so they are in sync; with tsc=reliable the vDSO reads the TSC.
//   - pti=off: Talos's kernel arguments force page-table isolation on
//     (pti=on), a Meltdown mitigation; TCG's CPU is not affected (the
//     kernel says so in /sys/devices/system/cpu/vulnerabilities/meltdown)
//     and under TCG each of the two page-table switches of a system call
//     flushes QEMU's software TLB.
//
// TestBenchLabKernelTCG measures both (docs/lab.md#the-kernel-under-tcg):
// in a 2-vCPU TCG VM, time.Now was 106 times and getppid 13 times
// cheaper with these than with Talos's arguments alone (2026-12-06).
const TCGArgs = "tsc=reliable pti=off"

// APIOnlyArg on the kernel command line keeps the node to the Talos API,
// etcd and kube-apiserver: /init then runs it without --node-services.
const APIOnlyArg = "cozy.api_only"

// The files of a built image, in Image.Dir.
const (
	KernelFile = "vmlinuz"
	InitrdFile = "initramfs.lz4"
)

// format is part of every key: bump it when the image's layout changes in
// a way the inputs do not show.
const format = "3"

var (
	//go:embed init.sh
	initScript string
	// DHCPHook is udhcpc's hook script (udhcpc -s): it puts the lease's
	// address, default route and resolvers on the NIC and writes
	// /run/udhcpc.env (ip= mask=). Cozy's worker image uses it too.
	//go:embed udhcpc.sh
	DHCPHook string
)

// Options are the inputs of an image. Only Busybox and CacheDir have
// defaults: the caller resolves where the rest was built.
type Options struct {
	// KernelDir is what hack/boot-assets.sh prints: vmlinuz, modules/*.ko
	// (virtio NIC and disk, ext4, and what a Kubernetes node needs:
	// overlayfs, bridge, vxlan, nf_tables, …) and modules.order.
	KernelDir string
	// NodeBinary is a statically linked cozy-talos-node (make build writes
	// bin/cozy-talos-node).
	NodeBinary string
	// Busybox is a statically linked busybox (Debian busybox-static).
	// Default /bin/busybox.
	Busybox string
	// KubernetesDir holds etcd, kube-apiserver, kube-controller-manager,
	// kube-scheduler and kubelet, statically linked (the directory
	// hack/envtest-assets.sh prints).
	KubernetesDir string
	// RuntimeDir holds bin/containerd, bin/containerd-shim-runc-v2 and the
	// CNI plugins in cni/bin (the directory hack/node-assets.sh prints).
	RuntimeDir string
	// Runc is the runc binary; dynamically linked ones bring their
	// libraries. Default /usr/sbin/runc (Debian's runc).
	Runc string
	// CacheDir holds one directory per image, named by its key.
	CacheDir string
}

// KubernetesBinaries are the programs of Options.KubernetesDir the image
// carries.
var KubernetesBinaries = []string{"etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubelet"}

// CNIPlugins are the CNI plugins the image carries in /opt/cni/bin, as
// Talos ships them: what flannel's CNI config delegates to.
var CNIPlugins = []string{"bridge", "flannel", "host-local", "loopback", "portmap"}

// Image is a built node image.
//
// The VM it boots needs a virtio NIC (the first one, or BOOTIF's) on a
// network whose DHCP server gives it its address, a virtio disk (vda) for
// the node's state, and 1 GiB of RAM (enough for a bootstrapped control
// plane with an empty cluster; the unpacked initramfs, about 190 MB, stays
// in RAM). It must run without -no-reboot: a reboot netboots again, and a
// power-off ends QEMU.
type Image struct {
	// Dir holds the image's files; it is not to be modified.
	Dir string
	// Kernel and Initrd are the paths of the kernel and the LZ4
	// initramfs.
	Kernel string
	Initrd string
	// Cmdline is the kernel command line to boot them with.
	Cmdline string
	// Key identifies the inputs; Dir is named after it.
	Key string
}

func (o Options) withDefaults() (Options, error) {
	var errs []error
	if o.KernelDir == "" {
		errs = append(errs, errors.New("no kernel: give the directory hack/boot-assets.sh prints"))
	}
	if o.NodeBinary == "" {
		errs = append(errs, errors.New("no cozy-talos-node binary: build one with make build (bin/cozy-talos-node)"))
	}
	if o.KubernetesDir == "" {
		errs = append(errs, errors.New("no Kubernetes binaries: give the directory hack/envtest-assets.sh prints"))
	}
	if o.RuntimeDir == "" {
		errs = append(errs, errors.New("no containerd and CNI plugins: give the directory hack/node-assets.sh prints"))
	}
	if o.CacheDir == "" {
		errs = append(errs, errors.New("no cache directory for node images"))
	}
	if o.Busybox == "" {
		o.Busybox = "/bin/busybox"
	}
	if o.Runc == "" {
		o.Runc = "/usr/sbin/runc"
	}
	return o, errors.Join(errs...)
}

// file is one input of the image: a file of the host and where it goes.
type file struct {
	src  string
	dst  string // path in the initramfs; "" for the kernel
	mode fs.FileMode
	// static binaries are checked to need no dynamic loader: the
	// initramfs has none.
	static bool
}

// requiredModules are modules a node cannot do without, checked here so
// that a kernel directory from an older hack/boot-assets.sh fails the
// build rather than the VM: the boot NIC, the disk and its file system,
// and the per-family reject that kube-proxy's nftables rules use
// (without it every sync fails whole and no ClusterIP answers; the VM
// cannot load a module on demand).
var requiredModules = []string{"virtio_net.ko", "virtio_blk.ko", "ext4.ko", "nft_reject_ipv4.ko", "nft_reject_ipv6.ko"}

// inputs lists every file the image is made of.
func (o Options) inputs() ([]file, error) {
	order, err := os.ReadFile(filepath.Join(o.KernelDir, "modules.order"))
	if err != nil {
		return nil, fmt.Errorf("kernel modules: %w (is %s a directory from hack/boot-assets.sh?)", err, o.KernelDir)
	}
	files := []file{
		{src: filepath.Join(o.KernelDir, "vmlinuz")},
		{src: o.Busybox, dst: "bin/busybox", mode: 0o755, static: true},
		{src: o.NodeBinary, dst: "bin/cozy-talos-node", mode: 0o755, static: true},
	}
	for _, b := range KubernetesBinaries {
		files = append(files, file{src: filepath.Join(o.KubernetesDir, b), dst: "bin/" + b, mode: 0o755, static: true})
	}
	for _, b := range []string{"containerd", "containerd-shim-runc-v2"} {
		files = append(files, file{src: filepath.Join(o.RuntimeDir, "bin", b), dst: "bin/" + b, mode: 0o755, static: true})
	}
	for _, p := range CNIPlugins {
		files = append(files, file{src: filepath.Join(o.RuntimeDir, "cni", "bin", p), dst: "opt/cni/bin/" + p, mode: 0o755, static: true})
	}
	files = append(files, file{src: o.Runc, dst: "bin/runc", mode: 0o755})
	libs, err := initramfs.SharedLibraries(o.Runc)
	if err != nil {
		return nil, err
	}
	for _, l := range libs {
		files = append(files, file{src: l.Src, dst: l.Dst, mode: 0o755})
	}
	modules := strings.Fields(string(order))
	for _, m := range requiredModules {
		if !slices.Contains(modules, m) {
			return nil, fmt.Errorf("kernel modules in %s lack %s: run hack/boot-assets.sh again (it adds it)", o.KernelDir, m)
		}
	}
	for _, m := range modules {
		if m != filepath.Base(m) {
			return nil, fmt.Errorf("modules.order in %s: %q is not a file name", o.KernelDir, m)
		}
		files = append(files, file{src: filepath.Join(o.KernelDir, "modules", m), dst: "lib/modules/" + m, mode: 0o644})
	}
	return files, nil
}

// generated are the files Build writes itself, besides the inputs.
func generated(modulesOrder string) map[string]string {
	return map[string]string{
		"init":              strings.ReplaceAll(initScript, "@REBOOT_EXIT_CODE@", strconv.Itoa(talosnode.RebootExitCode)),
		"etc/udhcpc.script": DHCPHook,
		"etc/hosts":         "127.0.0.1 localhost\n::1 localhost\n",
		// The users and groups of a Talos root file system: kubelet and
		// runc look names up.
		"etc/passwd":                "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n",
		"etc/group":                 "root:x:0:\nnogroup:x:65534:\n",
		"lib/modules/modules.order": modulesOrder,
	}
}

// Build returns the image for o, from the cache or built now.
func Build(ctx context.Context, o Options) (*Image, error) {
	o, err := o.withDefaults()
	if err != nil {
		return nil, fmt.Errorf("node image: %w", err)
	}
	files, err := o.inputs()
	if err != nil {
		return nil, fmt.Errorf("node image: %w", err)
	}
	for _, f := range files {
		if f.static {
			if err := initramfs.CheckStatic(f.src); err != nil {
				return nil, fmt.Errorf("node image: %w", err)
			}
		}
	}
	var order []string
	for _, f := range files {
		if strings.HasPrefix(f.dst, "lib/modules/") {
			order = append(order, filepath.Base(f.dst))
		}
	}
	gen := generated(strings.Join(order, "\n") + "\n")
	key, err := imageKey(ctx, files, gen)
	if err != nil {
		return nil, fmt.Errorf("node image: %w", err)
	}
	img := &Image{
		Dir:     filepath.Join(o.CacheDir, key),
		Cmdline: Cmdline,
		Key:     key,
	}
	img.Kernel = filepath.Join(img.Dir, KernelFile)
	img.Initrd = filepath.Join(img.Dir, InitrdFile)
	if complete(img.Dir) {
		return img, nil
	}
	if err := build(ctx, o.CacheDir, img.Dir, files, gen); err != nil {
		return nil, fmt.Errorf("node image: %w", err)
	}
	return img, nil
}

// complete reports whether dir holds a finished image: directories are
// renamed into place only when done.
func complete(dir string) bool {
	for _, name := range []string{KernelFile, InitrdFile} {
		if fi, err := os.Stat(filepath.Join(dir, name)); err != nil || fi.Size() == 0 {
			return false
		}
	}
	return true
}

// imageKey hashes everything the image is made of: file names, modes and
// contents (hashed in parallel: a few hundred MB), and the generated files.
func imageKey(ctx context.Context, files []file, gen map[string]string) (string, error) {
	sums := make([]string, len(files))
	errs := make([]error, len(files))
	var wg sync.WaitGroup
	limit := make(chan struct{}, 4)
	for i, f := range files {
		wg.Go(func() {
			limit <- struct{}{}
			defer func() { <-limit }()
			sums[i], errs[i] = fileSum(ctx, f.src)
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return "", err
	}
	h := sha256.New()
	fmt.Fprintf(h, "cozy node image %s\n", format)
	for i, f := range files {
		fmt.Fprintf(h, "file %q %o %s\n", f.dst, f.mode, sums[i])
	}
	for _, name := range sortedKeys(gen) {
		fmt.Fprintf(h, "generated %q %x\n", name, sha256.Sum256([]byte(gen[name])))
	}
	return hex.EncodeToString(h.Sum(nil))[:24], nil
}

func fileSum(ctx context.Context, path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, ctxReader{ctx, f}); err != nil {
		return "", fmt.Errorf("read %s: %w", path, err)
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// ctxReader stops a long copy when ctx ends.
type ctxReader struct {
	ctx context.Context
	r   io.Reader
}

func (c ctxReader) Read(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	return c.r.Read(p)
}

// ctxWriter stops a long write when ctx ends.
type ctxWriter struct {
	ctx context.Context
	w   io.Writer
}

func (c ctxWriter) Write(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	return c.w.Write(p)
}

// build writes the image into a temporary directory beside dir and
// renames it into place, so a crash or a concurrent Build never leaves a
// half-written image under dir's name.
func build(ctx context.Context, cacheDir, dir string, files []file, gen map[string]string) error {
	if err := os.MkdirAll(cacheDir, 0o755); err != nil {
		return err
	}
	tmp, err := os.MkdirTemp(cacheDir, ".build-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)

	// LZ4: every boot of every machine unpacks it, and under TCG that is
	// 1.6 s where gzip takes 6.3 s (see initramfs.LZ4).
	a := initramfs.Archive{Compression: initramfs.LZ4}
	for _, d := range imageDirs(files) {
		a.Dir(d, 0o755)
	}
	a.Symlink("bin/sh", "busybox")
	for _, name := range sortedKeys(gen) {
		mode := fs.FileMode(0o644)
		if name == "init" || strings.HasSuffix(name, ".script") {
			mode = 0o755
		}
		a.File(name, mode, []byte(gen[name]))
	}
	for _, f := range files {
		data, err := os.ReadFile(f.src)
		if err != nil {
			return err
		}
		if f.dst == "" {
			if err := writeFile(ctx, filepath.Join(tmp, KernelFile), func(w io.Writer) error {
				_, err := w.Write(data)
				return err
			}); err != nil {
				return fmt.Errorf("kernel: %w", err)
			}
			continue
		}
		a.File(f.dst, f.mode, data)
	}
	if err := writeFile(ctx, filepath.Join(tmp, InitrdFile), func(w io.Writer) error {
		_, err := a.WriteTo(ctxWriter{ctx, w})
		return err
	}); err != nil {
		return fmt.Errorf("initramfs: %w", err)
	}
	if err := os.Chmod(tmp, 0o755); err != nil {
		return err
	}
	if err := os.Rename(tmp, dir); err != nil {
		if complete(dir) {
			return nil // built at the same time by another Build
		}
		return err
	}
	return nil
}

func writeFile(ctx context.Context, path string, write func(io.Writer) error) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return err
	}
	if err := write(f); err != nil {
		f.Close()
		return err
	}
	if err := ctx.Err(); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

func sortedKeys(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// imageDirs are the directories of the initramfs: the system's, and every
// parent of a file, parents first.
func imageDirs(files []file) []string {
	dirs := []string{"bin", "dev", "etc", "lib", "lib/modules", "mnt", "mnt/disk", "opt", "proc", "root", "run", "sys", "tmp"}
	for _, f := range files {
		for d := filepath.Dir(f.dst); d != "." && d != "/" && f.dst != ""; d = filepath.Dir(d) {
			if !slices.Contains(dirs, d) {
				dirs = append(dirs, d)
			}
		}
	}
	slices.SortFunc(dirs, func(a, b string) int {
		if c := strings.Count(a, "/") - strings.Count(b, "/"); c != 0 {
			return c
		}
		return strings.Compare(a, b)
	})
	return dirs
}
