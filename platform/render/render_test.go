package render_test

import (
	"bytes"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/yaml"

	"cozy.dev/cozy/bootstrap/rack"
	"cozy.dev/cozy/lab"
	"cozy.dev/cozy/operators/tenantcluster"
	"cozy.dev/cozy/platform/render"
	"cozy.dev/cozy/platform/upstream"
)

var update = flag.Bool("update", false, "rewrite the golden files and clusters/lab")

// platformLine is the example rack's platform line, which tests replace
// with it and the settings they add.
const platformLine = "platform:                       # what the platform layer (Flux) reads\n"

// repoRoot is where clusters/ and charts/ live, seen from this package.
const repoRoot = "../.."

// labRack is the rack `cozyctl lab up` writes for a lab named "lab" with
// the default shape: the rack clusters/lab is rendered from.
func labRack(t testing.TB) *rack.Rack {
	t.Helper()
	c := lab.Config{Name: "lab", Dir: "/var/lib/cozy/labs/lab"}
	c, err := c.WithDefaults()
	if err != nil {
		t.Fatal(err)
	}
	r, err := rack.Parse(c.Rack(), "lab-rack.yaml", t.TempDir())
	if err != nil {
		t.Fatalf("lab rack: %v", err)
	}
	return r
}

// exampleRack is `cozyctl rack init --name NAME` with edits applied.
func exampleRack(t testing.TB, name string, edits ...string) *rack.Rack {
	t.Helper()
	data, err := rack.Example(name)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(edits); i += 2 {
		if !bytes.Contains(data, []byte(edits[i])) {
			t.Fatalf("example rack has no %q to edit", edits[i])
		}
		data = bytes.Replace(data, []byte(edits[i]), []byte(edits[i+1]), 1)
	}
	r, err := rack.Parse(data, name+".yaml", t.TempDir())
	if err != nil {
		t.Fatalf("example rack: %v", err)
	}
	return r
}

func mustRender(t testing.TB, r *rack.Rack) *render.Layout {
	t.Helper()
	l, err := render.Render(r)
	if err != nil {
		t.Fatalf("render: %v", err)
	}
	return l
}

// TestLabLayoutIsCommitted keeps clusters/lab (and the charts it installs
// from the repository) identical to what the lab rack renders.
func TestLabLayoutIsCommitted(t *testing.T) {
	l := mustRender(t, labRack(t))
	if l.ClusterDir != "clusters/lab" {
		t.Fatalf("cluster folder = %q, want clusters/lab", l.ClusterDir)
	}
	if *update {
		if err := l.Write(repoRoot); err != nil {
			t.Fatal(err)
		}
	}
	diff, err := l.Diff(repoRoot)
	if err != nil {
		t.Fatal(err)
	}
	if len(diff) > 0 {
		t.Errorf("clusters/lab is not what the lab rack renders; run go test ./platform/render -update and review:\n  %s", strings.Join(diff, "\n  "))
	}
}

// golden compares got with testdata/golden/name, or rewrites it.
func golden(t *testing.T, name string, got []byte) {
	t.Helper()
	file := filepath.Join("testdata", "golden", name)
	if *update {
		if err := os.WriteFile(file, got, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(file)
	if err != nil {
		t.Fatalf("%v (run go test ./platform/render -update)", err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("%s differs from the rendering; run go test ./platform/render -update and review the diff", file)
	}
}

// concat joins a layout's cluster files, each under a "# file:" line.
func concat(l *render.Layout) []byte {
	var b bytes.Buffer
	for _, p := range l.Paths() {
		if !strings.HasPrefix(p, l.ClusterDir+"/") {
			continue
		}
		b.WriteString("# file: " + p + "\n")
		b.Write(l.Files[p])
	}
	return b.Bytes()
}

func TestGolden(t *testing.T) {
	for _, tc := range []struct {
		name   string
		layout func(t *testing.T) *render.Layout
	}{
		{"defaults.yaml", func(t *testing.T) *render.Layout {
			// The chart's own defaults; only what has none is given.
			l, err := render.RenderValues(map[string]any{
				"cluster": map[string]any{"name": "defaults"},
				"git":     map[string]any{"path": "clusters/defaults"},
			}, "")
			if err != nil {
				t.Fatal(err)
			}
			return l
		}},
		{"example-lvm-thin.yaml", func(t *testing.T) *render.Layout { return mustRender(t, exampleRack(t, "prod")) }},
		{"example-zfs.yaml", func(t *testing.T) *render.Layout {
			return mustRender(t, exampleRack(t, "zfs", "backend: lvm-thin", "backend: zfs"))
		}},
	} {
		t.Run(tc.name, func(t *testing.T) { golden(t, tc.name, concat(tc.layout(t))) })
	}

	t.Run("cozy-operator.yaml", func(t *testing.T) {
		files, err := render.Operator(nil)
		if err != nil {
			t.Fatal(err)
		}
		var b bytes.Buffer
		for _, name := range sortedKeys(files) {
			b.WriteString("# file: " + name + "\n" + strings.TrimLeft(files[name], "\n"))
		}
		golden(t, "cozy-operator.yaml", b.Bytes())
	})
}

func TestRenderIsDeterministic(t *testing.T) {
	r := exampleRack(t, "prod")
	a, b := mustRender(t, r), mustRender(t, r)
	if !bytes.Equal(concat(a), concat(b)) {
		t.Fatal("two renderings of one rack differ")
	}
}

// TestRackDrivesValues checks that what the rack says reaches the objects.
func TestRackDrivesValues(t *testing.T) {
	l := mustRender(t, exampleRack(t, "prod",
		"# podSubnets: [10.244.0.0/16]", "podSubnets: [10.200.0.0/16]",
		"backend: lvm-thin", "backend: zfs"))
	for file, wants := range map[string][]string{
		"clusters/prod/components/networking/kube-ovn.yaml":         {`POD_CIDR: "10.200.0.0/16"`, `POD_GATEWAY: "10.200.0.1"`, `MASTER_NODES: "192.168.100.11,192.168.100.12,192.168.100.13"`},
		"clusters/prod/components/metallb-pool/pool.yaml":           {"- 192.168.100.200-192.168.100.250"},
		"clusters/prod/components/linstor/linstor-cluster.yaml":     {"zfsThinPool:", "zPool: data", "- /dev/sdb"},
		"clusters/prod/components/kamaji/kamaji.yaml":               {`clusterDomain: "cozy.local"`},
		"clusters/prod/platform.yaml":                               {"path: ./clusters/prod/components/networking"},
		"clusters/prod/components/cozy-operator/cozy-operator.yaml": {"chart: ./charts/cozy-operator"},
	} {
		got := string(l.Files[file])
		for _, w := range wants {
			if !strings.Contains(got, w) {
				t.Errorf("%s lacks %q", file, w)
			}
		}
	}
}

func sortedKeys(m map[string]string) []string {
	l := &render.Layout{Files: map[string][]byte{}}
	for k := range m {
		l.Files[k] = nil
	}
	return l.Paths()
}

// With platform.mirror, every HelmRepository whose charts Cozy makes
// (platform/upstream) reads the mirror, as an OCI repository (insecure
// for http://); the others keep their upstream URL. Without it, none does.
func TestChartMirror(t *testing.T) {
	mirrored := func(t *testing.T, r *rack.Rack) map[string]map[string]any {
		t.Helper()
		objs, err := mustRender(t, r).Objects()
		if err != nil {
			t.Fatal(err)
		}
		repos := map[string]map[string]any{}
		for _, o := range objs {
			if o.GetKind() == "HelmRepository" {
				spec, _, _ := unstructured.NestedMap(o.Object, "spec")
				repos[o.GetNamespace()+"/"+o.GetName()] = spec
			}
		}
		// Each repository's charts, from the HelmReleases that read it:
		// the platform's, and those cozy-operator creates for tenants.
		for _, c := range tenantcluster.DefaultAddonConfig().Charts {
			if spec, ok := repos[c.Source.Namespace+"/"+c.Source.Name]; ok && c.Source.Kind == "HelmRepository" {
				_, err := upstream.Find(c.Chart, c.Version)
				spec["cozyMakes"] = err == nil
			}
		}
		for _, o := range objs {
			if o.GetKind() != "HelmRelease" {
				continue
			}
			chart, _, _ := unstructured.NestedString(o.Object, "spec", "chart", "spec", "chart")
			version, _, _ := unstructured.NestedString(o.Object, "spec", "chart", "spec", "version")
			kind, _, _ := unstructured.NestedString(o.Object, "spec", "chart", "spec", "sourceRef", "kind")
			name, _, _ := unstructured.NestedString(o.Object, "spec", "chart", "spec", "sourceRef", "name")
			if kind != "HelmRepository" {
				continue
			}
			spec := repos[o.GetNamespace()+"/"+name]
			_, err := upstream.Find(chart, version)
			spec["cozyMakes"] = err == nil
		}
		return repos
	}
	plain := mirrored(t, exampleRack(t, "prod"))
	for name, spec := range plain {
		if spec["type"] == "oci" {
			t.Errorf("without a mirror, %s is an OCI repository: %v", name, spec)
		}
	}
	r := exampleRack(t, "prod", "  # mirror: http://10.0.0.1:5000/charts", "  mirror: http://10.0.0.1:5000/charts")
	n := 0
	for name, spec := range mirrored(t, r) {
		switch {
		case spec["cozyMakes"] == true:
			n++
			if spec["type"] != "oci" || spec["url"] != "oci://10.0.0.1:5000/charts" || spec["insecure"] != true {
				t.Errorf("%s (a chart Cozy makes) does not read the mirror: %v", name, spec)
			}
		case spec["url"] != plain[name]["url"] || spec["type"] != nil:
			t.Errorf("%s (a chart Cozy cannot make) reads %v, want its own %v", name, spec, plain[name]["url"])
		}
	}
	if n < 5 {
		t.Errorf("only %d repositories read the mirror", n)
	}
}

// The rack's registries.mirror is where tenants' worker disks come from:
// cozy-operator's values name MIRROR/cozy.dev/tenant-worker, and for an
// http:// mirror CDI reads that host over plain HTTP; the workers pull
// their pods' images through it. Without a mirror, the operator has no
// repository and no mirror, and CDI no insecure registry.
func TestWorkerImageFromMirror(t *testing.T) {
	for _, tt := range []struct {
		name, mirror string
		repository   string
		insecure     bool
	}{
		{name: "no mirror"},
		{name: "http mirror", mirror: "http://10.0.0.1:5000/", repository: "10.0.0.1:5000/cozy.dev/tenant-worker", insecure: true},
		{name: "https mirror", mirror: "https://registry.example.com", repository: "registry.example.com/cozy.dev/tenant-worker"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var edits []string
			if tt.mirror != "" {
				edits = []string{"# registries:\n#   mirror: http://192.168.100.1:5000", "registries:\n  mirror: " + tt.mirror}
			}
			objs, err := mustRender(t, exampleRack(t, "prod", edits...)).Objects()
			if err != nil {
				t.Fatal(err)
			}
			var repo, mirror, insecureRegs any
			var insecure bool
			for _, o := range objs {
				switch {
				case o.GetKind() == "HelmRelease" && o.GetName() == "cozy-operator":
					repo, _, _ = unstructured.NestedFieldNoCopy(o.Object, "spec", "values", "workerImage", "repository")
					insecure, _, _ = unstructured.NestedBool(o.Object, "spec", "values", "workerImage", "insecure")
					mirror, _, _ = unstructured.NestedFieldNoCopy(o.Object, "spec", "values", "workerImage", "mirror")
				case o.GetKind() == "CDI":
					insecureRegs, _, _ = unstructured.NestedFieldNoCopy(o.Object, "spec", "config", "insecureRegistries")
				}
			}
			if repo != tt.repository || insecure != tt.insecure {
				t.Errorf("cozy-operator workerImage %v (insecure %v), want %q (%v)", repo, insecure, tt.repository, tt.insecure)
			}
			if want := strings.TrimSuffix(tt.mirror, "/"); (want == "" && mirror != nil) || (want != "" && mirror != want) {
				t.Errorf("cozy-operator workerImage.mirror %v, want %q", mirror, want)
			}
			var wantRegs any
			if tt.insecure {
				wantRegs = []any{"10.0.0.1:5000"}
			}
			if !reflect.DeepEqual(insecureRegs, wantRegs) {
				t.Errorf("CDI insecureRegistries %v, want %v", insecureRegs, wantRegs)
			}
		})
	}
}

// The rack's registries.mirrors reach cozy-operator too, host by host,
// endpoints in order, with or without registries.mirror; the worker
// image repository stays unset without the single mirror.
func TestWorkerMirrorsFromRack(t *testing.T) {
	r := exampleRack(t, "prod", "# registries:\n#   mirror: http://192.168.100.1:5000",
		"registries:\n  mirrors:\n    harbor.example.com:\n      - https://harbor.example.com/proxy\n      - http://10.0.0.2:5000\n    \"*\":\n      - http://10.0.0.3:5000")
	objs, err := mustRender(t, r).Objects()
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range objs {
		if o.GetKind() != "HelmRelease" || o.GetName() != "cozy-operator" {
			continue
		}
		wi, _, _ := unstructured.NestedMap(o.Object, "spec", "values", "workerImage")
		want := map[string]any{
			"repository": "", "insecure": false,
			"mirrors": map[string]any{"harbor.example.com": []any{"https://harbor.example.com/proxy", "http://10.0.0.2:5000"}, "*": []any{"http://10.0.0.3:5000"}},
		}
		if !reflect.DeepEqual(wi, want) {
			t.Errorf("cozy-operator workerImage %v, want %v", wi, want)
		}
		return
	}
	t.Fatal("no cozy-operator HelmRelease")
}

// cozy-operator hears whether LoadBalancer Services get addresses: only
// with a load-balancer pool and MetalLB's pool component on.
func TestOperatorLoadBalancer(t *testing.T) {
	const pool = "  loadBalancerPool: [192.168.100.200-192.168.100.250]\n"
	for _, tt := range []struct {
		name  string
		edits []string
		want  bool
	}{
		{"pool", nil, true},
		{"no pool", []string{pool, ""}, false},
		{"pool component off", []string{platformLine, platformLine + "  components:\n    metallb-pool: {enabled: false}\n"}, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			objs, err := mustRender(t, exampleRack(t, "prod", tt.edits...)).Objects()
			if err != nil {
				t.Fatal(err)
			}
			var got any
			for _, o := range objs {
				if o.GetKind() == "HelmRelease" && o.GetName() == "cozy-operator" {
					got, _, _ = unstructured.NestedFieldNoCopy(o.Object, "spec", "values", "loadBalancer")
				}
			}
			if got != tt.want {
				t.Errorf("cozy-operator loadBalancer %v, want %v", got, tt.want)
			}
		})
	}
}

// gpuValues permit two GPUs to tenants' VMs.
const gpuValues = `  values:
    kubevirt:
      permittedHostDevices:
        pciHostDevices:
          - {pciVendorSelector: "10de:2236", resourceName: nvidia.com/GA102GL_A10}
        mediatedDevices:
          - {mdevNameSelector: GRID T4-1Q, resourceName: nvidia.com/GRID_T4-1Q}
`

// The platform's kubevirt.permittedHostDevices reach KubeVirt (with the
// HostDevices gate) and cozy-operator (as the GPUs it lets node groups
// ask for); without them, neither gets any.
func TestPermittedHostDevices(t *testing.T) {
	read := func(t *testing.T, r *rack.Rack) (kv map[string]any, gpus any) {
		t.Helper()
		objs, err := mustRender(t, r).Objects()
		if err != nil {
			t.Fatal(err)
		}
		for _, o := range objs {
			switch {
			case o.GetKind() == "KubeVirt":
				kv, _, _ = unstructured.NestedMap(o.Object, "spec", "configuration")
			case o.GetKind() == "HelmRelease" && o.GetName() == "cozy-operator":
				gpus, _, _ = unstructured.NestedFieldNoCopy(o.Object, "spec", "values", "permittedGPUs")
			}
		}
		return kv, gpus
	}
	kv, gpus := read(t, exampleRack(t, "prod"))
	if kv["permittedHostDevices"] != nil || gpus != nil || slices.Contains(kvGates(kv), "HostDevices") {
		t.Errorf("without values: KubeVirt %v, operator GPUs %v", kv, gpus)
	}
	kv, gpus = read(t, exampleRack(t, "prod", platformLine, platformLine+gpuValues))
	if want := []any{"nvidia.com/GA102GL_A10", "nvidia.com/GRID_T4-1Q"}; !reflect.DeepEqual(gpus, want) {
		t.Errorf("operator GPUs %v, want %v", gpus, want)
	}
	pci, _, _ := unstructured.NestedSlice(kv, "permittedHostDevices", "pciHostDevices")
	if len(pci) != 1 || !slices.Contains(kvGates(kv), "HostDevices") || !slices.Contains(kvGates(kv), "Snapshot") {
		t.Errorf("KubeVirt configuration %v: want the PCI device and the HostDevices gate beside the others", kv)
	}
}

func kvGates(configuration map[string]any) []string {
	gates, _, _ := unstructured.NestedStringSlice(configuration, "developerConfiguration", "featureGates")
	return gates
}

// Components switch off one by one: an off component has no
// Kustomization and no folder, and the components ConfigMap says off; a
// component cannot be off while one that depends on it is on; names and
// values are schema-checked.
func TestComponentSwitch(t *testing.T) {
	off := func(names ...string) string {
		s := "platform:                       # what the platform layer (Flux) reads\n  components:\n"
		for _, n := range names {
			s += "    " + n + ": {enabled: false}\n"
		}
		return s
	}

	diskless := []string{"linstor", "cdi", "kamaji", "cluster-api-providers", "cozy-operator"}
	l := mustRender(t, exampleRack(t, "prod", platformLine, off(diskless...)))
	objs, err := l.Objects()
	if err != nil {
		t.Fatal(err)
	}
	var kustomizations []string
	for _, o := range objs {
		switch {
		case o.GetKind() == "Kustomization":
			kustomizations = append(kustomizations, o.GetName())
		case o.GetKind() == "ConfigMap" && o.GetName() == render.ComponentsConfigMap:
			data, _, _ := unstructured.NestedStringMap(o.Object, "data")
			for _, n := range diskless {
				if data[n] != "off" {
					t.Errorf("%s says %s is %q", render.ComponentsConfigMap, n, data[n])
				}
			}
			if data["networking"] != "on" || len(data) != 13 {
				t.Errorf("%s: %v", render.ComponentsConfigMap, data)
			}
		}
	}
	for _, n := range diskless {
		if slices.Contains(kustomizations, n) {
			t.Errorf("%s is off but has a Kustomization", n)
		}
		for _, p := range l.Paths() {
			if strings.Contains(p, "/components/"+n+"/") {
				t.Errorf("%s is off but %s is rendered", n, p)
			}
		}
	}
	if !slices.Contains(kustomizations, "kubevirt") || len(kustomizations) != 8 {
		t.Errorf("Kustomizations %v, want the 8 left on", kustomizations)
	}
	// Snapshots stay, without a VolumeSnapshotClass for LINSTOR's driver.
	for _, o := range objs {
		if o.GetKind() == "VolumeSnapshotClass" {
			t.Errorf("%s: VolumeSnapshotClass %s rendered with linstor off", o.File, o.GetName())
		}
	}

	for _, tt := range []struct {
		name, edit, want string
	}{
		{"a dependency off", off("linstor"), "components.linstor is switched off, but cdi, kamaji depend on it: switch cdi, kamaji off too, or keep linstor"},
		{"an unknown component", off("linstr"), "/components"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			r := exampleRack(t, "prod", platformLine, tt.edit)
			_, err := render.Render(r)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("got %v, want an error with %q", err, tt.want)
			}
		})
	}
}

// Networking (Kube-OVN and Cilium) can be off only where the cluster has a
// network of its own, Talos's flannel: then the components that wait for
// networking wait for nothing, and stay on.
func TestNetworkingSwitch(t *testing.T) {
	off := platformLine + "  components:\n    networking: {enabled: false}\n"

	r := exampleRack(t, "prod", platformLine, off)
	if _, err := render.Render(r); err == nil || !strings.Contains(err.Error(), "components.networking is switched off, but cdi, cert-manager") ||
		!strings.Contains(err.Error(), "cluster.cni: flannel") {
		t.Errorf("networking off on a cluster without a network: %v, want a refusal naming cluster.cni: flannel", err)
	}

	r.Cluster.CNI = rack.CNIFlannel
	l := mustRender(t, r)
	objs, err := l.Objects()
	if err != nil {
		t.Fatal(err)
	}
	var on []string
	for _, o := range objs {
		if o.GetKind() != "Kustomization" || o.GetAPIVersion() != "kustomize.toolkit.fluxcd.io/v1" {
			continue
		}
		on = append(on, o.GetName())
		deps, _, _ := unstructured.NestedSlice(o.Object, "spec", "dependsOn")
		for _, d := range deps {
			if d.(map[string]any)["name"] == "networking" {
				t.Errorf("%s still depends on networking, which is off", o.GetName())
			}
		}
	}
	if slices.Contains(on, "networking") || !slices.Contains(on, "cert-manager") || len(on) != 12 {
		t.Errorf("Kustomizations %v, want every component but networking", on)
	}
	// On, networking stays a dependency on a flannel cluster: the
	// platform's network replaces flannel before the rest installs.
	r.Platform.Components = nil
	objs, err = mustRender(t, r).Objects()
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range objs {
		if o.GetKind() == "Kustomization" && o.GetName() == "cert-manager" {
			if deps, _, _ := unstructured.NestedSlice(o.Object, "spec", "dependsOn"); len(deps) != 1 {
				t.Errorf("cert-manager depends on %v, want networking", deps)
			}
		}
	}
}

// flux.timeout replaces every component's own wait, Kustomizations' and
// HelmReleases' alike (a lab under TCG needs longer); unset, each keeps
// its own.
func TestFluxTimeout(t *testing.T) {
	timeouts := func(r *rack.Rack) map[string]string {
		objs, err := mustRender(t, r).Objects()
		if err != nil {
			t.Fatal(err)
		}
		got := map[string]string{}
		for _, o := range objs {
			if o.GetKind() == "Kustomization" || o.GetKind() == "HelmRelease" {
				got[o.GetKind()+"/"+o.GetName()], _, _ = unstructured.NestedString(o.Object, "spec", "timeout")
			}
		}
		return got
	}
	own := timeouts(exampleRack(t, "prod"))
	if own["HelmRelease/metallb"] != "10m" || own["Kustomization/linstor"] != "20m" {
		t.Errorf("without flux.timeout: metallb %q, linstor %q; want their own 10m and 20m", own["HelmRelease/metallb"], own["Kustomization/linstor"])
	}
	long := timeouts(exampleRack(t, "prod", platformLine, platformLine+"  values:\n    flux: {timeout: 45m}\n"))
	if len(long) != len(own) || len(long) < 20 {
		t.Fatalf("%d objects with a timeout, want the %d of the default", len(long), len(own))
	}
	for id, got := range long {
		if got != "45m" {
			t.Errorf("%s: timeout %q, want flux.timeout's 45m", id, got)
		}
	}
}

// flux.progressDeadlineSeconds reaches every Deployment of every
// HelmRelease through a post-renderer (Helm's wait fails at once on a
// Deployment past its deadline, whatever the timeout); unset, no
// HelmRelease has one. The patch is run as Flux runs it, through
// kustomize, on a Deployment without the field and on one with it.
func TestFluxProgressDeadline(t *testing.T) {
	releases := func(r *rack.Rack) []*unstructured.Unstructured {
		objs, err := mustRender(t, r).Objects()
		if err != nil {
			t.Fatal(err)
		}
		var hrs []*unstructured.Unstructured
		for _, o := range objs {
			if o.GetKind() == "HelmRelease" {
				hrs = append(hrs, o.Unstructured)
			}
		}
		return hrs
	}
	for _, hr := range releases(exampleRack(t, "prod")) {
		if _, found, _ := unstructured.NestedFieldNoCopy(hr.Object, "spec", "postRenderers"); found {
			t.Errorf("HelmRelease %s has post-renderers without flux.progressDeadlineSeconds", hr.GetName())
		}
	}
	slow := releases(exampleRack(t, "prod", platformLine, platformLine+"  values:\n    flux: {progressDeadlineSeconds: 2700}\n"))
	if len(slow) < 8 {
		t.Fatalf("%d HelmReleases, want every one of the example's", len(slow))
	}
	for _, hr := range slow {
		prs, _, _ := unstructured.NestedSlice(hr.Object, "spec", "postRenderers")
		if len(prs) != 1 {
			t.Errorf("HelmRelease %s: post-renderers %v, want the progress deadline's", hr.GetName(), prs)
			continue
		}
		patches, _, _ := unstructured.NestedSlice(prs[0].(map[string]any), "kustomize", "patches")
		if len(patches) != 1 || fmt.Sprint(patches[0].(map[string]any)["target"]) != "map[kind:Deployment]" {
			t.Errorf("HelmRelease %s: patches %v, want one for every Deployment", hr.GetName(), patches)
			continue
		}
		for _, dep := range []string{"", "  progressDeadlineSeconds: 600\n"} {
			if got := kustomizePatch(t, patches[0].(map[string]any)["patch"].(string), dep); got != "2700" {
				t.Errorf("HelmRelease %s: the patched Deployment's progressDeadlineSeconds %s, want 2700", hr.GetName(), got)
			}
		}
	}
}

// kustomizePatch runs patch, a JSON 6902 patch for every Deployment, over
// a Deployment whose spec holds spec as kustomize does for Flux's
// post-renderers, and returns the result's progressDeadlineSeconds.
func kustomizePatch(t *testing.T, patch, spec string) string {
	t.Helper()
	fs := filesys.MakeFsInMemory()
	deployment := "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: d, namespace: n}\nspec:\n  replicas: 1\n" + spec
	k, err := yaml.Marshal(map[string]any{
		"apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization", "resources": []string{"d.yaml"},
		"patches": []map[string]any{{"target": map[string]any{"kind": "Deployment"}, "patch": patch}},
	})
	if err != nil {
		t.Fatal(err)
	}
	for name, data := range map[string]string{"/k/d.yaml": deployment, "/k/kustomization.yaml": string(k)} {
		if err := fs.WriteFile(name, []byte(data)); err != nil {
			t.Fatal(err)
		}
	}
	m, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(fs, "/k")
	if err != nil {
		t.Fatalf("kustomize: %v", err)
	}
	rs := m.Resources()
	if len(rs) != 1 {
		t.Fatalf("%d resources out of kustomize", len(rs))
	}
	obj, err := rs[0].Map()
	if err != nil {
		t.Fatal(err)
	}
	got, _, _ := unstructured.NestedFieldNoCopy(obj, "spec", "progressDeadlineSeconds")
	return fmt.Sprint(got)
}

// A component's values are merged over what the platform gives its
// HelmRelease: maps key by key, the rest replaced; the document keeps its
// comments and every other file is unchanged. A HelmRelease the
// component does not have is refused, naming those it has.
func TestComponentValues(t *testing.T) {
	plain := mustRender(t, exampleRack(t, "prod"))
	l := mustRender(t, exampleRack(t, "prod", platformLine, platformLine+`  components:
    cert-manager:
      values:
        cert-manager:
          replicaCount: 2
          crds: {keep: false}
          global: {leaderElection: {namespace: kube-system}}
`))
	const file = "clusters/prod/components/cert-manager/cert-manager.yaml"
	if !slices.Equal(l.Overridden, []string{"cert-manager"}) || plain.Overridden != nil {
		t.Errorf("Overridden: %v with values, %v without; want [cert-manager] and none", l.Overridden, plain.Overridden)
	}
	// The same values through platform.values reach the same merge, and
	// the same check.
	viaValues := mustRender(t, exampleRack(t, "prod", platformLine, platformLine+"  values:\n    components:\n      cert-manager:\n        values:\n          cert-manager: {replicaCount: 2}\n"))
	if !slices.Equal(viaValues.Overridden, []string{"cert-manager"}) || !bytes.Contains(viaValues.Files[file], []byte("replicaCount: 2")) {
		t.Errorf("platform.values.components: Overridden %v", viaValues.Overridden)
	}
	for _, p := range l.Paths() {
		if p != file && p != "clusters/prod/values.yaml" && !bytes.Equal(l.Files[p], plain.Files[p]) {
			t.Errorf("%s changed, but only %s has values to merge", p, file)
		}
	}
	got := string(l.Files[file])
	for _, want := range []string{"replicaCount: 2\n", "enabled: true", "keep: false", "namespace: kube-system", "# Deleting the release must not delete every Certificate in the cluster."} {
		if !strings.Contains(got, want) {
			t.Errorf("%s lacks %q:\n%s", file, want, got)
		}
	}
	objs, err := render.Decode(l.Files[file])
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range objs {
		if o.GetKind() == "HelmRelease" {
			if n, _, _ := unstructured.NestedFieldNoCopy(o.Object, "spec", "values", "replicaCount"); n != int64(2) && n != float64(2) {
				t.Errorf("replicaCount %v, want the number 2", o.Object["spec"].(map[string]any)["values"])
			}
		}
	}

	r := exampleRack(t, "prod", platformLine, platformLine+"  components:\n    networking:\n      values:\n        kubeovn: {replicaCount: 2}\n")
	if _, err := render.Render(r); err == nil || !strings.Contains(err.Error(), "components.networking.values.kubeovn: component networking has no HelmRelease kubeovn (it has cilium, kube-ovn)") {
		t.Errorf("a HelmRelease the component lacks: %v", err)
	}
}

// Cozy's charts go into the repository versioned X.Y.Z+<digest of their
// files>: the same files give the same version, another file another.
func TestChartVersionFollowsItsFiles(t *testing.T) {
	l := mustRender(t, exampleRack(t, "prod"))
	again := mustRender(t, exampleRack(t, "prod"))
	const meta = "charts/cozy-operator/Chart.yaml"
	v := regexp.MustCompile(`(?m)^version: (0\.1\.0\+[0-9a-f]{12})$`).FindSubmatch(l.Files[meta])
	if v == nil {
		t.Fatalf("%s has no version 0.1.0+<digest>:\n%s", meta, l.Files[meta])
	}
	if !bytes.Equal(l.Files[meta], again.Files[meta]) {
		t.Error("two renderings of the same chart give two versions")
	}
	other := regexp.MustCompile(`(?m)^version: (0\.1\.0\+[0-9a-f]{12})$`).FindSubmatch(l.Files["charts/kubevirt-csi-node/Chart.yaml"])
	if other == nil || bytes.Equal(other[1], v[1]) {
		t.Errorf("kubevirt-csi-node's version %q: want its own digest, not cozy-operator's %s", other, v[1])
	}
	// The HelmRelease reads it by version (Flux's default), not by the
	// repository's revision.
	if bytes.Contains(l.Files["clusters/prod/components/cozy-operator/cozy-operator.yaml"], []byte("reconcileStrategy")) {
		t.Error("cozy-operator's HelmRelease sets a reconcileStrategy; by version is what the digest is for")
	}
}
