package tftp

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pin/tftp/v3"
)

// startServer serves files on a loopback port and stops when the test ends.
func startServer(t *testing.T, files map[string][]byte) string {
	return startServerWith(t, &Server{}, files)
}

func startServerWith(t *testing.T, s *Server, files map[string][]byte) string {
	t.Helper()
	dir := t.TempDir()
	s.Files = map[string]string{}
	for name, content := range files {
		p := filepath.Join(dir, strings.ReplaceAll(name, "/", "_"))
		if err := os.WriteFile(p, content, 0o644); err != nil {
			t.Fatal(err)
		}
		s.Files[name] = p
	}
	// A file outside the served set, for traversal attempts to aim at.
	if err := os.WriteFile(filepath.Join(dir, "secret"), []byte("no"), 0o600); err != nil {
		t.Fatal(err)
	}
	conn, err := net.ListenPacket("udp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Serve(ctx, conn) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("serve: %v", err)
		}
	})
	return conn.LocalAddr().String()
}

func fetch(addr, name string, blksize int) ([]byte, int64, error) {
	c, err := tftp.NewClient(addr)
	if err != nil {
		return nil, 0, err
	}
	if blksize > 0 {
		c.SetBlockSize(blksize)
	}
	c.RequestTSize(true)
	wt, err := c.Receive(name, "octet")
	if err != nil {
		return nil, 0, err
	}
	size, _ := wt.(tftp.IncomingTransfer).Size()
	var b bytes.Buffer
	_, err = wt.WriteTo(&b)
	return b.Bytes(), size, err
}

func TestServe(t *testing.T) {
	big := make([]byte, 3<<20+17) // not a multiple of any block size
	if _, err := rand.Read(big); err != nil {
		t.Fatal(err)
	}
	small := []byte("#!ipxe\n")
	addr := startServer(t, map[string][]byte{"undionly.kpxe": big, "efi/ipxe.efi": small})

	tests := []struct {
		name    string
		file    string
		blksize int
		want    []byte
		wantErr string
	}{
		{name: "default 512-byte blocks", file: "undionly.kpxe", want: big},
		{name: "negotiated blksize", file: "undionly.kpxe", blksize: 1468, want: big},
		{name: "leading slash", file: "/efi/ipxe.efi", want: small},
		{name: "unknown file", file: "pxelinux.0", wantErr: "file not found"},
		{name: "traversal", file: "../secret", wantErr: "path traversal"},
		{name: "traversal inside a path", file: "efi/../../secret", wantErr: "path traversal"},
		{name: "backslash", file: `efi\ipxe.efi`, wantErr: "invalid file name"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, size, err := fetch(addr, tc.file, tc.blksize)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error = %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, tc.want) {
				t.Fatalf("got %d bytes, want %d (content differs)", len(got), len(tc.want))
			}
			if size != int64(len(tc.want)) {
				t.Errorf("tsize = %d, want %d", size, len(tc.want))
			}
		})
	}
}

func TestConcurrentTransfers(t *testing.T) {
	content := make([]byte, 256<<10)
	if _, err := rand.Read(content); err != nil {
		t.Fatal(err)
	}
	addr := startServer(t, map[string][]byte{"ipxe.efi": content})
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	for range 16 {
		wg.Go(func() {
			got, _, err := fetch(addr, "ipxe.efi", 1468)
			if err == nil && !bytes.Equal(got, content) {
				err = errors.New("content differs")
			}
			errs <- err
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Error(err)
		}
	}
}

func TestWriteRefused(t *testing.T) {
	addr := startServer(t, map[string][]byte{"ipxe.efi": []byte("x")})
	c, err := tftp.NewClient(addr)
	if err != nil {
		t.Fatal(err)
	}
	rf, err := c.Send("ipxe.efi", "octet")
	if err == nil {
		_, err = rf.ReadFrom(strings.NewReader("overwrite"))
	}
	if err == nil {
		t.Fatal("write request accepted by a read-only server")
	}
}

func TestCleanName(t *testing.T) {
	tests := []struct {
		in, want string
		ok       bool
	}{
		{"undionly.kpxe", "undionly.kpxe", true},
		{"/ipxe.efi", "ipxe.efi", true},
		{"a//b/./c", "a/b/c", true},
		{"..", "", false},
		{"a/../../b", "", false},
		{"/", "", false},
		{"", "", false},
		{"a\x00b", "", false},
		{strings.Repeat("a", 256), "", false},
	}
	for _, tc := range tests {
		got, err := CleanName(tc.in)
		if (err == nil) != tc.ok || got != tc.want {
			t.Errorf("CleanName(%q) = %q, %v; want %q, ok=%v", tc.in, got, err, tc.want, tc.ok)
		}
	}
}

func FuzzCleanName(f *testing.F) {
	for _, s := range []string{"undionly.kpxe", "../etc/passwd", "a/./b", "/", "..\\x", "a/b/../c"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, name string) {
		clean, err := CleanName(name)
		if err != nil {
			return
		}
		if clean == "" || strings.HasPrefix(clean, "/") || hasDotDotSegment(clean) {
			t.Fatalf("CleanName(%q) = %q escapes the served set", name, clean)
		}
	})
}

func hasDotDotSegment(p string) bool {
	for _, seg := range strings.Split(p, "/") {
		if seg == ".." {
			return true
		}
	}
	return false
}

func TestOnSent(t *testing.T) {
	sent := make(chan string, 4)
	s := &Server{OnSent: func(file string, ip netip.Addr) { sent <- file + " " + ip.String() }}
	addr := startServerWith(t, s, map[string][]byte{"ipxe.efi": []byte("x")})
	if _, _, err := fetch(addr, "/ipxe.efi", 0); err != nil {
		t.Fatal(err)
	}
	if _, _, err := fetch(addr, "nope", 0); err == nil {
		t.Fatal("fetched a missing file")
	}
	select {
	case got := <-sent:
		if got != "ipxe.efi 127.0.0.1" {
			t.Errorf("OnSent(%s), want ipxe.efi 127.0.0.1", got)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("OnSent not called for a finished transfer")
	}
	select {
	case got := <-sent:
		t.Errorf("OnSent(%s) for a failed transfer", got)
	case <-time.After(200 * time.Millisecond):
	}
}
