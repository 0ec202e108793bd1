//go:build integration && bench

package pxe_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"cozy.dev/cozy/internal/netnstest"
	"cozy.dev/cozy/internal/prereq"
	"cozy.dev/cozy/internal/verdict"
)

// TestBenchHTTPFanOut is a rack booting at once: 50 clients each download
// a 100 MB initramfs over a veth pair, from `cozyctl pxe serve` and then
// from nginx serving the same file. It prints the aggregate throughput of
// each and the ratio. Run with `make bench`.
func TestBenchHTTPFanOut(t *testing.T) {
	if _, err := exec.LookPath("nginx"); err != nil {
		prereq.Missing(t, "nginx not installed: run hack/install-deps.sh bench")
	}
	const (
		clients = 50
		size    = 100 << 20
	)
	dir := t.TempDir()
	initrd := filepath.Join(dir, "initrd")
	f, err := os.Create(initrd)
	if err != nil {
		t.Fatal(err)
	}
	chunk := make([]byte, 1<<20)
	for i := range chunk {
		chunk[i] = byte(i * 7)
	}
	for range size / len(chunk) {
		if _, err := f.Write(chunk); err != nil {
			t.Fatal(err)
		}
	}
	f.Close()

	servers := []struct {
		name, path string
		start      func(t *testing.T, ns *netnstest.NS) *exec.Cmd
	}{
		{"cozy", "/assets/initrd0", func(t *testing.T, ns *netnstest.NS) *exec.Cmd {
			for _, n := range []string{"k", "b", "u"} {
				_ = os.WriteFile(filepath.Join(dir, n), []byte("x"), 0o644)
			}
			self, _ := os.Executable()
			cmd := ns.Command(context.Background(), self, "pxe", "serve", "--log-level", "error", "--interface", "boot0",
				"--allow-unknown", "--state-dir", filepath.Join(dir, "state"), "--kernel", filepath.Join(dir, "k"),
				"--initrd", initrd, "--ipxe-bios", filepath.Join(dir, "b"), "--ipxe-uefi", filepath.Join(dir, "u"))
			cmd.Env = append(os.Environ(), "COZY_TEST_RUN_CLI=1")
			return startLogged(t, cmd, dir)
		}},
		{"nginx", "/initrd", func(t *testing.T, ns *netnstest.NS) *exec.Cmd {
			conf := fmt.Sprintf(`daemon off; user root root; worker_processes auto; pid %s/nginx.pid; error_log stderr;
events { worker_connections 1024; }
http { access_log off; sendfile on; tcp_nopush on; client_body_temp_path %s; proxy_temp_path %s;
  fastcgi_temp_path %s; uwsgi_temp_path %s; scgi_temp_path %s;
  server { listen 10.79.0.1:8080; root %s; } }
`, dir, dir, dir, dir, dir, dir, dir)
			path := filepath.Join(dir, "nginx.conf")
			if err := os.WriteFile(path, []byte(conf), 0o644); err != nil {
				t.Fatal(err)
			}
			return startLogged(t, ns.Command(context.Background(), "nginx", "-c", path, "-e", "stderr"), dir)
		}},
	}
	rates := map[string]float64{}
	for _, s := range servers {
		t.Run(s.name, func(t *testing.T) {
			srv := netnstest.New(t, "hsrv")
			cli := netnstest.New(t, "hcli")
			netnstest.Veth(t, srv, "boot0", "10.79.0.1/24", cli, "eth0", "10.79.0.2/24")
			cmd := s.start(t, srv)
			defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
			client := &http.Client{Transport: &http.Transport{DialContext: cli.DialContext, MaxIdleConnsPerHost: clients}}
			url := "http://10.79.0.1:8080" + s.path
			for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(100 * time.Millisecond) {
				if resp, err := client.Head(url); err == nil {
					resp.Body.Close()
					if resp.StatusCode == 200 {
						break
					}
				}
				if time.Now().After(deadline) {
					t.Fatalf("%s not serving %s after 20 s", s.name, url)
				}
			}
			start := time.Now()
			var wg sync.WaitGroup
			errs := make(chan error, clients)
			for range clients {
				wg.Go(func() {
					resp, err := client.Get(url)
					if err != nil {
						errs <- err
						return
					}
					defer resp.Body.Close()
					n, err := io.Copy(io.Discard, resp.Body)
					if err == nil && n != size {
						err = fmt.Errorf("got %d bytes, want %d", n, size)
					}
					errs <- err
				})
			}
			wg.Wait()
			elapsed := time.Since(start)
			close(errs)
			for err := range errs {
				if err != nil {
					t.Fatal(err)
				}
			}
			rates[s.name] = float64(clients*size) / elapsed.Seconds() / (1 << 20)
			t.Logf("%-6s %d x %d MB in %v: %.0f MiB/s", s.name, clients, size>>20, elapsed.Round(time.Millisecond), rates[s.name])
		})
	}
	fmt.Printf("\nHTTP boot fan-out (%d clients x %d MB over veth):\n  cozy   %6.0f MiB/s\n  nginx  %6.0f MiB/s\n",
		clients, size>>20, rates["cozy"], rates["nginx"])
	ratio := 0.0
	if rates["nginx"] > 0 {
		ratio = rates["cozy"] / rates["nginx"]
	}
	verdict.AtLeast(fmt.Sprintf("HTTP boot fan-out (%d clients), cozy / nginx", clients), ratio, 0.9, "%.2f")
	fmt.Println()
}
