package main

import (
	"debug/elf"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"cozy.dev/cozy/internal/ociimage"
	"cozy.dev/cozy/internal/testing/prereq"
)

func TestUsrMerged(t *testing.T) {
	for in, want := range map[string]string{
		"/bin/cp":                         "/usr/bin/cp",
		"/sbin":                           "/usr/sbin",
		"/lib/x86_64-linux-gnu/libc.so.6": "/usr/lib/x86_64-linux-gnu/libc.so.6",
		"/lib64/ld-linux-x86-64.so.2":     "/usr/lib64/ld-linux-x86-64.so.2",
		"/usr/sbin/nft":                   "/usr/sbin/nft",
		"/libexec/x":                      "/libexec/x",
		"/binaries/x":                     "/binaries/x",
		"/etc/protocols":                  "/etc/protocols",
	} {
		if got := usrMerged(in); got != want {
			t.Errorf("usrMerged(%s) = %s, want %s", in, got, want)
		}
	}
}

// tree makes a tree such as dpkg-deb -x leaves, from files (content,
// or "-> target" for a symlink).
func tree(t *testing.T, files map[string]string) string {
	t.Helper()
	root := t.TempDir()
	for p, content := range files {
		full := filepath.Join(root, p)
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		if target, ok := strings.CutPrefix(content, "-> "); ok {
			if err := os.Symlink(target, full); err != nil {
				t.Fatal(err)
			}
			continue
		}
		if err := os.WriteFile(full, []byte(content), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

// TestDebRootLinks follows symlinks into /usr as an installed system
// lays them out: relative links that stay in their directory are kept,
// those that would miss once moved are made absolute.
func TestDebRootLinks(t *testing.T) {
	root := tree(t, map[string]string{
		"/usr/sbin/iptables-nft":      "-> xtables-nft-multi",
		"/usr/sbin/xtables-nft-multi": "#!/bin/sh\n",
		"/bin/sh":                     "-> dash",
		"/bin/dash":                   "#!dash\n",
		"/sbin/tool":                  "-> ../usr/sbin/xtables-nft-multi",
		"/etc/services":               "ssh 22/tcp\n",
	})
	tests := []struct {
		add  string
		want map[string]string // image path: target, or "" for a file
	}{
		{"/usr/sbin/iptables-nft", map[string]string{"/usr/sbin/iptables-nft": "xtables-nft-multi", "/usr/sbin/xtables-nft-multi": ""}},
		{"/bin/sh", map[string]string{"/usr/bin/sh": "dash", "/usr/bin/dash": ""}},
		{"/sbin/tool", map[string]string{"/usr/sbin/tool": "/usr/sbin/xtables-nft-multi", "/usr/sbin/xtables-nft-multi": ""}},
		{"/etc/services", map[string]string{"/etc/services": ""}},
	}
	for _, tc := range tests {
		t.Run(tc.add, func(t *testing.T) {
			r := newDebRoot(root)
			if err := r.add(tc.add); err != nil {
				t.Fatal(err)
			}
			if len(r.files) != len(tc.want) {
				t.Errorf("picked %v, want %v", r.files, tc.want)
			}
			for p, target := range tc.want {
				f, ok := r.files[p]
				switch {
				case !ok:
					t.Errorf("%s not picked", p)
				case target == "" && (f.Mode.Type() != 0 || f.Source == ""):
					t.Errorf("%s: %+v, want a file", p, f)
				case target != "" && (f.Mode.Type() != fs.ModeSymlink || f.Target != target):
					t.Errorf("%s: %+v, want a symlink to %s", p, f, target)
				}
			}
		})
	}
	if err := newDebRoot(root).add("/usr/sbin/missing"); err == nil || !strings.Contains(err.Error(), "none of the extracted packages") {
		t.Errorf("a missing file: %v", err)
	}
}

// hostProgram is a dynamically linked program of this machine, with the
// loader and libraries it names; without one the prerequisite is missing
// (a failure under CI=true).
func hostProgram(t *testing.T) (string, []string) {
	t.Helper()
	const prog = "/usr/bin/env"
	f, err := elf.Open(prog)
	if err != nil {
		prereq.Missing(t, "%s: %v", prog, err)
	}
	defer f.Close()
	libs, err := f.ImportedLibraries()
	if err != nil || len(libs) == 0 || f.Machine != elf.EM_X86_64 {
		prereq.Missing(t, "%s is not a dynamically linked x86-64 program", prog)
	}
	return prog, libs
}

// TestDebRootNeeded picks a real program's loader and libraries, and
// names the library that is missing from a tree without them.
func TestDebRootNeeded(t *testing.T) {
	prog, libs := hostProgram(t)
	// This machine's root is a tree of extracted Debian packages too.
	r := newDebRoot("/")
	if err := r.add(prog); err != nil {
		t.Fatal(err)
	}
	for _, want := range append(libs, "ld-linux-x86-64.so.2") {
		found := false
		for p, f := range r.files {
			found = found || (filepath.Base(p) == want && strings.HasPrefix(p, "/usr/") && f.Path == p)
		}
		if !found {
			t.Errorf("%s not picked from %v", want, r.files)
		}
	}
	for p, f := range r.files {
		if !strings.HasPrefix(p, "/usr/") || (f.Mode.Type() == 0 && f.Source == "") {
			t.Errorf("picked %s: %+v", p, f)
		}
	}

	data, err := os.ReadFile(prog)
	if err != nil {
		t.Fatal(err)
	}
	root := tree(t, map[string]string{"/usr/bin/env": string(data), "/lib64/ld-linux-x86-64.so.2": "\x00"})
	err = newDebRoot(root).add("/usr/bin/env")
	if err == nil || !strings.Contains(err.Error(), "needs "+libs[0]) || !strings.Contains(err.Error(), "add the package") {
		t.Errorf("a tree without %s: %v", libs[0], err)
	}
}

// TestLayerBelow keeps out of a layer what the layer below holds, and
// refuses a file that differs from the one below.
func TestLayerBelow(t *testing.T) {
	base, top := newDebRoot("/x"), newDebRoot("/x")
	lib := ociimage.File{Path: "/usr/lib/libc.so.6", Mode: 0o755, Source: "/x/lib/libc.so.6"}
	for _, r := range []*debRoot{base, top} {
		if err := r.set(lib); err != nil {
			t.Fatal(err)
		}
	}
	if err := top.set(ociimage.File{Path: "/usr/sbin/conntrack", Mode: 0o755, Source: "/x/usr/sbin/conntrack"}); err != nil {
		t.Fatal(err)
	}
	l, err := top.layer("conntrack", base)
	if err != nil || len(l.Files) != 1 || l.Files[0].Path != "/usr/sbin/conntrack" {
		t.Errorf("layer %+v (%v), want conntrack alone", l, err)
	}
	if err := top.set(lib); err == nil {
		t.Error("set the same path twice")
	}
	top.files[lib.Path] = ociimage.File{Path: lib.Path, Mode: 0o644, Source: lib.Source}
	if _, err := top.layer("conntrack", base); err == nil || !strings.Contains(err.Error(), "differs") {
		t.Errorf("a file that differs from the one below: %v", err)
	}
	if _, err := base.layer("again", base); err == nil {
		t.Error("an empty layer")
	}
}
