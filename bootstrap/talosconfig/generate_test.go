package talosconfig

import (
	"bytes"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	clientconfig "github.com/siderolabs/talos/pkg/machinery/client/config"
	"github.com/siderolabs/talos/pkg/machinery/config/configloader"
	"github.com/siderolabs/talos/pkg/machinery/config/encoder"
	"github.com/siderolabs/talos/pkg/machinery/config/generate/secrets"

	"cozy.dev/cozy/bootstrap/rack"
)

var update = flag.Bool("update", false, "rewrite the golden files")

// testSecrets is a bundle made for these tests only (make it anew with
// -update), so golden configs are stable.
func testSecrets(t *testing.T) *secrets.Bundle {
	t.Helper()
	path := "testdata/secrets.yaml"
	if *update {
		if _, err := os.Stat(path); os.IsNotExist(err) {
			if _, _, err := LoadOrCreateSecrets(path, nil); err != nil {
				t.Fatal(err)
			}
		}
	}
	b, err := secrets.LoadBundle(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestGolden generates every machine of each test rack and compares the
// config, with secrets redacted, to testdata/golden/<rack>/<host>.yaml.
func TestGolden(t *testing.T) {
	b := testSecrets(t)
	for _, name := range []string{"single", "ha", "workers"} {
		t.Run(name, func(t *testing.T) {
			r, err := rack.Load(filepath.Join("testdata/racks", name+".yaml"))
			if err != nil {
				t.Fatal(err)
			}
			g := &Generator{Rack: r, Secrets: b}
			for i := range r.Machines {
				m := &r.Machines[i]
				data, err := g.MachineConfig(m)
				if err != nil {
					t.Fatalf("%s: %v", m.Hostname, err)
				}
				cfg, err := configloader.NewFromBytes(data)
				if err != nil {
					t.Fatalf("%s: the machinery cannot load its own config: %v", m.Hostname, err)
				}
				if _, err := cfg.Validate(metal{}, validationOptions...); err != nil {
					t.Errorf("%s: not valid for metal: %v", m.Hostname, err)
				}
				redacted, err := cfg.RedactSecrets("REDACTED").EncodeBytes(encoder.WithComments(encoder.CommentsDisabled))
				if err != nil {
					t.Fatal(err)
				}
				golden := filepath.Join("testdata/golden", name, m.Hostname+".yaml")
				if *update {
					_ = os.MkdirAll(filepath.Dir(golden), 0o755)
					if err := os.WriteFile(golden, redacted, 0o644); err != nil {
						t.Fatal(err)
					}
				}
				want, err := os.ReadFile(golden)
				if err != nil {
					t.Fatalf("%v (run go test -update)", err)
				}
				if !bytes.Equal(redacted, want) {
					t.Errorf("%s differs from %s (go test -update, then review the diff):\n%s", m.Hostname, golden, firstDiff(string(want), string(redacted)))
				}
			}
		})
	}
}

func firstDiff(want, got string) string {
	w, g := strings.Split(want, "\n"), strings.Split(got, "\n")
	for i := 0; i < len(w) || i < len(g); i++ {
		var a, b string
		if i < len(w) {
			a = w[i]
		}
		if i < len(g) {
			b = g[i]
		}
		if a != b {
			return fmt.Sprintf("line %d:\n  want %s\n  got  %s", i+1, a, b)
		}
	}
	return ""
}

// What the platform needs must be in every config, whatever the rack says.
func TestPlatformNeeds(t *testing.T) {
	r, err := rack.Load("testdata/racks/ha.yaml")
	if err != nil {
		t.Fatal(err)
	}
	g := &Generator{Rack: r, Secrets: testSecrets(t)}
	data, err := g.MachineConfig(&r.Machines[2])
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := configloader.NewFromBytes(data)
	if err != nil {
		t.Fatal(err)
	}
	raw := cfg.RawV1Alpha1()
	var mods []string
	for _, m := range raw.MachineConfig.MachineKernel.KernelModules {
		mods = append(mods, m.ModuleName+strings.Join(m.ModuleParameters, ","))
	}
	if got, want := strings.Join(mods, " "), "drbdusermode_helper=disabled zfs spl openvswitch vfio_pci vfio_iommu_type1"; got != want {
		t.Errorf("kernel modules %q, want %q", got, want)
	}
	c := cfg.Cluster()
	if c.Network().CNI().Name() != "none" || c.Proxy().Enabled() {
		t.Errorf("CNI %q, kube-proxy enabled %v; want none and disabled", c.Network().CNI().Name(), c.Proxy().Enabled())
	}
	if !c.ScheduleOnControlPlanes() {
		t.Error("scheduling on control planes is not allowed")
	}
	if got := raw.MachineConfig.MachineInstall.InstallDiskSelector; got == nil || got.Type != "ssd" {
		t.Errorf("install disk selector = %+v, want type ssd", got)
	}
	if img := cfg.Machine().Install().Image(); !strings.HasPrefix(img, "factory.talos.dev/metal-installer/") {
		t.Errorf("install image %q is not the factory's metal installer", img)
	}
	if got := c.Etcd().AdvertisedSubnets(); len(got) != 1 || got[0] != "10.10.0.0/24" {
		t.Errorf("etcd advertised subnets %v", got)
	}
	if got := cfg.Machine().Kubelet().NodeIP().ValidSubnets(); len(got) != 1 || got[0] != "10.10.0.0/24" {
		t.Errorf("kubelet node IP subnets %v", got)
	}
	var vipLink string
	for _, l := range cfg.NetworkVirtualIPConfigs() {
		vipLink = l.Link()
	}
	if vipLink != "eno1" {
		t.Errorf("VIP on link %q, want eno1 (the interface in the VIP's subnet)", vipLink)
	}
	if got := cfg.NetworkHostnameConfig().Hostname(); got != "cp3" {
		t.Errorf("hostname %q", got)
	}
}

func TestWriteKeepsSecretsAndModes(t *testing.T) {
	r, err := rack.Load("testdata/racks/workers.yaml")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	w, err := Write(r, dir)
	if err != nil {
		t.Fatal(err)
	}
	if !w.SecretsCreated || len(w.Configs) != 3 {
		t.Fatalf("first Write: %+v", w)
	}
	first, _ := os.ReadFile(filepath.Join(dir, SecretsFile))
	w, err = Write(r, dir)
	if err != nil {
		t.Fatal(err)
	}
	second, _ := os.ReadFile(filepath.Join(dir, SecretsFile))
	if w.SecretsCreated || !bytes.Equal(first, second) {
		t.Error("the second Write replaced the secrets bundle")
	}
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		fi, _ := e.Info()
		if fi.Mode().Perm() != 0o600 {
			t.Errorf("%s has mode %v, want 0600", e.Name(), fi.Mode().Perm())
		}
		if strings.HasPrefix(e.Name(), ".") {
			t.Errorf("temporary file %s left behind", e.Name())
		}
	}
	tc, err := clientconfig.Open(w.Talosconfig)
	if err != nil {
		t.Fatal(err)
	}
	if ctx := tc.Contexts[tc.Context]; tc.Context != "workers" || len(ctx.Endpoints) != 1 || ctx.Endpoints[0] != "192.168.50.10" {
		t.Errorf("talosconfig context %q: %+v", tc.Context, tc.Contexts[tc.Context])
	}

	// A bundle someone left world-readable is tightened, not rewritten.
	if err := os.Chmod(filepath.Join(dir, SecretsFile), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Write(r, dir); err != nil {
		t.Fatal(err)
	}
	fi, _ := os.Stat(filepath.Join(dir, SecretsFile))
	third, _ := os.ReadFile(filepath.Join(dir, SecretsFile))
	if fi.Mode().Perm() != 0o600 || !bytes.Equal(first, third) {
		t.Errorf("loose bundle: mode %v, unchanged %v", fi.Mode().Perm(), bytes.Equal(first, third))
	}
}

// Runs racing to create the bundle all end up with the same one.
func TestSecretsCreatedOnce(t *testing.T) {
	path := filepath.Join(t.TempDir(), SecretsFile)
	var wg sync.WaitGroup
	ids := make([]string, 3)
	created := make([]bool, 3)
	for i := range ids {
		wg.Go(func() {
			b, c, err := LoadOrCreateSecrets(path, nil)
			if err != nil {
				t.Error(err)
				return
			}
			ids[i], created[i] = b.Cluster.ID, c
		})
	}
	wg.Wait()
	n := 0
	for i := range ids {
		if ids[i] != ids[0] {
			t.Errorf("run %d got cluster ID %q, run 0 %q", i, ids[i], ids[0])
		}
		if created[i] {
			n++
		}
	}
	if n != 1 {
		t.Errorf("%d runs say they created the bundle, want 1", n)
	}
}

func TestDamagedSecretsAreNotReplaced(t *testing.T) {
	path := filepath.Join(t.TempDir(), SecretsFile)
	if err := os.WriteFile(path, []byte("cluster: {id: x}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, _, err := LoadOrCreateSecrets(path, nil)
	if err == nil || !strings.Contains(err.Error(), "restore it from backup") {
		t.Errorf("damaged bundle: %v", err)
	}
	if data, _ := os.ReadFile(path); string(data) != "cluster: {id: x}\n" {
		t.Error("the damaged bundle was overwritten")
	}
}

// A patch that makes the config invalid fails generation and writes no
// config at all.
func TestInvalidPatchWritesNothing(t *testing.T) {
	bad, err := rack.Parse([]byte(strings.Replace(mustRead(t, "testdata/racks/single.yaml"), "machines:", `patches:
  - patch:
      - op: remove
        path: /machine/install/disk
machines:`, 1)), "bad.yaml", "testdata/racks")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if _, err := Write(bad, dir); err == nil || !strings.Contains(err.Error(), "node1") {
		t.Fatalf("Write = %v, want an error naming node1", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "node1.yaml")); !os.IsNotExist(err) {
		t.Error("a config was written for an invalid rack")
	}
}

func mustRead(t *testing.T, path string) string {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(data)
}
