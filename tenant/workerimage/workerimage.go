// Package workerimage builds Cozy's tenant worker image: a KubeVirt
// containerDisk (an OCI image holding /disk/<name>.qcow2) that boots a
// node for one Kubernetes version and joins it to a tenant's control
// plane through the Cluster API kubeadm bootstrap provider's user-data on
// the cloud-init disk KubeVirt attaches (a config drive for CAPK's VMs, or
// a NoCloud seed).
//
// The disk is a hybrid ISO (ISOLINUX, BIOS boot from a CD or a disk)
// holding Debian's kernel and one initramfs with everything the node
// runs: busybox, containerd and its runc shim, Debian's runc, the CNI
// plugins, kubelet and kubeadm of that version, and cozy-worker
// (tenant/workeragent). Nothing is downloaded: the caller gives the
// binaries (hack/worker-image.sh builds them from the Go module proxy and
// Debian). The same inputs give the same bytes, hence the same digest.
package workerimage

import (
	"bytes"
	"context"
	_ "embed"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"time"

	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"cozy.dev/cozy/internal/imageref"
	"cozy.dev/cozy/internal/ociimage"
	"cozy.dev/cozy/lab/initramfs"
	"cozy.dev/cozy/lab/nodeimage"
)

//go:embed init.sh
var initScript string

// Options are the inputs of an image.
type Options struct {
	// Version is the Kubernetes version (v1.36.3); kubelet and kubeadm
	// must report it.
	Version string
	// KernelDir is what hack/boot-assets.sh prints: vmlinuz, config,
	// modules/*.ko and modules.order (isofs among them, for the seed).
	KernelDir string
	// KubernetesDir holds kubelet and kubeadm, statically linked.
	KubernetesDir string
	// RuntimeDir holds bin/containerd, bin/containerd-shim-runc-v2 and
	// cni/bin (hack/node-assets.sh).
	RuntimeDir string
	// Agent is a statically linked cozy-worker (make build).
	Agent string
	// Crictl is a statically linked crictl (sigs.k8s.io/cri-tools), for
	// whoever debugs the node and for kubeadm's preflight, which requires
	// it before Kubernetes 1.31.
	Crictl string
	// Busybox (static); Runc, Conntrack and Iptables (Debian's
	// xtables-nft-multi, with its extensions in Xtables), whose libraries
	// ride along. kubeadm's preflight requires conntrack before
	// Kubernetes 1.32 and iptables before 1.31; CNIs that program
	// iptables need it at any version. Defaults: /bin/busybox,
	// /usr/sbin/runc, /usr/sbin/conntrack, /usr/sbin/xtables-nft-multi,
	// /usr/lib/x86_64-linux-gnu/xtables.
	Busybox, Runc, Conntrack, Iptables, Xtables string
	// Syslinux holds isolinux.bin, ldlinux.c32 and isohdpfx.bin
	// (Debian's isolinux and syslinux-common, extracted).
	Syslinux string
	// Ref names the image; default DefaultRepository:<Version>.
	Ref string
}

// DefaultRepository is where the image is named by default; `cozyctl
// images mirror` pushes it under the same path into a rack's registry.
const DefaultRepository = imageref.WorkerImage

// Image is a built containerDisk.
type Image struct {
	// Layout is the OCI image layout directory holding it.
	Layout string
	// Ref is its name in the layout.
	Ref string
	// Disk is the qcow2 inside it, also left beside the layout
	// (DIR/disk/NAME.qcow2) for booting it without KubeVirt.
	Disk string
}

// CNIPlugins are the plugins the image carries in /opt/cni/bin: what a
// tenant's CNI delegates to (flannel's, and the bridge/host-local/
// loopback/portmap set most others chain).
var CNIPlugins = []string{"bridge", "flannel", "host-local", "loopback", "portmap"}

// SandboxImage is the image of every pod's sandbox on a worker: the one
// containerd v2.4.2 defaults to (and kubeadm v1.36 names), written into
// the worker's containerd config so that it does not change with
// containerd's default unseen, and `cozyctl images list` names it for a
// rack's mirror.
const SandboxImage = "registry.k8s.io/pause:3.10.2"

// containerdConfig is the worker's /etc/containerd/config.toml:
// containerd's defaults but the sandbox image and the registry hosts'
// directory, where cozy-operator's user-data puts the rack's mirror.
// containerd 2.4 documents that directory as its default, but with a
// config file it did not read it (a pull went to registry.k8s.io itself),
// so it is named.
const containerdConfig = `# Cozy's tenant worker image (tenant/workerimage)
version = 3

[plugins.'io.containerd.cri.v1.images'.pinned_images]
  sandbox = '` + SandboxImage + `'

[plugins.'io.containerd.cri.v1.images'.registry]
  config_path = '/etc/containerd/certs.d'
`

// Cmdline is the kernel command line ISOLINUX boots with: KubeVirt's
// serial console is ttyS0; a panic reboots.
const Cmdline = "console=tty0 console=ttyS0,115200 panic=10 tsc=reliable"

var versionRE = regexp.MustCompile(`^v1\.[0-9]+\.[0-9]+$`)

func (o Options) withDefaults() (Options, error) {
	var errs []error
	if !versionRE.MatchString(o.Version) {
		errs = append(errs, fmt.Errorf("version %q is not a Kubernetes version such as v1.36.3", o.Version))
	}
	for _, f := range []struct{ v, what string }{
		{o.KernelDir, "no kernel: give the directory hack/boot-assets.sh prints"},
		{o.KubernetesDir, "no kubelet and kubeadm: give their directory (hack/worker-image.sh builds them)"},
		{o.RuntimeDir, "no containerd and CNI plugins: give the directory hack/node-assets.sh prints"},
		{o.Agent, "no cozy-worker binary: make build writes bin/cozy-worker"},
		{o.Crictl, "no crictl: hack/worker-image.sh builds it from sigs.k8s.io/cri-tools"},
		{o.Syslinux, "no ISOLINUX: give a directory with isolinux.bin, ldlinux.c32 and isohdpfx.bin"},
	} {
		if f.v == "" {
			errs = append(errs, errors.New(f.what))
		}
	}
	for _, d := range []struct {
		v   *string
		def string
	}{
		{&o.Busybox, "/bin/busybox"},
		{&o.Runc, "/usr/sbin/runc"},
		{&o.Conntrack, "/usr/sbin/conntrack"},
		{&o.Iptables, "/usr/sbin/xtables-nft-multi"},
		{&o.Xtables, "/usr/lib/x86_64-linux-gnu/xtables"},
	} {
		if *d.v == "" {
			*d.v = d.def
		}
	}
	if o.Ref == "" {
		o.Ref = DefaultRepository + ":" + o.Version
	}
	return o, errors.Join(errs...)
}

// DiskName is the qcow2's name in /disk.
func DiskName(version string) string { return "cozy-worker-" + version + ".qcow2" }

// Build writes the image into out (which must not exist) as an OCI
// layout, with the disk also at out/disk/<DiskName>.
func Build(ctx context.Context, o Options, out string) (*Image, error) {
	o, err := o.withDefaults()
	if err != nil {
		return nil, fmt.Errorf("worker image: %w", err)
	}
	if _, err := os.Stat(out); err == nil {
		return nil, fmt.Errorf("worker image: %s exists: the image goes into a new directory", out)
	}
	for _, tool := range []string{"xorriso", "qemu-img"} {
		if _, err := exec.LookPath(tool); err != nil {
			return nil, fmt.Errorf("worker image: %s is not installed (hack/install-deps.sh)", tool)
		}
	}
	for _, b := range []string{"kubelet", "kubeadm"} {
		if err := checkVersion(ctx, filepath.Join(o.KubernetesDir, b), o.Version); err != nil {
			return nil, fmt.Errorf("worker image: %w", err)
		}
	}
	tmp, err := os.MkdirTemp(filepath.Dir(filepath.Clean(out)), ".worker-image-")
	if err != nil {
		return nil, fmt.Errorf("worker image: %w", err)
	}
	defer os.RemoveAll(tmp)

	tree := filepath.Join(tmp, "iso")
	if err := o.isoTree(tree); err != nil {
		return nil, fmt.Errorf("worker image: %w", err)
	}
	iso := filepath.Join(tmp, "worker.iso")
	if err := run(ctx, []string{"SOURCE_DATE_EPOCH=0"}, "xorriso", "-as", "mkisofs", "-quiet",
		"-o", iso, "-isohybrid-mbr", filepath.Join(o.Syslinux, "isohdpfx.bin"),
		"-c", "isolinux/boot.cat", "-b", "isolinux/isolinux.bin",
		"-no-emul-boot", "-boot-load-size", "4", "-boot-info-table",
		"-V", "COZY_WORKER", "-r", tree); err != nil {
		return nil, fmt.Errorf("worker image: %w", err)
	}
	disk := filepath.Join(tmp, "layout-src", DiskName(o.Version))
	if err := os.MkdirAll(filepath.Dir(disk), 0o755); err != nil {
		return nil, err
	}
	if err := run(ctx, nil, "qemu-img", "convert", "-f", "raw", "-O", "qcow2", iso, disk); err != nil {
		return nil, fmt.Errorf("worker image: %w", err)
	}
	// KubeVirt's containerDisk: the disk in /disk, readable by its qemu
	// user (107); the image never runs as a container.
	im := ociimage.Image{
		Ref: o.Ref, Arch: "amd64", Created: time.Unix(0, 0), DataOnly: true,
		Layers: []ociimage.Layer{{CreatedBy: "cozy tenant image build " + o.Version, Files: []ociimage.File{
			{Path: "/disk/" + DiskName(o.Version), Mode: 0o444, Source: disk},
		}}},
		Config: ocispec.ImageConfig{Labels: map[string]string{
			"org.opencontainers.image.version":     o.Version,
			"org.opencontainers.image.description": "Cozy tenant worker disk (KubeVirt containerDisk): Kubernetes " + o.Version,
		}},
	}
	layout := filepath.Join(tmp, "out")
	if err := ociimage.WriteLayout(layout, im); err != nil {
		return nil, fmt.Errorf("worker image: %w", err)
	}
	if err := os.MkdirAll(filepath.Join(layout, "disk"), 0o755); err != nil {
		return nil, err
	}
	if err := os.Rename(disk, filepath.Join(layout, "disk", DiskName(o.Version))); err != nil {
		return nil, err
	}
	if err := os.Rename(layout, out); err != nil {
		return nil, fmt.Errorf("worker image: %w", err)
	}
	return &Image{Layout: out, Ref: o.Ref, Disk: filepath.Join(out, "disk", DiskName(o.Version))}, nil
}

// checkVersion runs BIN's version command: a kubelet or kubeadm of
// another version would join as that version.
func checkVersion(ctx context.Context, bin, want string) error {
	args := []string{"--version"}
	if filepath.Base(bin) == "kubeadm" {
		args = []string{"version", "-o", "short"}
	}
	outb, err := exec.CommandContext(ctx, bin, args...).Output()
	if err != nil {
		return fmt.Errorf("%s: %w", bin, err)
	}
	got := strings.TrimPrefix(strings.TrimSpace(string(outb)), "Kubernetes ")
	if got != want {
		return fmt.Errorf("%s is %s, not %s", bin, got, want)
	}
	return nil
}

func run(ctx context.Context, env []string, name string, args ...string) error {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Env = append(os.Environ(), env...)
	if outb, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("%s: %w\n%s", name, err, outb)
	}
	return nil
}

// isoTree lays out the ISO's files, every date at the epoch.
func (o Options) isoTree(dir string) error {
	initrd, err := o.initramfs()
	if err != nil {
		return err
	}
	kernel, err := os.ReadFile(filepath.Join(o.KernelDir, "vmlinuz"))
	if err != nil {
		return fmt.Errorf("kernel: %w", err)
	}
	files := map[string][]byte{
		"boot/vmlinuz":    kernel,
		"boot/initrd.lz4": initrd,
		"isolinux/isolinux.cfg": []byte("SERIAL 0 115200\nDEFAULT cozy\nPROMPT 0\nTIMEOUT 0\nLABEL cozy\n  KERNEL /boot/vmlinuz\n" +
			"  APPEND initrd=/boot/initrd.lz4 " + Cmdline + "\n"),
	}
	for _, f := range []string{"isolinux.bin", "ldlinux.c32"} {
		data, err := os.ReadFile(filepath.Join(o.Syslinux, f))
		if err != nil {
			return fmt.Errorf("ISOLINUX: %w", err)
		}
		files["isolinux/"+f] = data
	}
	epoch := time.Unix(0, 0)
	names := make([]string, 0, len(files))
	for n := range files {
		names = append(names, n)
	}
	slices.Sort(names)
	for _, n := range names {
		p := filepath.Join(dir, n)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(p, files[n], 0o644); err != nil {
			return err
		}
		if err := os.Chtimes(p, epoch, epoch); err != nil {
			return err
		}
	}
	for _, d := range []string{"boot", "isolinux", "."} {
		if err := os.Chtimes(filepath.Join(dir, d), epoch, epoch); err != nil {
			return err
		}
	}
	return nil
}

// initramfs is the node's whole root file system.
func (o Options) initramfs() ([]byte, error) {
	type file struct {
		src, dst string
		mode     fs.FileMode
		static   bool
	}
	files := []file{
		{o.Busybox, "bin/busybox", 0o755, true},
		{o.Agent, "bin/cozy-worker", 0o755, true},
		{filepath.Join(o.KubernetesDir, "kubelet"), "bin/kubelet", 0o755, true},
		{filepath.Join(o.KubernetesDir, "kubeadm"), "bin/kubeadm", 0o755, true},
		{filepath.Join(o.RuntimeDir, "bin", "containerd"), "bin/containerd", 0o755, true},
		{filepath.Join(o.RuntimeDir, "bin", "containerd-shim-runc-v2"), "bin/containerd-shim-runc-v2", 0o755, true},
		{o.Crictl, "bin/crictl", 0o755, true},
		{o.Runc, "bin/runc", 0o755, false},
		{o.Conntrack, "bin/conntrack", 0o755, false},
		{o.Iptables, "bin/xtables-nft-multi", 0o755, false},
		{filepath.Join(o.KernelDir, "config"), "boot/config", 0o644, false},
	}
	for _, p := range CNIPlugins {
		files = append(files, file{filepath.Join(o.RuntimeDir, "cni", "bin", p), "opt/cni/bin/" + p, 0o755, true})
	}
	// iptables loads its matches and targets from its extension
	// directory at run time.
	extensions, err := filepath.Glob(filepath.Join(o.Xtables, "*.so"))
	if err != nil || len(extensions) == 0 {
		return nil, fmt.Errorf("no iptables extensions in %s (Debian's iptables): %v", o.Xtables, err)
	}
	for _, e := range extensions {
		files = append(files, file{e, "usr/lib/x86_64-linux-gnu/xtables/" + filepath.Base(e), 0o644, false})
	}
	seen := map[string]bool{}
	for _, bin := range append([]string{o.Runc, o.Conntrack, o.Iptables}, extensions...) {
		libs, err := initramfs.SharedLibraries(bin)
		if err != nil {
			return nil, err
		}
		for _, l := range libs {
			if !seen[l.Dst] {
				seen[l.Dst] = true
				files = append(files, file{l.Src, l.Dst, 0o755, false})
			}
		}
	}
	order, err := os.ReadFile(filepath.Join(o.KernelDir, "modules.order"))
	if err != nil {
		return nil, fmt.Errorf("kernel modules: %w (is %s a directory from hack/boot-assets.sh?)", err, o.KernelDir)
	}
	modules := strings.Fields(string(order))
	if !slices.Contains(modules, "isofs.ko") {
		return nil, fmt.Errorf("kernel modules in %s lack isofs.ko (the cloud-init disk's file system): run hack/boot-assets.sh again", o.KernelDir)
	}
	for _, m := range modules {
		if m != filepath.Base(m) {
			return nil, fmt.Errorf("modules.order in %s: %q is not a file name", o.KernelDir, m)
		}
		files = append(files, file{filepath.Join(o.KernelDir, "modules", m), "lib/modules/" + m, 0o644, false})
	}

	a := initramfs.Archive{Compression: initramfs.LZ4}
	for _, d := range []string{"bin", "boot", "dev", "etc", "etc/cni/net.d", "etc/containerd", "lib/modules", "opt/cni/bin", "proc", "root", "run", "sys", "tmp", "var/lib", "var/log"} {
		a.Dir(d, 0o755)
	}
	a.Symlink("bin/sh", "busybox")
	for _, name := range []string{"iptables", "iptables-save", "iptables-restore", "ip6tables", "ip6tables-save", "ip6tables-restore"} {
		a.Symlink("bin/"+name, "xtables-nft-multi")
	}
	a.File("init", 0o755, []byte(strings.ReplaceAll(initScript, "@VERSION@", o.Version)))
	a.File("etc/udhcpc.script", 0o755, []byte(nodeimage.DHCPHook))
	a.File("etc/passwd", 0o644, []byte("root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n"))
	a.File("etc/group", 0o644, []byte("root:x:0:\nnogroup:x:65534:\n"))
	a.File("etc/hosts", 0o644, []byte("127.0.0.1 localhost\n::1 localhost\n"))
	a.File("etc/containerd/config.toml", 0o644, []byte(containerdConfig))
	a.File("lib/modules/modules.order", 0o644, []byte(strings.Join(modules, "\n")+"\n"))
	for _, f := range files {
		if f.static {
			if err := initramfs.CheckStatic(f.src); err != nil {
				return nil, err
			}
		}
		data, err := os.ReadFile(f.src)
		if err != nil {
			return nil, err
		}
		a.File(f.dst, f.mode, data)
	}
	var buf bytes.Buffer
	if _, err := a.WriteTo(&buf); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}
