package initramfs

import (
	"bytes"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"cozy.dev/cozy/internal/testing/prereq"
)

var compressions = map[string]Compression{"gzip": Gzip, "lz4": LZ4}

func sample() *Archive {
	var a Archive
	a.File("/init", 0o755, []byte("#!/bin/sh\necho hi\n"))
	a.File("bin/busybox", 0o755, []byte("ELF..."))
	a.Symlink("bin/sh", "busybox")
	a.Dir("proc", 0o555)
	a.File("etc/odd", 0o600, []byte("123")) // length not a multiple of 4
	return &a
}

func compressed(t *testing.T, c Compression) *bytes.Buffer {
	t.Helper()
	a := sample()
	a.Compression = c
	var buf bytes.Buffer
	if _, err := a.WriteTo(&buf); err != nil {
		t.Fatal(err)
	}
	return &buf
}

func TestReproducible(t *testing.T) {
	for name, c := range compressions {
		if !bytes.Equal(compressed(t, c).Bytes(), compressed(t, c).Bytes()) {
			t.Errorf("%s: the same archive built twice differs", name)
		}
	}
}

func TestReaderRejectsOtherFormats(t *testing.T) {
	if _, err := Reader(strings.NewReader("070701 plain cpio")); err == nil {
		t.Error("an uncompressed archive was taken for a compressed one")
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
		prereq.Missing(t, "no cpio or busybox to cross-check with (hack/install-deps.sh); TestRoundTrip still checks the format")
	}
	for name, c := range compressions {
		t.Run(name, func(t *testing.T) { extractWithCpio(t, cpioCmd, c) })
	}
}

func extractWithCpio(t *testing.T, cpioCmd []string, c Compression) {
	zr, err := Reader(compressed(t, c))
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
	for name, c := range compressions {
		t.Run(name, func(t *testing.T) { roundTrip(t, c) })
	}
}

func roundTrip(t *testing.T, c Compression) {
	zr, err := Reader(compressed(t, c))
	if err != nil {
		t.Fatal(err)
	}
	raw, err := io.ReadAll(zr)
	if err != nil {
		t.Fatal(err)
	}
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
