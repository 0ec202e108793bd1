package rack

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestExampleIsValid(t *testing.T) {
	data, err := Example("lab")
	if err != nil {
		t.Fatal(err)
	}
	r, err := Parse(data, "example", t.TempDir())
	if err != nil {
		t.Fatalf("the example rack does not validate:\n%v", err)
	}
	if r.Metadata.Name != "lab" || len(r.ControlPlanes()) != 3 || len(r.Workers()) != 1 {
		t.Errorf("example: name %q, %d control planes, %d workers; want lab, 3, 1", r.Metadata.Name, len(r.ControlPlanes()), len(r.Workers()))
	}
	if _, err := Example("Not A Label"); err == nil {
		t.Error("Example accepted a name that is not a DNS label")
	}
}

func TestDefaults(t *testing.T) {
	r, err := Load("testdata/valid-minimal.yaml")
	if err != nil {
		t.Fatal(err)
	}
	checks := []struct{ field, got, want string }{
		{"talos.version", r.Talos.Version, DefaultTalosVersion},
		{"cluster.kubernetesVersion", r.Cluster.KubernetesVersion, DefaultKubernetesVersion},
		{"cluster.endpoint", r.Cluster.Endpoint, "https://192.168.100.11:6443"},
		{"cluster.dnsDomain", r.Cluster.DNSDomain, "cozy.local"},
		{"cluster.podSubnets", strings.Join(r.Cluster.PodSubnets, ","), "10.244.0.0/16"},
		{"network.dhcp.mode", r.Network.DHCP.Mode, "proxy"},
		{"network.dhcp.leaseTime", r.Network.DHCP.LeaseTime, "1h"},
		{"talos.schematic.extensions", strings.Join(r.Talos.Schematic.Extensions, ","), "siderolabs/drbd,siderolabs/zfs"},
		{"machines[0].interfaces[0].name", r.Machines[0].Interfaces[0].Name, "net0"},
		{"platform.git.path", r.Platform.Git.Path, "clusters/mini"},
	}
	for _, c := range checks {
		if c.got != c.want {
			t.Errorf("%s = %q, want %q", c.field, c.got, c.want)
		}
	}
	if !*r.Cluster.AllowSchedulingOnControlPlanes {
		t.Error("allowSchedulingOnControlPlanes defaults to false, want true")
	}
}

// Every file under testdata/invalid ends with "# want: <text>"; loading it
// must fail with a problem whose line contains that text.
func TestInvalidRacks(t *testing.T) {
	files, _ := filepath.Glob("testdata/invalid/*.yaml")
	if len(files) < 20 {
		t.Fatalf("only %d broken rack files; want at least 20", len(files))
	}
	for _, f := range files {
		t.Run(strings.TrimSuffix(filepath.Base(f), ".yaml"), func(t *testing.T) {
			data, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			_, want, ok := strings.Cut(string(data), "# want: ")
			if !ok {
				t.Fatal("no '# want:' line")
			}
			want = strings.TrimSpace(want)
			_, err = Load(f)
			var ps *Problems
			if !errors.As(err, &ps) {
				t.Fatalf("Load = %v, want *Problems", err)
			}
			if !strings.Contains(err.Error(), want) {
				t.Errorf("error does not contain %q:\n%v", want, err)
			}
			if !strings.HasPrefix(err.Error(), filepath.Base(f)+": ") {
				t.Errorf("error does not start with the file name: %v", err)
			}
		})
	}
}

// A rack with many mistakes reports all of them, not only the first.
func TestAllProblemsReported(t *testing.T) {
	_, err := Parse([]byte(`apiVersion: v1
kind: Rack
metadata: {name: x}
network: {interface: eth0, subnet: bad}
machines:
  - hostname: A
    role: boss
    install: {}
`), "many.yaml", ".")
	var ps *Problems
	if !errors.As(err, &ps) {
		t.Fatalf("Parse = %v", err)
	}
	wantPaths := []string{"apiVersion", "network.subnet", "machines[0].hostname", "machines[0].role", "machines[0]", "machines[0].install"}
	for _, w := range wantPaths {
		found := false
		for _, p := range ps.List {
			found = found || p.Path == w
		}
		if !found {
			t.Errorf("no problem reported for %s; got:\n%v", w, err)
		}
	}
}

func TestPatchFileRelativeToRack(t *testing.T) {
	dir := t.TempDir()
	base, _ := os.ReadFile("testdata/valid-minimal.yaml")
	rackYAML := strings.Replace(string(base), "kind: Rack\n", "kind: Rack\npatches:\n  - file: extra.yaml\n    target: controlplane\n", 1)
	if err := os.WriteFile(filepath.Join(dir, "rack.yaml"), []byte(rackYAML), 0o644); err != nil {
		t.Fatal(err)
	}
	patch := "- op: add\n  path: /machine/nodeLabels\n  value: {rack: a}\n"
	if err := os.WriteFile(filepath.Join(dir, "extra.yaml"), []byte(patch), 0o644); err != nil {
		t.Fatal(err)
	}
	r, err := Load(filepath.Join(dir, "rack.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if got := string(r.Patches[0].Content()); got != patch {
		t.Errorf("patch content = %q, want the file's %q", got, patch)
	}
}

func TestSchematicID(t *testing.T) {
	tests := []struct {
		name string
		s    Schematic
		want string
	}{
		// The factory's well-known ID of the schematic without customisation.
		{"default", Schematic{}, "376567988ad370138ad8b2698212367b8edcb69b5fd68c80be1f2ec7d603b4ba"},
		{"given", Schematic{ID: strings.Repeat("ab", 32)}, strings.Repeat("ab", 32)},
	}
	for _, tt := range tests {
		got, err := tt.s.SchematicID()
		if err != nil || got != tt.want {
			t.Errorf("%s: SchematicID() = %q, %v; want %q", tt.name, got, err, tt.want)
		}
	}
	a, _ := Schematic{Extensions: []string{"siderolabs/drbd"}}.SchematicID()
	b, _ := Schematic{Extensions: []string{"siderolabs/zfs"}}.SchematicID()
	if a == b {
		t.Error("different extensions give the same schematic ID")
	}
	doc, _ := Schematic{Extensions: []string{"siderolabs/drbd"}}.SchematicDocument()
	if want := "customization:\n    systemExtensions:\n        officialExtensions:\n            - siderolabs/drbd\n"; string(doc) != want {
		t.Errorf("schematic document = %q, want %q", doc, want)
	}
}

func TestInstallImage(t *testing.T) {
	r, err := Load("testdata/valid-minimal.yaml")
	if err != nil {
		t.Fatal(err)
	}
	id, _ := r.Talos.Schematic.SchematicID()
	img, err := r.InstallImage()
	if want := "factory.talos.dev/metal-installer/" + id + ":" + DefaultTalosVersion; err != nil || img != want {
		t.Errorf("InstallImage() = %q, %v; want %q", img, err, want)
	}
	r.Talos.InstallImage = "registry.local/installer:v1"
	if img, _ := r.InstallImage(); img != "registry.local/installer:v1" {
		t.Errorf("InstallImage() ignores the override: %q", img)
	}
}

func FuzzParse(f *testing.F) {
	seeds, _ := filepath.Glob("testdata/*/*.yaml")
	seeds = append(seeds, "testdata/valid-minimal.yaml")
	for _, s := range seeds {
		data, _ := os.ReadFile(s)
		f.Add(data)
	}
	ex, _ := Example("lab")
	f.Add(ex)
	dir := f.TempDir()
	f.Fuzz(func(t *testing.T, data []byte) {
		r, err := Parse(data, "fuzz.yaml", dir)
		if err == nil && r == nil {
			t.Fatal("Parse returned neither a rack nor an error")
		}
		if err != nil {
			var ps *Problems
			if !errors.As(err, &ps) || len(ps.List) == 0 {
				t.Fatalf("Parse error is not a non-empty *Problems: %v", err)
			}
		}
	})
}
