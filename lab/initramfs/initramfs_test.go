package initramfs

import (
	"bytes"
	"compress/gzip"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

func sample() *Archive {
	var a Archive
	a.File("/init", 0o755, []byte("#!/bin/sh\necho hi\n"))
	a.File("bin/busybox", 0o755, []byte("ELF..."))
	a.Symlink("bin/sh", "busybox")
	a.Dir("proc", 0o555)
	a.File("etc/odd", 0o600, []byte("123")) // length not a multiple of 4
	return &a
}

func TestReproducible(t *testing.T) {
	var x, y bytes.Buffer
	if _, err := sample().WriteTo(&x); err != nil {
		t.Fatal(err)
	}
	if _, err := sample().WriteTo(&y); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(x.Bytes(), y.Bytes()) {
		t.Fatal("the same archive built twice differs")
	}
}

// The kernel's format, checked with an independent reader: GNU cpio if
// installed, else busybox's.
func TestExtractsWithCpio(t *testing.T) {
	var cpioCmd []string
	if p, err := exec.LookPath("cpio"); err == nil {
		cpioCmd = []string{p, "-idm", "--quiet"}
	} else if p, err := exec.LookPath("busybox"); err == nil {
		cpioCmd = []string{p, "cpio", "-id"}
	} else {
		t.Skip("no cpio or busybox to cross-check with; TestRoundTrip still checks the format")
	}
	var buf bytes.Buffer
	if _, err := sample().WriteTo(&buf); err != nil {
		t.Fatal(err)
	}
	zr, err := gzip.NewReader(&buf)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	cmd := exec.Command(cpioCmd[0], cpioCmd[1:]...)
	cmd.Dir = dir
	cmd.Stdin = zr
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%v: %v: %s", cpioCmd, err, out)
	}
	if b, err := os.ReadFile(filepath.Join(dir, "init")); err != nil || string(b) != "#!/bin/sh\necho hi\n" {
		t.Errorf("init: %q %v", b, err)
	}
	if fi, err := os.Stat(filepath.Join(dir, "init")); err != nil || fi.Mode().Perm() != 0o755 {
		t.Errorf("init mode: %v %v", fi.Mode(), err)
	}
	if target, err := os.Readlink(filepath.Join(dir, "bin/sh")); err != nil || target != "busybox" {
		t.Errorf("bin/sh -> %q %v", target, err)
	}
	if b, err := os.ReadFile(filepath.Join(dir, "etc/odd")); err != nil || string(b) != "123" {
		t.Errorf("etc/odd: %q %v", b, err)
	}
}

func TestRoundTrip(t *testing.T) {
	var buf bytes.Buffer
	if _, err := sample().WriteTo(&buf); err != nil {
		t.Fatal(err)
	}
	zr, err := gzip.NewReader(&buf)
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := io.ReadAll(zr)
	var names []string
	for off := 0; ; {
		hdr := string(raw[off : off+110])
		if !strings.HasPrefix(hdr, "070701") {
			t.Fatalf("bad magic at %d: %q", off, hdr[:6])
		}
		var size, namesize int
		for i, dst := range []*int{&size, &namesize} {
			field := []int{6, 11}[i] // filesize, namesize
			v := hdr[6+8*field : 6+8*field+8]
			for _, c := range v {
				*dst = *dst*16 + strings.IndexRune("0123456789ABCDEF", c)
			}
		}
		name := string(raw[off+110 : off+110+namesize-1])
		if name == "TRAILER!!!" {
			break
		}
		names = append(names, name)
		off += 110 + namesize
		off += (4 - off%4) % 4
		off += size
		off += (4 - off%4) % 4
	}
	want := "init bin bin/busybox bin/sh proc etc etc/odd"
	if got := strings.Join(names, " "); got != want {
		t.Errorf("entries %q, want %q (parents first, each once)", got, want)
	}
}
