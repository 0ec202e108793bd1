package talosconfig

import (
	"bytes"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	clientconfig "github.com/siderolabs/talos/pkg/machinery/client/config"
	"github.com/siderolabs/talos/pkg/machinery/config/configloader"
	"github.com/siderolabs/talos/pkg/machinery/config/encoder"
	"github.com/siderolabs/talos/pkg/machinery/config/generate/secrets"
	"github.com/siderolabs/talos/pkg/machinery/constants"

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
	for _, name := range []string{"single", "ha", "workers", "mirror"} {
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

// registries.mirror makes every registry a node pulls from, including
// hosts only a patch names, a mirror at MIRROR/v2/HOST with overridePath,
// and the machinery (strict) accepts an endpoint with a path.
func TestRegistryMirror(t *testing.T) {
	base := mustRead(t, "testdata/racks/mirror.yaml")
	etcdPatch := "patches:\n  - target: controlplane\n    patch:\n      cluster:\n        etcd:\n          image: registry.example.com/etcd:v3.6.10\nmachines:"
	tests := []struct {
		name      string
		rack      string
		wantHosts []string
		wantErr   string
	}{
		{
			name:      "default hosts and the installer's",
			rack:      base,
			wantHosts: []string{"docker.io", "factory.talos.dev", "ghcr.io", "quay.io", "registry.k8s.io"},
		},
		{
			name:      "a host only a patch names",
			rack:      strings.Replace(base, "machines:", etcdPatch, 1),
			wantHosts: []string{"docker.io", "factory.talos.dev", "ghcr.io", "quay.io", "registry.example.com", "registry.k8s.io"},
		},
		{
			name:    "that host in mirrors too",
			rack:    strings.Replace(strings.Replace(base, "machines:", etcdPatch, 1), "  mirror: http://192.168.60.1:5000\n", "  mirror: http://192.168.60.1:5000\n  mirrors:\n    registry.example.com: [https://other.example]\n", 1),
			wantErr: "registries.mirror covers registry.example.com (the etcd image registry.example.com/etcd:v3.6.10) and registries.mirrors names it too",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, err := rack.Parse([]byte(tt.rack), "mirror.yaml", "testdata/racks")
			if err != nil {
				t.Fatal(err)
			}
			g := &Generator{Rack: r, Secrets: testSecrets(t)}
			cfg, err := g.Config(&r.Machines[0])
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("Config = %v, want an error with %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			mirrors := cfg.RegistryMirrorConfigs()
			var hosts []string
			for h, m := range mirrors {
				hosts = append(hosts, h)
				eps := m.Endpoints()
				if len(eps) != 1 || eps[0].Endpoint() != "http://192.168.60.1:5000/v2/"+h || !eps[0].OverridePath() {
					t.Errorf("mirror of %s: %+v, want http://192.168.60.1:5000/v2/%s with overridePath", h, eps, h)
				}
			}
			slices.Sort(hosts)
			if !slices.Equal(hosts, tt.wantHosts) {
				t.Errorf("mirrored hosts %v, want %v", hosts, tt.wantHosts)
			}
			for _, img := range Images(cfg) {
				host, _, _ := strings.Cut(img.Ref, "/")
				if _, ok := mirrors[host]; !ok {
					t.Errorf("the %s image %s comes from %s, which has no mirror", img.Component, img.Ref, host)
				}
			}
		})
	}
}

// Images reads what Talos starts from the config: control-plane
// components only on control planes, CoreDNS and kube-proxy only when
// enabled, Flannel only as the CNI.
func TestImages(t *testing.T) {
	r, err := rack.Load("testdata/racks/workers.yaml")
	if err != nil {
		t.Fatal(err)
	}
	g := &Generator{Rack: r, Secrets: testSecrets(t)}
	components := func(m *rack.Machine, patches ...string) []string {
		t.Helper()
		mm := *m
		for _, p := range patches {
			mm.Patches = append(slices.Clone(mm.Patches), mustPatch(t, p))
		}
		cfg, err := g.Config(&mm)
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, img := range Images(cfg) {
			out = append(out, img.Component+"="+img.Ref)
		}
		return out
	}
	k8s := r.Cluster.KubernetesVersion
	installer, _ := r.InstallImage()
	common := []string{
		"kubelet=ghcr.io/siderolabs/kubelet:v" + k8s,
		"pause (pod sandbox)=registry.k8s.io/pause:3.10.1",
		"installer=" + installer,
	}
	cp := append(slices.Clone(common),
		"etcd=registry.k8s.io/etcd:"+constants.DefaultEtcdVersion,
		"kube-apiserver=registry.k8s.io/kube-apiserver:v"+k8s,
		"kube-controller-manager=registry.k8s.io/kube-controller-manager:v"+k8s,
		"kube-scheduler=registry.k8s.io/kube-scheduler:v"+k8s,
		"coredns=registry.k8s.io/coredns/coredns:"+constants.DefaultCoreDNSVersion,
	)
	flannel := "flannel=ghcr.io/siderolabs/flannel:" + constants.FlannelVersion
	tests := []struct {
		name    string
		machine int
		patches []string
		want    []string
	}{
		{"worker", 1, nil, common},
		{"control plane: no CNI, no kube-proxy (cozy-patch.yaml)", 0, nil, cp},
		{"flannel and kube-proxy enabled", 0, []string{"cluster:\n  network:\n    cni:\n      name: flannel\n  proxy:\n    disabled: false\n"},
			append(slices.Clone(cp), "kube-proxy=registry.k8s.io/kube-proxy:v"+k8s, flannel)},
		{"coredns disabled", 0, []string{"cluster:\n  coreDNS:\n    disabled: true\n"}, cp[:len(cp)-1]},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := components(&r.Machines[tt.machine], tt.patches...); !slices.Equal(got, tt.want) {
				t.Errorf("images\n  %v\nwant\n  %v", got, tt.want)
			}
		})
	}
}

func mustPatch(t *testing.T, text string) rack.Patch {
	t.Helper()
	r, err := rack.Parse([]byte(strings.Replace(mustRead(t, "testdata/racks/single.yaml"), "machines:", "patches:\n  - patch:\n"+indent(text, "      ")+"machines:", 1)), "p.yaml", "testdata/racks")
	if err != nil {
		t.Fatal(err)
	}
	return r.Patches[0]
}

func indent(s, prefix string) string {
	var b strings.Builder
	for _, l := range strings.SplitAfter(s, "\n") {
		if l != "" {
			b.WriteString(prefix + l)
		}
	}
	return b.String()
}
