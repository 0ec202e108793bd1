// Package ipxe renders the iPXE scripts the netboot server hands to
// machines: load a kernel and initramfs over HTTP and boot them, or leave
// the network boot and boot the local disk.
package ipxe

import (
	"errors"
	"fmt"
	"net/url"
	"strings"
)

// Boot is what one machine should boot.
type Boot struct {
	// KernelURL and InitrdURLs are absolute http(s) URLs.
	KernelURL  string
	InitrdURLs []string
	// Cmdline is the kernel command line, without initrd= arguments
	// (Script adds those: UEFI kernels find their initramfs through them).
	Cmdline string
}

// ErrUnsafe marks input that would change the script's meaning: iPXE reads
// one command per line and expands ${...}, so neither may come from data.
var ErrUnsafe = errors.New("unsafe in an iPXE script")

// Script returns the iPXE script that boots b.
func Script(b Boot) (string, error) {
	if err := checkURL(b.KernelURL); err != nil {
		return "", fmt.Errorf("kernel: %w", err)
	}
	if len(b.InitrdURLs) == 0 {
		return "", errors.New("no initramfs to boot")
	}
	if err := checkText(b.Cmdline); err != nil {
		return "", fmt.Errorf("kernel command line: %w", err)
	}
	var s strings.Builder
	s.WriteString("#!ipxe\n")
	var initrdArgs []string
	for i, u := range b.InitrdURLs {
		if err := checkURL(u); err != nil {
			return "", fmt.Errorf("initramfs %d: %w", i, err)
		}
		initrdArgs = append(initrdArgs, fmt.Sprintf("initrd=initrd%d", i))
	}
	args := strings.Join(append(initrdArgs, b.Cmdline), " ")
	fmt.Fprintf(&s, "kernel --name kernel %s %s\n", b.KernelURL, strings.TrimSpace(args))
	for i, u := range b.InitrdURLs {
		fmt.Fprintf(&s, "initrd --name initrd%d %s\n", i, u)
	}
	s.WriteString("boot kernel\n")
	return s.String(), nil
}

// LocalDisk is the script for a machine that should boot from its own disk
// (Talos is installed): leaving iPXE makes the firmware try the next boot
// device.
const LocalDisk = "#!ipxe\necho Booting from local disk\nexit\n"

func checkURL(raw string) error {
	if err := checkText(raw); err != nil {
		return err
	}
	if strings.ContainsAny(raw, " \t") {
		return fmt.Errorf("%w: URL %q has spaces", ErrUnsafe, raw)
	}
	u, err := url.Parse(raw)
	if err != nil {
		return err
	}
	if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return fmt.Errorf("URL %q: want an absolute http(s) URL", raw)
	}
	return nil
}

func checkText(s string) error {
	if strings.ContainsAny(s, "\r\n\x00") {
		return fmt.Errorf("%w: line break or NUL in %q", ErrUnsafe, s)
	}
	if strings.Contains(s, "${") {
		return fmt.Errorf("%w: settings expansion ${ in %q", ErrUnsafe, s)
	}
	return nil
}
