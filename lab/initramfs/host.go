package initramfs

import (
	"debug/elf"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
)

// Library is a file a dynamically linked binary needs: Src on the host,
// Dst its path in the initramfs (relative).
type Library struct {
	Src, Dst string
}

// CheckStatic refuses a binary that needs a dynamic loader (PT_INTERP):
// the initramfs has no libc, and the kernel's "not found" for a missing
// loader would say nothing useful.
func CheckStatic(path string) error {
	f, err := elf.Open(path)
	if err != nil {
		return fmt.Errorf("%s: %w (want a statically linked x86-64 Linux binary)", path, err)
	}
	defer f.Close()
	if f.Machine != elf.EM_X86_64 {
		return fmt.Errorf("%s is for %s, not x86-64", path, f.Machine)
	}
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return fmt.Errorf("%s is dynamically linked; an initramfs has no libc (Go: build with CGO_ENABLED=0)", path)
		}
	}
	return nil
}

// libDirs are where the dynamic loader of a Debian amd64 system finds
// libraries.
var libDirs = []string{"/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu", "/lib64", "/lib", "/usr/lib"}

// SharedLibraries lists what a dynamically linked binary needs to run in
// the initramfs: its loader and every library it links, recursively, each
// at the path the loader looks for it (symlinks resolved to their
// content). A static binary needs none.
func SharedLibraries(bin string) ([]Library, error) {
	var out []Library
	seen := map[string]bool{}
	var visit func(path string, root bool) error
	visit = func(path string, root bool) error {
		f, err := elf.Open(path)
		if err != nil {
			return fmt.Errorf("%s: %w", path, err)
		}
		defer f.Close()
		if root {
			for _, p := range f.Progs {
				if p.Type != elf.PT_INTERP {
					continue
				}
				data, err := io.ReadAll(p.Open())
				if err != nil {
					return fmt.Errorf("%s: interpreter: %w", path, err)
				}
				interp := strings.TrimRight(string(data), "\x00")
				seen[interp] = true
				out = append(out, Library{Src: interp, Dst: strings.TrimPrefix(interp, "/")})
			}
		}
		needed, err := f.ImportedLibraries()
		if err != nil {
			return fmt.Errorf("%s: %w", path, err)
		}
		for _, lib := range needed {
			found := ""
			for _, d := range libDirs {
				if _, err := os.Stat(filepath.Join(d, lib)); err == nil {
					found = filepath.Join(d, lib)
					break
				}
			}
			if found == "" {
				return fmt.Errorf("%s needs %s, which is in none of %v", path, lib, libDirs)
			}
			if seen[found] {
				continue
			}
			seen[found] = true
			out = append(out, Library{Src: found, Dst: strings.TrimPrefix(found, "/")})
			if err := visit(found, false); err != nil {
				return err
			}
		}
		return nil
	}
	if err := visit(bin, true); err != nil {
		return nil, err
	}
	return out, nil
}
