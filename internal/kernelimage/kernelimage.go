// Package kernelimage is what a machine netboots (Image), and which CPU
// a Linux kernel file boots on, from the magic numbers its boot protocol
// puts in its header (Arch).
package kernelimage

import (
	"io"
	"os"
)

// Image is what a machine netboots: a kernel, its initramfs images
// (loaded in order) and its command line.
type Image struct {
	Kernel  string
	Initrds []string
	Cmdline string
}

// Architectures a kernel header names, as GOARCH spells them.
const (
	AMD64 = "amd64"
	ARM64 = "arm64"
)

// Arch reads the start of the kernel at path: an x86 bzImage has "HdrS"
// at 0x202 (the x86 boot protocol), an arm64 Image "ARM\x64" at 0x38
// (Documentation/arch/arm64/booting.rst). Anything else, a compressed
// arm64 vmlinuz say, is "" (unknown), not an error.
func Arch(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	head := make([]byte, 0x206)
	n, err := io.ReadFull(f, head)
	if err != nil && err != io.ErrUnexpectedEOF && err != io.EOF {
		return "", err
	}
	return archOf(head[:n]), nil
}

func archOf(head []byte) string {
	at := func(off int, magic string) bool {
		return len(head) >= off+len(magic) && string(head[off:off+len(magic)]) == magic
	}
	switch {
	case at(0x202, "HdrS"):
		return AMD64
	case at(0x38, "ARM\x64"):
		return ARM64
	}
	return ""
}
