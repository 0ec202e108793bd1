package flux

import (
	"context"
	"flag"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"
)

var update = flag.Bool("update", false, "rewrite golden files")

// fluxCRDs is a minimal stand-in for Flux's install.yaml: its CRDs (names
// only) and one Deployment.
func fluxCRDs() string {
	var b strings.Builder
	for _, n := range requiredCRDs {
		b.WriteString("---\napiVersion: apiextensions.k8s.io/v1\nkind: CustomResourceDefinition\nmetadata:\n  name: " + n + "\n")
	}
	b.WriteString("---\napiVersion: v1\nkind: Namespace\nmetadata:\n  name: flux-system\n")
	b.WriteString("---\napiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: source-controller\n  namespace: flux-system\n")
	return b.String()
}

func TestDecode(t *testing.T) {
	tests := []struct {
		name, in string
		want     int
		err      string
	}{
		{name: "documents and empty ones", in: "---\n---\napiVersion: v1\nkind: ConfigMap\nmetadata: {name: a}\n---\n# only a comment\n---\napiVersion: v1\nkind: ConfigMap\nmetadata: {name: b}\n", want: 2},
		{name: "a List is flattened", in: `{"apiVersion":"v1","kind":"List","items":[{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"a"}},{"apiVersion":"v1","kind":"Secret","metadata":{"name":"b"}}]}`, want: 2},
		{name: "nothing", in: "---\n# nothing\n", err: "f.yaml: no objects"},
		{name: "no kind", in: "apiVersion: v1\nmetadata: {name: a}\n", err: "f.yaml: object 1 has no apiVersion, kind or metadata.name"},
		{name: "no name", in: "apiVersion: v1\nkind: ConfigMap\n", err: "object 1 has no"},
		{name: "not YAML", in: "apiVersion: v1\nkind: [\n", err: "f.yaml: document 1:"},
		{name: "a scalar", in: "just text\n", err: "f.yaml: document 1:"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			objs, err := Decode([]byte(tt.in), "f.yaml")
			if tt.err != "" {
				if err == nil || !strings.Contains(err.Error(), tt.err) {
					t.Fatalf("err = %v, want it to contain %q", err, tt.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if len(objs) != tt.want {
				t.Fatalf("%d objects, want %d", len(objs), tt.want)
			}
		})
	}
}

func FuzzDecode(f *testing.F) {
	f.Add([]byte(fluxCRDs()))
	f.Add([]byte(`{"apiVersion":"v1","kind":"List","items":[{"kind":"x"}]}`))
	f.Add([]byte("---\n- a\n- b\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		objs, err := Decode(data, "fuzz")
		if err == nil && len(objs) == 0 {
			t.Fatal("no error and no objects")
		}
		for _, o := range objs {
			if o.GetKind() == "" || o.GetName() == "" {
				t.Fatalf("object without kind or name accepted: %v", o.Object)
			}
		}
	})
}

func TestLoad(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	write := func(name, content string) string {
		t.Helper()
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	file := write("release/install.yaml", fluxCRDs())
	// A folder of files, read in lexical order.
	write("split/b.yml", "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: b, namespace: flux-system}\n")
	write("split/a.yaml", fluxCRDs())
	write("split/notes.txt", "not YAML, not read")
	// A kustomization that patches the release, as a registry mirror does.
	write("mirror/install.yaml", fluxCRDs())
	write("mirror/kustomization.yaml", "resources: [install.yaml]\ncommonLabels: {mirror: \"yes\"}\n")
	write("notflux/cm.yaml", "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: a}\n")
	write("bad/x.yaml", "apiVersion: v1\nkind: [\n")
	if err := os.MkdirAll(filepath.Join(dir, "empty"), 0o755); err != nil {
		t.Fatal(err)
	}

	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/install.yaml" {
			http.NotFound(w, r)
			return
		}
		_, _ = w.Write([]byte(fluxCRDs()))
	}))
	defer srv.Close()

	tests := []struct {
		name, src string
		want      int
		first     string // kind/name of the first object
		err       string
	}{
		{name: "file", src: file, want: 8, first: "CustomResourceDefinition/" + requiredCRDs[0]},
		{name: "folder", src: filepath.Join(dir, "split"), want: 9, first: "CustomResourceDefinition/" + requiredCRDs[0]},
		{name: "kustomized folder", src: filepath.Join(dir, "mirror"), want: 8},
		{name: "URL", src: srv.URL + "/install.yaml", want: 8},
		{name: "URL not found", src: srv.URL + "/nope", err: "404 Not Found"},
		{name: "not Flux", src: filepath.Join(dir, "notflux"), err: "no CustomResourceDefinition gitrepositories.source.toolkit.fluxcd.io"},
		{name: "bad YAML names the file", src: filepath.Join(dir, "bad"), err: filepath.Join(dir, "bad", "x.yaml") + ": document 1"},
		{name: "empty folder", src: filepath.Join(dir, "empty"), err: "no *.yaml files"},
		{name: "missing", src: filepath.Join(dir, "nope.yaml"), err: "no such file"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			objs, err := Load(ctx, tt.src)
			if tt.err != "" {
				if err == nil || !strings.Contains(err.Error(), tt.err) || !strings.Contains(err.Error(), tt.src) {
					t.Fatalf("err = %v, want it to name %s and contain %q", err, tt.src, tt.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if len(objs) != tt.want {
				t.Fatalf("%d objects, want %d", len(objs), tt.want)
			}
			if got := objs[0].GetKind() + "/" + objs[0].GetName(); tt.first != "" && got != tt.first {
				t.Errorf("first object %s, want %s", got, tt.first)
			}
		})
	}
	t.Run("kustomized folder is patched", func(t *testing.T) {
		objs, err := Load(ctx, filepath.Join(dir, "mirror"))
		if err != nil {
			t.Fatal(err)
		}
		for _, o := range objs {
			if o.GetLabels()["mirror"] != "yes" {
				t.Fatalf("%s/%s not kustomized: labels %v", o.GetKind(), o.GetName(), o.GetLabels())
			}
		}
	})
}

func TestSplitOrdersCRDsFirst(t *testing.T) {
	objs, err := Decode([]byte("apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: d}\n---\n"+fluxCRDs()), "f")
	if err != nil {
		t.Fatal(err)
	}
	crds, nss, rest := split(objs)
	if len(crds) != len(requiredCRDs) || len(nss) != 1 || len(rest) != 2 {
		t.Fatalf("split: %d CRDs, %d namespaces, %d others", len(crds), len(nss), len(rest))
	}
}

// The controllers' in-cluster addresses follow the cluster's domain, as
// `flux install --cluster-domain` makes them; the manifests given are
// left as they were.
func TestWithClusterDomain(t *testing.T) {
	const deployment = `apiVersion: apps/v1
kind: Deployment
metadata: {name: source-controller, namespace: flux-system}
spec:
  template:
    spec:
      containers:
      - name: manager
        args:
        - --watch-all-namespaces
        - --storage-adv-addr=source-controller.$(RUNTIME_NAMESPACE).svc.cluster.local.
        - --events-addr=http://notification-controller.flux-system.svc.cluster.local./
`
	objs, err := Decode([]byte(deployment+"---\napiVersion: v1\nkind: Service\nmetadata: {name: s, namespace: flux-system, annotations: {a: x.svc.cluster.local}}\n"), "f")
	if err != nil {
		t.Fatal(err)
	}
	args := func(u *unstructured.Unstructured) []any {
		cs, _, _ := unstructured.NestedSlice(u.Object, "spec", "template", "spec", "containers")
		return cs[0].(map[string]any)["args"].([]any)
	}
	for _, tt := range []struct{ domain, want string }{
		{"", "source-controller.$(RUNTIME_NAMESPACE).svc.cluster.local."},
		{"cluster.local", "source-controller.$(RUNTIME_NAMESPACE).svc.cluster.local."},
		{"cozy.local", "source-controller.$(RUNTIME_NAMESPACE).svc.cozy.local."},
	} {
		got, err := withClusterDomain(objs, tt.domain)
		if err != nil {
			t.Fatal(err)
		}
		a := args(got[0])
		if a[1] != "--storage-adv-addr="+tt.want || a[0] != "--watch-all-namespaces" ||
			!strings.Contains(a[2].(string), ".svc."+map[bool]string{true: "cluster.local", false: tt.domain}[tt.domain == ""]+"./") {
			t.Errorf("domain %q: args %v", tt.domain, a)
		}
		if got[1].GetAnnotations()["a"] != "x.svc.cluster.local" {
			t.Errorf("domain %q: a Service was edited: %v", tt.domain, got[1].GetAnnotations())
		}
	}
	if a := args(objs[0]); a[1] != "--storage-adv-addr=source-controller.$(RUNTIME_NAMESPACE).svc.cluster.local." {
		t.Errorf("the manifests given were edited: %v", a)
	}
	if _, err := withClusterDomain(objs, "Bad_Domain"); err == nil || !strings.Contains(err.Error(), "not a DNS name") {
		t.Errorf("a bad domain: %v", err)
	}
}

func TestGitValidate(t *testing.T) {
	ok := Git{URL: "https://git.example.com/platform.git", Path: "clusters/lab"}
	tests := []struct {
		name string
		edit func(*Git)
		err  string
	}{
		{name: "https", edit: func(*Git) {}},
		{name: "ssh", edit: func(g *Git) { g.URL = "ssh://git@git.example.com/platform.git" }},
		{name: "path with ./", edit: func(g *Git) { g.Path = "./clusters/lab" }},
		{name: "no URL", edit: func(g *Git) { g.URL = "" }, err: "no Git URL"},
		{name: "scp form", edit: func(g *Git) { g.URL = "git@github.com:org/repo.git" }, err: "ssh://"},
		{name: "file URL", edit: func(g *Git) { g.URL = "file:///srv/platform" }, err: "Flux clones https://"},
		{name: "no host", edit: func(g *Git) { g.URL = "https:///platform.git" }, err: "has no host"},
		{name: "no path", edit: func(g *Git) { g.Path = "" }, err: "Git path"},
		{name: "absolute path", edit: func(g *Git) { g.Path = "/clusters/lab" }, err: "relative to the repository root"},
		{name: "path escapes", edit: func(g *Git) { g.Path = "clusters/../../x" }, err: "relative to the repository root"},
		{name: "root", edit: func(g *Git) { g.Path = "./" }, err: "Git path"},
		{name: "bad branch", edit: func(g *Git) { g.Branch = "main branch" }, err: "not a valid branch name"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := ok
			tt.edit(&g)
			err := g.validate()
			if tt.err == "" && err != nil {
				t.Fatal(err)
			}
			if tt.err != "" && (err == nil || !strings.Contains(err.Error(), tt.err)) {
				t.Fatalf("err = %v, want it to contain %q", err, tt.err)
			}
		})
	}
}

// TestSyncObjects keeps the GitRepository and root Kustomization that
// install creates in a golden file.
func TestSyncObjects(t *testing.T) {
	objs, err := SyncObjects(Git{
		URL: "https://git.example.com/platform.git", Branch: "prod", Path: "clusters/rack1",
		SecretRef: "platform-git", Interval: 30 * time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	var out []byte
	for _, o := range objs {
		b, err := yaml.Marshal(o.Object)
		if err != nil {
			t.Fatal(err)
		}
		out = append(append(out, "---\n"...), b...)
	}
	golden := filepath.Join("testdata", "sync.yaml")
	if *update {
		if err := os.WriteFile(golden, out, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatal(err)
	}
	if string(want) != string(out) {
		t.Errorf("sync objects differ from %s (go test -update):\n%s", golden, out)
	}
	// What the rendered platform refers to.
	var repo, root *unstructured.Unstructured = objs[0], objs[1]
	if repo.GetKind() != "GitRepository" || repo.GetName() != "flux-system" || root.GetNamespace() != "flux-system" {
		t.Errorf("got %s %s, %s %s/%s", repo.GetKind(), repo.GetName(), root.GetKind(), root.GetNamespace(), root.GetName())
	}
}
