package kernelimage

import (
	"os"
	"path/filepath"
	"testing"
)

func TestArch(t *testing.T) {
	x86 := make([]byte, 0x400)
	copy(x86[0x202:], "HdrS")
	arm := make([]byte, 0x400)
	copy(arm[0x38:], "ARM\x64")
	tests := []struct {
		name    string
		content []byte
		want    string
	}{
		{"x86 bzImage", x86, AMD64},
		{"arm64 Image", arm, ARM64},
		{"gzip (a compressed arm64 vmlinuz)", []byte("\x1f\x8b\x08\x00rest"), ""},
		{"empty", nil, ""},
		{"cut short before the x86 magic", x86[:0x203], ""},
	}
	dir := t.TempDir()
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := filepath.Join(dir, "k")
			if err := os.WriteFile(p, tc.content, 0o644); err != nil {
				t.Fatal(err)
			}
			got, err := Arch(p)
			if err != nil || got != tc.want {
				t.Errorf("Arch = %q, %v; want %q", got, err, tc.want)
			}
		})
	}
	if _, err := Arch(filepath.Join(dir, "missing")); err == nil {
		t.Error("a missing file: no error")
	}
	// The kernels the tests boot, when hack/boot-assets.sh has fetched them.
	for env, want := range map[string]string{"COZY_BOOT_ASSETS": AMD64, "COZY_BOOT_ASSETS_ARM64": ARM64} {
		if d := os.Getenv(env); d != "" {
			if got, err := Arch(filepath.Join(d, "vmlinuz")); err != nil || got != want {
				t.Errorf("Debian's kernel in $%s: %q, %v; want %q", env, got, err, want)
			}
		}
	}
}
