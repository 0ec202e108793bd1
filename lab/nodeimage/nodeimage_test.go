package nodeimage

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"

	"cozy.dev/cozy/internal/testing/prereq"
	"cozy.dev/cozy/lab/initramfs"
	"cozy.dev/cozy/lab/talosnode"
)

// fakeELF is the smallest x86-64 executable header debug/elf reads: no
// sections, and one PT_INTERP program header if dynamic.
func fakeELF(dynamic bool, payload string) []byte {
	var b bytes.Buffer
	ident := [16]byte{0x7f, 'E', 'L', 'F', 2 /* 64-bit */, 1 /* little endian */, 1 /* version */}
	b.Write(ident[:])
	phnum := uint16(0)
	if dynamic {
		phnum = 1
	}
	le := binary.LittleEndian
	_ = binary.Write(&b, le, struct {
		Type, Machine                                   uint16
		Version                                         uint32
		Entry, Phoff, Shoff                             uint64
		Flags                                           uint32
		Ehsize, Phentsize, Phnum, Shentsize, Shnum, Shx uint16
	}{Type: 2, Machine: 62, Version: 1, Phoff: 64, Ehsize: 64, Phentsize: 56, Phnum: phnum, Shentsize: 64})
	if dynamic {
		_ = binary.Write(&b, le, struct {
			Type, Flags                             uint32
			Off, Vaddr, Paddr, Filesz, Memsz, Align uint64
		}{Type: 3 /* PT_INTERP */, Align: 1})
	}
	b.WriteString(payload)
	return b.Bytes()
}

// fakeInputs writes a kernel dir and binaries; every file's content is
// distinct so a change to any one changes the key.
func fakeInputs(t *testing.T) Options {
	t.Helper()
	dir := t.TempDir()
	write := func(name string, data []byte) string {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, data, 0o755); err != nil {
			t.Fatal(err)
		}
		return p
	}
	write("kernel/vmlinuz", []byte("a kernel"))
	var order []string
	for _, m := range []string{"virtio_ring.ko", "virtio_net.ko", "virtio_blk.ko", "jbd2.ko", "ext4.ko", "nft_reject_ipv4.ko", "nft_reject_ipv6.ko"} {
		write("kernel/modules/"+m, []byte("module "+m))
		order = append(order, m)
	}
	write("kernel/modules.order", []byte(strings.Join(order, "\n")+"\n"))
	for _, b := range KubernetesBinaries {
		write("k8s/"+b, fakeELF(false, b))
	}
	for _, b := range []string{"containerd", "containerd-shim-runc-v2"} {
		write("runtime/bin/"+b, fakeELF(false, b))
	}
	for _, p := range CNIPlugins {
		write("runtime/cni/bin/"+p, fakeELF(false, "cni "+p))
	}
	return Options{
		KernelDir:     filepath.Join(dir, "kernel"),
		NodeBinary:    write("cozy-talos-node", fakeELF(false, "node")),
		Busybox:       write("busybox", fakeELF(false, "busybox")),
		KubernetesDir: filepath.Join(dir, "k8s"),
		RuntimeDir:    filepath.Join(dir, "runtime"),
		Runc:          write("runc", fakeELF(false, "runc")),
		CacheDir:      filepath.Join(dir, "cache"),
	}
}

type cpioEntry struct {
	mode uint32
	data string
}

// readInitramfs unpacks a compressed newc archive into its entries by name.
func readInitramfs(t *testing.T, path string) (map[string]cpioEntry, []string) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	zr, err := initramfs.Reader(f)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := io.ReadAll(zr)
	if err != nil {
		t.Fatal(err)
	}
	entries := map[string]cpioEntry{}
	var names []string
	field := func(hdr []byte, i int) int {
		v, err := strconv.ParseUint(string(hdr[6+8*i:14+8*i]), 16, 32)
		if err != nil {
			t.Fatalf("cpio header field %d: %v", i, err)
		}
		return int(v)
	}
	align := func(n int) int { return (n + 3) &^ 3 }
	for off := 0; ; {
		hdr := raw[off : off+110]
		if string(hdr[:6]) != "070701" {
			t.Fatalf("bad cpio magic at %d", off)
		}
		mode, size, namesize := field(hdr, 1), field(hdr, 6), field(hdr, 11)
		name := string(raw[off+110 : off+110+namesize-1])
		if name == "TRAILER!!!" {
			return entries, names
		}
		off = align(off + 110 + namesize)
		entries[name] = cpioEntry{mode: uint32(mode), data: string(raw[off : off+size])}
		names = append(names, name)
		off = align(off + size)
	}
}

func TestImageContents(t *testing.T) {
	o := fakeInputs(t)
	img, err := Build(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	if img.Dir != filepath.Join(o.CacheDir, img.Key) || img.Kernel != filepath.Join(img.Dir, KernelFile) || img.Initrd != filepath.Join(img.Dir, InitrdFile) {
		t.Errorf("image paths %+v, want the key's directory in %s", img, o.CacheDir)
	}
	if img.Cmdline != Cmdline || !strings.Contains(img.Cmdline, "console=ttyS0") || !strings.Contains(img.Cmdline, "panic=-1") {
		t.Errorf("cmdline %q: the log must reach the serial console, and a dead init must reboot", img.Cmdline)
	}
	if k, err := os.ReadFile(img.Kernel); err != nil || string(k) != "a kernel" {
		t.Errorf("kernel: %q, %v", k, err)
	}
	entries, names := readInitramfs(t, img.Initrd)
	const dir, file, link = 0o040000, 0o100000, 0o120000
	want := map[string]cpioEntry{
		"bin/sh":                    {link | 0o777, "busybox"},
		"bin/busybox":               {file | 0o755, string(fakeELF(false, "busybox"))},
		"bin/cozy-talos-node":       {file | 0o755, string(fakeELF(false, "node"))},
		"bin/etcd":                  {file | 0o755, string(fakeELF(false, "etcd"))},
		"bin/kube-apiserver":        {file | 0o755, string(fakeELF(false, "kube-apiserver"))},
		"bin/kubelet":               {file | 0o755, string(fakeELF(false, "kubelet"))},
		"bin/containerd":            {file | 0o755, string(fakeELF(false, "containerd"))},
		"bin/runc":                  {file | 0o755, string(fakeELF(false, "runc"))},
		"opt/cni/bin/flannel":       {file | 0o755, string(fakeELF(false, "cni flannel"))},
		"lib/modules/ext4.ko":       {file | 0o644, "module ext4.ko"},
		"lib/modules/virtio_blk.ko": {file | 0o644, "module virtio_blk.ko"},
		"lib/modules/modules.order": {file | 0o644, "virtio_ring.ko\nvirtio_net.ko\nvirtio_blk.ko\njbd2.ko\next4.ko\nnft_reject_ipv4.ko\nnft_reject_ipv6.ko\n"},
		"etc/hosts":                 {file | 0o644, "127.0.0.1 localhost\n::1 localhost\n"},
		"etc/udhcpc.script":         {file | 0o755, DHCPHook},
		"mnt/disk":                  {dir | 0o755, ""},
		"dev":                       {dir | 0o755, ""},
	}
	for name, w := range want {
		if got, ok := entries[name]; !ok || got != w {
			t.Errorf("%s: mode %o, %d bytes; want mode %o, %d bytes", name, got.mode, len(got.data), w.mode, len(w.data))
		}
	}
	if _, ok := entries["vmlinuz"]; ok {
		t.Error("the kernel is inside the initramfs")
	}
	init := entries["init"]
	if init.mode != file|0o755 || !strings.HasPrefix(init.data, "#!/bin/sh\n") {
		t.Errorf("init: mode %o, starts %.20q", init.mode, init.data)
	}
	if !strings.Contains(init.data, fmt.Sprintf("\n\t%d)\n", talosnode.RebootExitCode)) || strings.Contains(init.data, "@REBOOT_EXIT_CODE@") {
		t.Errorf("init does not map cozy-talos-node's reboot status %d to a reboot", talosnode.RebootExitCode)
	}
	for _, flag := range []string{"--reboot exit", "--state-dir /mnt/disk/node", "--platform metal", "services=--node-services", "$services", "--cni-bin-dir /opt/cni/bin",
		"\t" + APIOnlyArg + ") services= ;;", "mount -t cgroup2", "reboot -f", "poweroff -f"} {
		if !strings.Contains(init.data, flag) {
			t.Errorf("init lacks %q", flag)
		}
	}
	// Modules load in modules.order's order; parents come before files.
	pos := map[string]int{}
	for i, n := range names {
		pos[n] = i
	}
	if !(pos["lib/modules/virtio_ring.ko"] < pos["lib/modules/virtio_net.ko"] && pos["lib/modules/jbd2.ko"] < pos["lib/modules/ext4.ko"]) {
		t.Errorf("modules out of order: %v", names)
	}
}

// TestBuildCache: the same inputs give the same image from the cache
// (not rebuilt), byte for byte; a change to any input gives another.
func TestBuildCache(t *testing.T) {
	ctx := context.Background()
	o := fakeInputs(t)
	first, err := Build(ctx, o)
	if err != nil {
		t.Fatal(err)
	}
	before, err := os.Stat(first.Initrd)
	if err != nil {
		t.Fatal(err)
	}
	again, err := Build(ctx, o)
	if err != nil {
		t.Fatal(err)
	}
	after, err := os.Stat(again.Initrd)
	if err != nil {
		t.Fatal(err)
	}
	if *again != *first || !os.SameFile(before, after) || !before.ModTime().Equal(after.ModTime()) {
		t.Errorf("second build %+v was not the cached %+v", again, first)
	}

	// Reproducible: a fresh cache builds the same bytes.
	o2 := o
	o2.CacheDir = t.TempDir()
	fresh, err := Build(ctx, o2)
	if err != nil {
		t.Fatal(err)
	}
	a, _ := os.ReadFile(first.Initrd)
	b, _ := os.ReadFile(fresh.Initrd)
	if fresh.Key != first.Key || !bytes.Equal(a, b) {
		t.Errorf("a rebuild in another cache differs (key %s vs %s)", fresh.Key, first.Key)
	}
	if leftovers, _ := filepath.Glob(filepath.Join(o.CacheDir, ".build-*")); len(leftovers) != 0 {
		t.Errorf("temporary build directories left: %v", leftovers)
	}

	for _, input := range []func(Options) string{
		func(o Options) string { return filepath.Join(o.KernelDir, "vmlinuz") },
		func(o Options) string { return filepath.Join(o.KernelDir, "modules", "ext4.ko") },
		func(o Options) string { return o.NodeBinary },
		func(o Options) string { return o.Busybox },
		func(o Options) string { return filepath.Join(o.KubernetesDir, "kubelet") },
		func(o Options) string { return filepath.Join(o.RuntimeDir, "cni", "bin", "bridge") },
		func(o Options) string { return o.Runc },
	} {
		o := fakeInputs(t)
		base, err := Build(ctx, o)
		if err != nil {
			t.Fatal(err)
		}
		path := input(o)
		f, err := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = f.WriteString("changed")
		f.Close()
		changed, err := Build(ctx, o)
		if err != nil {
			t.Fatal(err)
		}
		if changed.Key == base.Key || changed.Dir == base.Dir {
			t.Errorf("changing %s kept the image %s", filepath.Base(path), base.Key)
		}
	}
}

// Builds racing for one image all get it, whole; one of them wrote it.
func TestConcurrentBuilds(t *testing.T) {
	o := fakeInputs(t)
	const n = 4
	imgs := make([]*Image, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { imgs[i], errs[i] = Build(context.Background(), o) })
	}
	wg.Wait()
	for i := range n {
		if errs[i] != nil {
			t.Fatalf("build %d: %v", i, errs[i])
		}
		if *imgs[i] != *imgs[0] {
			t.Errorf("build %d got %+v, build 0 %+v", i, imgs[i], imgs[0])
		}
	}
	entries, _ := os.ReadDir(o.CacheDir)
	if len(entries) != 1 || !complete(imgs[0].Dir) {
		t.Errorf("cache holds %v, want the one complete image", entries)
	}
}

func TestBuildRefuses(t *testing.T) {
	tests := []struct {
		name   string
		change func(t *testing.T, o *Options)
		err    string
	}{
		{"no node binary", func(t *testing.T, o *Options) { o.NodeBinary = "" }, "make build"},
		{"dynamic node binary", func(t *testing.T, o *Options) {
			if err := os.WriteFile(o.NodeBinary, fakeELF(true, "node"), 0o755); err != nil {
				t.Fatal(err)
			}
		}, "dynamically linked"},
		{"not a binary", func(t *testing.T, o *Options) {
			if err := os.WriteFile(filepath.Join(o.KubernetesDir, "etcd"), []byte("#!/bin/sh\n"), 0o755); err != nil {
				t.Fatal(err)
			}
		}, "statically linked x86-64"},
		{"no disk driver", func(t *testing.T, o *Options) {
			if err := os.WriteFile(filepath.Join(o.KernelDir, "modules.order"), []byte("virtio_net.ko\next4.ko\n"), 0o644); err != nil {
				t.Fatal(err)
			}
		}, "lack virtio_blk.ko: run hack/boot-assets.sh"},
		{"kernel dir from before kube-proxy's reject modules", func(t *testing.T, o *Options) {
			if err := os.WriteFile(filepath.Join(o.KernelDir, "modules.order"), []byte("virtio_net.ko\nvirtio_blk.ko\next4.ko\n"), 0o644); err != nil {
				t.Fatal(err)
			}
		}, "lack nft_reject_ipv4.ko: run hack/boot-assets.sh"},
		{"no kernel dir", func(t *testing.T, o *Options) { o.KernelDir = "" }, "hack/boot-assets.sh"},
		{"no Kubernetes binaries", func(t *testing.T, o *Options) { o.KubernetesDir = "" }, "hack/envtest-assets.sh"},
		{"no kubelet", func(t *testing.T, o *Options) { _ = os.Remove(filepath.Join(o.KubernetesDir, "kubelet")) }, "kubelet"},
		{"no containerd", func(t *testing.T, o *Options) { o.RuntimeDir = "" }, "hack/node-assets.sh"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			o := fakeInputs(t)
			tc.change(t, &o)
			_, err := Build(context.Background(), o)
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("Build: %v, want an error saying %q", err, tc.err)
			}
		})
	}
}

// A dynamically linked runc (Debian's) brings its loader and libraries,
// at the paths the loader looks for them.
func TestSharedLibraries(t *testing.T) {
	bin, err := exec.LookPath("ls")
	if err != nil {
		prereq.Missing(t, "no ls")
	}
	libs, err := initramfs.SharedLibraries(bin)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, l := range libs {
		names = append(names, l.Dst)
		if _, err := os.Stat(l.Src); err != nil {
			t.Errorf("%s: %v", l.Src, err)
		}
	}
	joined := strings.Join(names, " ")
	if !strings.Contains(joined, "ld-linux-x86-64.so.2") || !strings.Contains(joined, "libc.so.6") {
		t.Errorf("libraries of %s: %v, want the loader and libc", bin, names)
	}
	if libs, err := initramfs.SharedLibraries(filepath.Join(fakeInputs(t).KubernetesDir, "kubelet")); err != nil || len(libs) != 0 {
		t.Errorf("a static binary needs %v (%v), want nothing", libs, err)
	}
}

func TestBuildHonoursCancel(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	o := fakeInputs(t)
	if _, err := Build(ctx, o); err == nil {
		t.Fatal("Build with a cancelled context succeeded")
	}
	if entries, _ := os.ReadDir(o.CacheDir); len(entries) != 0 {
		t.Errorf("a cancelled build left %v in the cache", entries)
	}
}

// The scripts are at least valid shell (the VM test runs them for real).
func TestScriptsParse(t *testing.T) {
	sh, err := exec.LookPath("sh")
	if err != nil {
		prereq.Missing(t, "no sh")
	}
	for name, script := range map[string]string{"init.sh": initScript, "udhcpc.sh": DHCPHook} {
		cmd := exec.Command(sh, "-n")
		cmd.Stdin = strings.NewReader(script)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Errorf("%s: %v: %s", name, err, out)
		}
	}
}
