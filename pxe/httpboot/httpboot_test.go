package httpboot

import (
	"bytes"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"
)

func TestHandler(t *testing.T) {
	dir := t.TempDir()
	kernel := bytes.Repeat([]byte("0123456789"), 1000)
	kpath := filepath.Join(dir, "vmlinuz")
	if err := os.WriteFile(kpath, kernel, 0o644); err != nil {
		t.Fatal(err)
	}
	known := net.HardwareAddr{0x52, 0x54, 0, 0xab, 0xcd, 0xef}
	s := &Server{
		Script: func(mac net.HardwareAddr) (string, bool) {
			return "#!ipxe\nboot\n", bytes.Equal(mac, known)
		},
		Assets:    map[string]string{"vmlinuz": kpath, "gone": filepath.Join(dir, "missing")},
		BootFiles: map[string]string{"ipxe.efi": kpath},
	}
	srv := httptest.NewServer(s.Handler())
	defer srv.Close()

	tests := []struct {
		name       string
		path       string
		rangeHdr   string
		wantStatus int
		wantBody   []byte
	}{
		{"script for a known machine", "/ipxe/52-54-00-ab-cd-ef.ipxe", "", 200, []byte("#!ipxe\nboot\n")},
		{"script MAC in upper case", "/ipxe/52-54-00-AB-CD-EF.ipxe", "", 200, []byte("#!ipxe\nboot\n")},
		{"unknown machine", "/ipxe/52-54-00-aa-bb-cc.ipxe", "", 404, nil},
		{"not a MAC", "/ipxe/nonsense.ipxe", "", 400, nil},
		{"no .ipxe suffix", "/ipxe/52-54-00-ab-cd-ef", "", 404, nil},
		{"whole kernel", "/assets/vmlinuz", "", 200, kernel},
		{"kernel range resumes", "/assets/vmlinuz", "bytes=9000-", 206, kernel[9000:]},
		{"kernel middle range", "/assets/vmlinuz", "bytes=10-19", 206, kernel[10:20]},
		{"unsatisfiable range", "/assets/vmlinuz", "bytes=20000-", 416, nil},
		{"iPXE binary for HTTP boot", "/boot/ipxe.efi", "", 200, kernel},
		{"asset not in the set", "/assets/..%2f..%2fetc%2fpasswd", "", 404, nil},
		{"asset whose file vanished", "/assets/gone", "", 500, nil},
		{"health", "/healthz", "", 200, []byte("ok\n")},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			req, _ := http.NewRequest("GET", srv.URL+tc.path, nil)
			if tc.rangeHdr != "" {
				req.Header.Set("Range", tc.rangeHdr)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			body, _ := io.ReadAll(resp.Body)
			if resp.StatusCode != tc.wantStatus {
				t.Fatalf("status %d, want %d (%s)", resp.StatusCode, tc.wantStatus, body)
			}
			if tc.wantBody != nil && !bytes.Equal(body, tc.wantBody) {
				t.Errorf("body: got %d bytes, want %d", len(body), len(tc.wantBody))
			}
		})
	}
}

func TestOnFetch(t *testing.T) {
	dir := t.TempDir()
	kpath := filepath.Join(dir, "kernel")
	if err := os.WriteFile(kpath, bytes.Repeat([]byte("k"), 4096), 0o644); err != nil {
		t.Fatal(err)
	}
	var got []Fetch
	s := &Server{
		Script:  func(net.HardwareAddr) (string, bool) { return "#!ipxe\n", true },
		Assets:  map[string]string{"kernel": kpath},
		OnFetch: func(f Fetch) { got = append(got, f) },
	}
	srv := httptest.NewServer(s.Handler())
	defer srv.Close()
	for _, tc := range []struct{ path, rangeHdr string }{
		{"/ipxe/52-54-00-ab-cd-ef.ipxe", ""},
		{"/assets/kernel", "bytes=0-99"}, // a first part: not a download yet
		{"/assets/kernel", "bytes=100-"}, // the rest: now it is
		{"/assets/kernel", ""},           // whole
		{"/assets/missing", ""},          // 404: nothing
	} {
		req, _ := http.NewRequest("GET", srv.URL+tc.path, nil)
		if tc.rangeHdr != "" {
			req.Header.Set("Range", tc.rangeHdr)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	want := []string{"script 52:54:00:ab:cd:ef", "asset kernel", "asset kernel"}
	if len(got) != len(want) {
		t.Fatalf("fetches %+v, want %v", got, want)
	}
	for i, f := range got {
		desc := f.Kind + " " + f.Name
		if f.Kind == "script" {
			desc = f.Kind + " " + f.MAC.String()
		}
		if desc != want[i] || f.Remote.String() != "127.0.0.1" {
			t.Errorf("fetch %d = %q from %v, want %q from 127.0.0.1", i, desc, f.Remote, want[i])
		}
	}
}

func TestMachineConfig(t *testing.T) {
	var logs bytes.Buffer
	known := net.HardwareAddr{0x52, 0x54, 0, 0xab, 0xcd, 0xef}
	var fetched []Fetch
	s := &Server{
		Script: func(net.HardwareAddr) (string, bool) { return "", false },
		MachineConfig: func(r ConfigRequest) ([]byte, int) {
			switch {
			case !bytes.Equal(r.MAC, known):
				return nil, http.StatusNotFound
			case r.Token != "s3cret-token":
				return nil, http.StatusForbidden
			}
			return []byte("machine:\n  ca: KEY\n"), http.StatusOK
		},
		OnFetch: func(f Fetch) { fetched = append(fetched, f) },
		Log:     slog.New(slog.NewTextHandler(&logs, nil)),
	}
	srv := httptest.NewServer(s.Handler())
	defer srv.Close()
	tests := []struct {
		path string
		want int
	}{
		{"/config/52-54-00-ab-cd-ef/s3cret-token.yaml", 200},
		{"/config/52-54-00-ab-cd-ef/guess.yaml", 403},
		{"/config/52-54-00-00-00-01/s3cret-token.yaml", 404},
		{"/config/not-a-mac/s3cret-token.yaml", 404},
		{"/config/52-54-00-ab-cd-ef/s3cret-token", 404},
	}
	for _, tc := range tests {
		resp, err := http.Get(srv.URL + tc.path)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != tc.want {
			t.Errorf("%s: %d, want %d", tc.path, resp.StatusCode, tc.want)
		}
		if tc.want != 200 && bytes.Contains(body, []byte("KEY")) {
			t.Errorf("%s: refused but leaked the config", tc.path)
		}
		if tc.want == 200 && resp.Header.Get("Cache-Control") != "no-store" {
			t.Errorf("config response may be cached")
		}
	}
	if len(fetched) != 1 || fetched[0].Kind != "config" || !bytes.Equal(fetched[0].MAC, known) {
		t.Errorf("fetches: %+v", fetched)
	}
	if bytes.Contains(logs.Bytes(), []byte("s3cret")) || bytes.Contains(logs.Bytes(), []byte("KEY")) {
		t.Errorf("token or config in the log:\n%s", logs.String())
	}
}
