package lab

import (
	"bytes"
	"context"
	"crypto/sha256"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"cozy.dev/cozy/lab/initramfs"
)

// chooseAccel picks kvm or tcg. "auto" boots the lab's kernel under KVM
// with a tiny initramfs and keeps KVM only if that kernel reaches
// userspace: on nested hosts /dev/kvm can exist while real-mode firmware
// and kernel code fail under it (DESIGN.md). The answer is cached per
// kernel and QEMU in cacheDir.
func chooseAccel(ctx context.Context, mode, kernel, cacheDir string) (string, error) {
	switch mode {
	case "tcg":
		return "tcg", nil
	case "kvm":
		if _, err := os.Stat("/dev/kvm"); err != nil {
			return "", fmt.Errorf("--accel kvm: %w", err)
		}
		return "kvm", nil
	}
	if _, err := os.Stat("/dev/kvm"); err != nil {
		return "tcg", nil
	}
	qv, _ := exec.CommandContext(ctx, "qemu-system-x86_64", "--version").Output()
	k, err := os.ReadFile(kernel)
	if err != nil {
		return "", err
	}
	key := sha256.Sum256(append(qv, k...))
	cache := filepath.Join(cacheDir, "lab", fmt.Sprintf("kvm-probe-%x", key[:8]))
	if v, err := os.ReadFile(cache); err == nil {
		return strings.TrimSpace(string(v)), nil
	}
	accel := "tcg"
	if probeKVM(ctx, kernel) {
		accel = "kvm"
	}
	if err := os.MkdirAll(filepath.Dir(cache), 0o755); err == nil {
		_ = os.WriteFile(cache, []byte(accel+"\n"), 0o644)
	}
	return accel, nil
}

const probeMarker = "cozy-kvm-probe-ok"

// probeKVM boots kernel under KVM and reports whether its init ran.
func probeKVM(ctx context.Context, kernel string) bool {
	bb, err := os.ReadFile("/bin/busybox")
	if err != nil {
		return false
	}
	dir, err := os.MkdirTemp("", "cozy-kvm-probe")
	if err != nil {
		return false
	}
	defer os.RemoveAll(dir)
	var a initramfs.Archive
	a.File("bin/busybox", 0o755, bb)
	a.Symlink("bin/sh", "busybox")
	a.File("init", 0o755, []byte("#!/bin/sh\n/bin/busybox echo "+probeMarker+"\n/bin/busybox poweroff -f\n"))
	initrd := filepath.Join(dir, "probe.gz")
	f, err := os.Create(initrd)
	if err != nil {
		return false
	}
	_, err = a.WriteTo(f)
	if cerr := f.Close(); err != nil || cerr != nil {
		return false
	}
	ctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	var out bytes.Buffer
	cmd := exec.CommandContext(ctx, "qemu-system-x86_64", "-accel", "kvm", "-m", "256", "-nographic", "-no-reboot",
		"-nic", "none", "-kernel", kernel, "-initrd", initrd, "-append", "console=ttyS0 panic=-1 quiet")
	cmd.Stdout, cmd.Stderr = &out, &out
	_ = cmd.Run()
	return bytes.Contains(out.Bytes(), []byte(probeMarker))
}
