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
	"slices"
	"sync"
	"testing"
	"time"

	"cozy.dev/cozy/internal/procstat"
	"cozy.dev/cozy/internal/testing/cozyctl"
	"cozy.dev/cozy/internal/testing/netnstest"
	"cozy.dev/cozy/internal/testing/prereq"
	"cozy.dev/cozy/internal/testing/verdict"
)

// TestBenchHTTPFanOut is a rack booting at once: 50 clients each download
// a 100 MB initramfs over a veth pair, from `cozyctl pxe serve` and from
// nginx serving the same file, in nine rounds that alternate which server
// goes first. It prints each one's median aggregate throughput and the
// ratio. Run with `make bench`.
func TestBenchHTTPFanOut(t *testing.T) {
	if _, err := exec.LookPath("nginx"); err != nil {
		prereq.Missing(t, "nginx not installed: run hack/install-deps.sh bench")
	}
	const (
		clients = 50
		size    = 100 << 20
		rounds  = 9
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
	// On disk before any server reads it: writeback must not fall on
	// whichever server runs first.
	if err := f.Sync(); err != nil {
		t.Fatal(err)
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
			cmd := ns.Command(context.Background(), cozyctl.Path(t), "pxe", "serve", "--log-level", "error", "--interface", "boot0",
				"--allow-unknown", "--state-dir", filepath.Join(dir, "state"), "--kernel", filepath.Join(dir, "k"),
				"--initrd", initrd, "--ipxe-bios", filepath.Join(dir, "b"), "--ipxe-uefi", filepath.Join(dir, "u"))
			return startLogged(t, cmd, logDir(t, dir, "cozy"))
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
			return startLogged(t, ns.Command(context.Background(), "nginx", "-c", path, "-e", "stderr"), logDir(t, dir, "nginx"))
		}},
	}
	// Both servers run at once, each in its own pair of namespaces, and
	// the rounds alternate which goes first: whatever else the machine
	// is doing at some moment (writeback, a neighbour's build) falls on
	// both alike. Each server's figure is its median round.
	type target struct {
		name   string
		url    string
		client *http.Client
		pid    int
		srv    *netnstest.NS
	}
	var targets []target
	for _, s := range servers {
		srv := netnstest.New(t, "hsrv")
		cli := netnstest.New(t, "hcli")
		netnstest.Veth(t, srv, "boot0", "10.79.0.1/24", cli, "eth0", "10.79.0.2/24")
		cmd := s.start(t, srv)
		t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
		tg := target{name: s.name, url: "http://10.79.0.1:8080" + s.path, pid: cmd.Process.Pid, srv: srv,
			client: &http.Client{Transport: &http.Transport{DialContext: cli.DialContext, MaxIdleConnsPerHost: clients}}}
		for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(100 * time.Millisecond) {
			if resp, err := tg.client.Head(tg.url); err == nil {
				resp.Body.Close()
				if resp.StatusCode == 200 {
					break
				}
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s not serving %s after 20 s", s.name, tg.url)
			}
		}
		targets = append(targets, tg)
	}
	runs := map[string][]float64{}
	for round := range rounds {
		for i := range targets {
			tg := targets[(i+round)%len(targets)]
			cpu0 := treeCPU(tg.pid)
			_, sent0 := ifacePackets(t, tg.srv, "boot0")
			start := time.Now()
			var wg sync.WaitGroup
			errs := make(chan error, clients)
			for range clients {
				wg.Go(func() {
					resp, err := tg.client.Get(tg.url)
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
			cpu := treeCPU(tg.pid) - cpu0
			_, sent := ifacePackets(t, tg.srv, "boot0")
			sent -= sent0
			close(errs)
			for err := range errs {
				if err != nil {
					t.Fatalf("%s: %v", tg.name, err)
				}
			}
			rate := float64(clients*size) / elapsed.Seconds() / (1 << 20)
			runs[tg.name] = append(runs[tg.name], rate)
			// Packets on a veth are the stack's segments before they are
			// cut to the MTU: their size says how much each send batched.
			t.Logf("round %d: %-6s %d x %d MB in %v: %.0f MiB/s, server CPU %.2f s (%.0f %% of the wall time), %d packets sent (%.0f kB each)",
				round+1, tg.name, clients, size>>20, elapsed.Round(time.Millisecond), rate, cpu.Seconds(), 100*cpu.Seconds()/elapsed.Seconds(),
				sent, float64(clients*size)/float64(max(sent, 1))/1000)
		}
	}
	rates := map[string]float64{}
	for name, r := range runs {
		slices.Sort(r)
		rates[name] = r[len(r)/2]
	}
	fmt.Printf("\nHTTP boot fan-out (%d clients x %d MB over veth, median of %d alternating rounds):\n  cozy   %6.0f MiB/s\n  nginx  %6.0f MiB/s\n",
		clients, size>>20, rounds, rates["cozy"], rates["nginx"])
	ratio := 0.0
	if rates["nginx"] > 0 {
		ratio = rates["cozy"] / rates["nginx"]
	}
	verdict.AtLeast(fmt.Sprintf("HTTP boot fan-out (%d clients), cozy / nginx", clients), ratio, 0.9, "%.2f")
	fmt.Println()
}

// logDir makes a directory for one server's log beside the others'.
func logDir(t *testing.T, dir, name string) string {
	d := filepath.Join(dir, name)
	if err := os.MkdirAll(d, 0o755); err != nil {
		t.Fatal(err)
	}
	return d
}

// treeCPU is the CPU time of a process and its children (nginx's workers).
func treeCPU(pid int) time.Duration {
	children, _ := procstat.ChildrenCPU(pid)
	return processCPU(pid) + children
}
