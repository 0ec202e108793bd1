//go:build integration

package pxe_test

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/insomniacslk/dhcp/iana"

	"cozy.dev/cozy/internal/testing/cozyctl"
)

func TestMachineConfigOnlyForItsMachine(t *testing.T) {
	r := newRig(t)
	cfgFile := filepath.Join(r.dir, "worker-1.yaml")
	const secret = "machine:\n  token: CLUSTER-SECRET-abc123\n"
	if err := os.WriteFile(cfgFile, []byte(secret), 0o600); err != nil {
		t.Fatal(err)
	}
	p := r.start(t, "--machine-config", clientMAC.String()+"="+cfgFile)
	r.cli.IP(t, "addr", "add", clientAddr+"/24", "dev", "eth0")
	r.cli.IP(t, "link", "set", "eth0", "address", clientMAC.String())
	r.httpFrom = r.cli

	resp, err := r.get("/ipxe/52-54-00-c0-21-01.ipxe", "")
	if err != nil {
		t.Fatal(err)
	}
	script, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, arg := range []string{"talos.platform=metal", "slab_nomerge", "pti=on", "init_on_alloc=1", "console=ttyS0"} {
		if !strings.Contains(string(script), arg) {
			t.Errorf("Talos script lacks %s:\n%s", arg, script)
		}
	}
	m := regexp.MustCompile(`talos\.config=http://10\.77\.0\.1:8080(/config/52-54-00-c0-21-01/[A-Za-z0-9_-]+\.yaml)`).FindStringSubmatch(string(script))
	if m == nil {
		t.Fatalf("no per-machine talos.config URL in:\n%s", script)
	}
	configPath := m[1]

	get := func(path string) (int, string) { return r.fetch(t, path) }
	if code, body := get(configPath); code != 200 || body != secret {
		t.Fatalf("its own machine: %d %q", code, body)
	}
	if code, body := get("/config/52-54-00-c0-21-01/guessed.yaml"); code != 403 || strings.Contains(body, "SECRET") {
		t.Errorf("wrong token: %d %q", code, body)
	}
	if code, _ := get("/config/52-54-00-de-ad-01/" + filepath.Base(configPath)); code != 404 {
		t.Errorf("a machine without a config: %d", code)
	}
	// The right URL from another machine at the same address (a
	// different MAC on the wire) is refused.
	r.cli.IP(t, "link", "set", "eth0", "address", "02:00:00:00:be:ef")
	r.srv.IP(t, "neigh", "flush", "dev", "boot0")
	if code, body := get(configPath); code != 403 || strings.Contains(body, "SECRET") {
		t.Errorf("right token, another MAC: %d %q", code, body)
	}
	// And from another host (here the server's own namespace): the machine
	// was seen at 10.77.0.2.
	r.httpFrom = r.srv
	if code, body := get(configPath); code != 403 || strings.Contains(body, "SECRET") {
		t.Errorf("right token, wrong host: %d %q", code, body)
	}

	p.stop(t)
	logs := r.stderr.String()
	if strings.Contains(logs, "CLUSTER-SECRET") || strings.Contains(logs, strings.TrimSuffix(filepath.Base(configPath), ".yaml")) {
		t.Errorf("config or token in the server log:\n%s", logs)
	}
	if !strings.Contains(logs, "machine config served") {
		t.Errorf("no record of the config being served:\n%s", logs)
	}
}

func TestMachineConfigMustBePrivate(t *testing.T) {
	r := newRig(t)
	cfgFile := filepath.Join(r.dir, "open.yaml")
	if err := os.WriteFile(cfgFile, []byte("machine: {}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := r.srv.Command(context.Background(), cozyctl.Path(t), "pxe", "serve", "--interface", "boot0", "--state-dir", r.state,
		"--kernel", filepath.Join(r.dir, "vmlinuz"), "--initrd", filepath.Join(r.dir, "initrd"),
		"--ipxe-bios", filepath.Join(r.dir, "undionly.kpxe"), "--ipxe-uefi", filepath.Join(r.dir, "ipxe.efi"),
		"--machine-config", clientMAC.String()+"="+cfgFile)
	out, err := cmd.CombinedOutput()
	if err == nil || !strings.Contains(string(out), "chmod 600") {
		t.Fatalf("a world-readable machine config was served: %v\n%s", err, out)
	}
}

// Talos fetched its config, installed, rebooted: with
// --local-disk-after-install the next boot leaves the network for the disk.
func TestLocalDiskAfterInstall(t *testing.T) {
	r := newRig(t)
	cfgFile := filepath.Join(r.dir, "cp-1.yaml")
	if err := os.WriteFile(cfgFile, []byte("machine: {}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	r.start(t, "--machine-config", clientMAC.String()+"="+cfgFile, "--local-disk-after-install")
	r.cli.IP(t, "link", "set", "eth0", "address", clientMAC.String())

	// First boot: the firmware asks DHCP, iPXE fetches the script, Talos
	// fetches its config.
	if _, err := r.discover(t, clientMAC, pxeDiscover(iana.EFI_X86_64, false)...); err != nil {
		t.Fatal(err)
	}
	r.cli.IP(t, "addr", "add", clientAddr+"/24", "dev", "eth0")
	r.httpFrom = r.cli
	script := r.body(t, "/ipxe/52-54-00-c0-21-01.ipxe")
	m := regexp.MustCompile(`talos\.config=http://10\.77\.0\.1:8080(/\S+)`).FindStringSubmatch(script)
	if m == nil {
		t.Fatalf("first boot script:\n%s", script)
	}
	r.body(t, m[1])

	// The reboot after install.
	if _, err := r.discover(t, clientMAC, pxeDiscover(iana.EFI_X86_64, false)...); err != nil {
		t.Fatal(err)
	}
	if got := r.body(t, "/ipxe/52-54-00-c0-21-01.ipxe"); !strings.Contains(got, "\nexit\n") || strings.Contains(got, "kernel") {
		t.Errorf("installed machine's script does not boot the disk:\n%s", got)
	}
}

// fetch GETs a path and returns the status and body.
func (r *rig) fetch(t *testing.T, path string) (int, string) {
	t.Helper()
	resp, err := r.get(path, "")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// body GETs a path and requires 200.
func (r *rig) body(t *testing.T, path string) string {
	t.Helper()
	code, b := r.fetch(t, path)
	if code != 200 {
		t.Fatalf("GET %s: %d %s", path, code, b)
	}
	return b
}
