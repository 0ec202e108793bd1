package main

import (
	"debug/elf"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"

	"cozy.dev/cozy/internal/ociimage"
)

// debRoot picks files out of a tree where Debian packages were extracted
// with dpkg-deb -x (no maintainer scripts ran), with every shared library
// they load, into image paths laid out as an installed Debian 12 system:
// /bin, /sbin, /lib and /lib64 are symlinks into /usr.
type debRoot struct {
	tree  string
	files map[string]ociimage.File // by image path
}

func newDebRoot(tree string) *debRoot {
	return &debRoot{tree: tree, files: map[string]ociimage.File{}}
}

// libDirs are where the dynamic loader of Debian's glibc looks for a
// library with no path, in order, when no ld.so.cache tells it more.
var libDirs = []string{"/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu", "/lib64", "/usr/lib64", "/lib", "/usr/lib"}

// usrMerged is where a package's path lands once /bin, /sbin, /lib and
// /lib64 are symlinks into /usr.
func usrMerged(p string) string {
	for _, d := range []string{"/bin", "/sbin", "/lib", "/lib64"} {
		if p == d || strings.HasPrefix(p, d+"/") {
			return "/usr" + p
		}
	}
	return p
}

// add picks the file at p (a path in the packages), the symlinks on the
// way to it, and, for an ELF object, its loader and the libraries it
// needs, recursively.
func (r *debRoot) add(p string) error {
	return r.addFrom(p, "")
}

func (r *debRoot) addFrom(p, neededBy string) error {
	for hops := 0; ; hops++ {
		if hops > 40 {
			return fmt.Errorf("%s: too many levels of symlinks", p)
		}
		dst := usrMerged(p)
		if _, done := r.files[dst]; done {
			return nil
		}
		src := filepath.Join(r.tree, filepath.FromSlash(p))
		info, err := os.Lstat(src)
		if err != nil {
			if neededBy != "" {
				return fmt.Errorf("%s (needed by %s) is in none of the extracted packages: add the package that ships it", p, neededBy)
			}
			return fmt.Errorf("%s is in none of the extracted packages: %w", p, err)
		}
		switch info.Mode().Type() {
		case fs.ModeSymlink:
			target, err := os.Readlink(src)
			if err != nil {
				return err
			}
			next := target
			if !path.IsAbs(target) {
				next = path.Join(path.Dir(p), target)
			}
			if !path.IsAbs(target) && path.Join(path.Dir(dst), target) != usrMerged(next) {
				// The link moved into /usr and its relative target,
				// which climbs out of its directory, would now miss.
				target = usrMerged(next)
			}
			r.files[dst] = ociimage.File{Path: dst, Mode: fs.ModeSymlink | 0o777, Target: target}
			p = next
			continue
		case 0:
			r.files[dst] = ociimage.File{Path: dst, Mode: info.Mode() & (fs.ModePerm | fs.ModeSetuid | fs.ModeSetgid), Source: src}
			return r.addNeeded(p, src)
		default:
			return fmt.Errorf("%s: a %s, want a file or a symlink", p, info.Mode().Type())
		}
	}
}

// addNeeded adds the loader and the DT_NEEDED libraries of the ELF
// object at src (p in the packages); other files need nothing.
func (r *debRoot) addNeeded(p, src string) error {
	if magic, err := readMagic(src); err != nil || magic != elf.ELFMAG {
		return err // nil for a script or a data file
	}
	f, err := elf.Open(src)
	if err != nil {
		return fmt.Errorf("%s: %w", p, err)
	}
	defer f.Close()
	for _, prog := range f.Progs {
		if prog.Type != elf.PT_INTERP {
			continue
		}
		interp := make([]byte, prog.Filesz)
		if _, err := prog.ReadAt(interp, 0); err != nil {
			return fmt.Errorf("%s: read its interpreter: %w", p, err)
		}
		if err := r.addFrom(strings.TrimRight(string(interp), "\x00"), p); err != nil {
			return err
		}
	}
	needed, err := f.ImportedLibraries()
	if err != nil {
		return fmt.Errorf("%s: %w", p, err)
	}
	var runpath []string
	for _, tag := range []elf.DynTag{elf.DT_RUNPATH, elf.DT_RPATH} {
		vals, _ := f.DynString(tag)
		for _, v := range vals {
			for _, d := range strings.Split(v, ":") {
				runpath = append(runpath, strings.ReplaceAll(d, "$ORIGIN", path.Dir(p)))
			}
		}
	}
	for _, lib := range needed {
		if strings.Contains(lib, "/") {
			if err := r.addFrom(lib, p); err != nil {
				return err
			}
			continue
		}
		found := ""
		for _, d := range append(runpath, libDirs...) {
			if _, err := os.Stat(filepath.Join(r.tree, filepath.FromSlash(d), lib)); err == nil {
				found = path.Join(d, lib)
				break
			}
		}
		if found == "" {
			return fmt.Errorf("%s needs %s, which none of the extracted packages ships: add the package that does", p, lib)
		}
		if err := r.addFrom(found, p); err != nil {
			return err
		}
	}
	return nil
}

// readMagic reads the first four bytes of a file, fewer if it is shorter.
func readMagic(file string) (string, error) {
	f, err := os.Open(file)
	if err != nil {
		return "", err
	}
	defer f.Close()
	b := make([]byte, 4)
	n, err := io.ReadFull(f, b)
	if err != nil && !errors.Is(err, io.ErrUnexpectedEOF) && !errors.Is(err, io.EOF) {
		return "", err
	}
	return string(b[:n]), nil
}

// addDir adds every file under dir (a directory of plugins the programs
// dlopen, which no DT_NEEDED names).
func (r *debRoot) addDir(dir string) error {
	entries, err := os.ReadDir(filepath.Join(r.tree, filepath.FromSlash(dir)))
	if err != nil {
		return err
	}
	for _, e := range entries {
		if err := r.add(path.Join(dir, e.Name())); err != nil {
			return err
		}
	}
	return nil
}

// addLinksTo adds the symlinks in dir that point to target, as the
// package ships them.
func (r *debRoot) addLinksTo(dir, target string) error {
	entries, err := os.ReadDir(filepath.Join(r.tree, filepath.FromSlash(dir)))
	if err != nil {
		return err
	}
	for _, e := range entries {
		if e.Type() != fs.ModeSymlink {
			continue
		}
		if t, err := os.Readlink(filepath.Join(r.tree, filepath.FromSlash(dir), e.Name())); err == nil && t == target {
			if err := r.add(path.Join(dir, e.Name())); err != nil {
				return err
			}
		}
	}
	return nil
}

// set adds a file of the image's own (a symlink that a maintainer
// script would have made, a directory).
func (r *debRoot) set(f ociimage.File) error {
	if _, dup := r.files[f.Path]; dup {
		return fmt.Errorf("%s is already in the image", f.Path)
	}
	r.files[f.Path] = f
	return nil
}

// layer is the picked files, less those that are already, identical, in
// the layers below.
func (r *debRoot) layer(createdBy string, below ...*debRoot) (ociimage.Layer, error) {
	l := ociimage.Layer{CreatedBy: createdBy}
	for p, f := range r.files {
		shared := false
		for _, b := range below {
			if g, ok := b.files[p]; ok {
				if g.Mode != f.Mode || g.Source != f.Source || g.Target != f.Target || string(g.Data) != string(f.Data) {
					return ociimage.Layer{}, fmt.Errorf("%s differs from the layer below", p)
				}
				shared = true
			}
		}
		if !shared {
			l.Files = append(l.Files, f)
		}
	}
	if len(l.Files) == 0 {
		return ociimage.Layer{}, fmt.Errorf("%s: nothing that the layers below do not hold", createdBy)
	}
	return l, nil
}
