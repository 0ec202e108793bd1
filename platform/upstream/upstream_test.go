package upstream

import (
	"archive/zip"
	"bytes"
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"golang.org/x/mod/module"
	"golang.org/x/mod/sumdb/dirhash"
	"helm.sh/helm/v3/pkg/chart/loader"
)

// testModule writes a module zip holding files (paths inside the module)
// into a proxy tree under dir, and returns the module and its hash.
func testModule(t *testing.T, dir string, m module.Version, files map[string]string) string {
	t.Helper()
	rel, err := zipPath(m)
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(dir, rel)
	if err := os.MkdirAll(filepath.Dir(file), 0o755); err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	z := zip.NewWriter(&buf)
	for _, name := range slices.Sorted(func(yield func(string) bool) {
		for k := range files {
			if !yield(k) {
				return
			}
		}
	}) {
		w, err := z.Create(m.Path + "@" + m.Version + "/" + name)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = w.Write([]byte(files[name]))
	}
	if err := z.Close(); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(file, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	sum, err := dirhash.HashZip(file, dirhash.Hash1)
	if err != nil {
		t.Fatal(err)
	}
	return sum
}

var demo = module.Version{Path: "example.com/Demo", Version: "v1.2.3"}

var demoFiles = map[string]string{
	"go.mod":                          "module example.com/Demo\n",
	"deploy/demo/Chart.yaml":          "apiVersion: v2\nname: demo\nversion: 0.0.0\nappVersion: 0.0.0\n",
	"deploy/demo/values.yaml":         "# the image\nimage:\n  repository: example.com/demo\n  tag: dev # set by the release\nreplicas: 1\n",
	"deploy/demo/templates/pod.yaml":  "apiVersion: v1\nkind: Pod\nmetadata: {name: demo}\nspec:\n  containers:\n    - name: demo\n      image: {{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}\n",
	"deploy/demo/.helmignore":         "*.bak\n",
	"deploy/demo/templates/notes.bak": "left out by .helmignore",
	"deploy/other/kustomization.yaml": "resources: []\n",
	// Subcharts: Helm's loader collects them through a map.
	"deploy/demo/charts/a/Chart.yaml": "apiVersion: v2\nname: a\nversion: 1.0.0\n",
	"deploy/demo/charts/b/Chart.yaml": "apiVersion: v2\nname: b\nversion: 1.0.0\n",
	"deploy/demo/charts/c/Chart.yaml": "apiVersion: v2\nname: c\nversion: 1.0.0\n",
	"deploy/demo/charts/d/Chart.yaml": "apiVersion: v2\nname: d\nversion: 1.0.0\n",
}

func TestSourceFetchesAndChecks(t *testing.T) {
	empty, full := t.TempDir(), t.TempDir()
	sum := testModule(t, full, demo, demoFiles)
	var hits []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits = append(hits, r.URL.Path)
		http.ServeFile(w, r, filepath.Join(full, filepath.FromSlash(r.URL.Path)))
	}))
	defer srv.Close()
	ctx := context.Background()

	// The first proxy lacks it (file://, 404 as not found); the second,
	// over HTTP, has it. The path escapes the capital: !demo.
	s := Source{Proxies: []string{"file://" + empty, srv.URL}, Cache: t.TempDir()}
	got, err := s.Zip(ctx, demo, sum)
	if err != nil {
		t.Fatal(err)
	}
	if want := "/example.com/!demo/@v/v1.2.3.zip"; !slices.Equal(hits, []string{want}) {
		t.Errorf("requests %v, want %s", hits, want)
	}
	// A second call reads the cache.
	if again, err := s.Zip(ctx, demo, sum); err != nil || again != got || len(hits) != 1 {
		t.Errorf("second fetch: %s, %v, %d requests", again, err, len(hits))
	}
	// A damaged cached zip is fetched again.
	if err := os.WriteFile(got, []byte("not a zip"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Zip(ctx, demo, sum); err != nil || len(hits) != 2 {
		t.Errorf("after damage: %v, %d requests", err, len(hits))
	}

	for _, tt := range []struct {
		name string
		s    Source
		sum  string
		want string
	}{
		{"another hash pinned", Source{Proxies: []string{srv.URL}, Cache: t.TempDir()}, "h1:AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=", "Cozy pins h1:AAAA"},
		{"no proxy has it", Source{Proxies: []string{"file://" + empty}, Cache: t.TempDir()}, sum, "no proxy has it (file://"},
		{"an unknown scheme", Source{Proxies: []string{"ftp://x"}, Cache: t.TempDir()}, sum, "only http, https and file URLs"},
		{"no cache", Source{Proxies: []string{srv.URL}}, sum, "no cache directory"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, err := tt.s.Zip(ctx, demo, tt.sum)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("got %v, want an error with %q", err, tt.want)
			}
			if tt.s.Cache != "" {
				left, _ := filepath.Glob(filepath.Join(tt.s.Cache, "*", "*", "@v", "*"))
				if len(left) != 0 {
					t.Errorf("left in the cache: %v", left)
				}
			}
		})
	}
}

func TestProxies(t *testing.T) {
	for in, want := range map[string][]string{
		"":                                    {DefaultProxy},
		"off":                                 {DefaultProxy},
		"https://a.example/,direct":           {"https://a.example"},
		"https://a.example|https://b.example": {"https://a.example", "https://b.example"},
		"file:///var/cache/dl, https://a.example": {"file:///var/cache/dl", "https://a.example"},
	} {
		if got := Proxies(in); !slices.Equal(got, want) {
			t.Errorf("Proxies(%q) = %v, want %v", in, got, want)
		}
	}
}

// Package sets the version as `helm package --version --app-version`
// does, runs the release step, honours .helmignore, and gives the same
// bytes twice.
func TestPackage(t *testing.T) {
	dir := t.TempDir()
	sum := testModule(t, dir, demo, demoFiles)
	zip, err := Source{Proxies: []string{"file://" + dir}, Cache: t.TempDir()}.Zip(context.Background(), demo, sum)
	if err != nil {
		t.Fatal(err)
	}
	c := Chart{
		Name: "demo", Version: "v1.2.3", AppVersion: "v1.2.3", Module: demo, Sum: sum, Dir: "deploy/demo",
		Also: []string{"deploy/other"},
		release: func(root string) error {
			if _, err := os.Stat(filepath.Join(root, "deploy", "other", "kustomization.yaml")); err != nil {
				return err
			}
			return editYAML(filepath.Join(root, "deploy", "demo", "values.yaml"), map[string]string{"image.tag": "v1.2.3"})
		},
	}
	p, err := c.Package(zip)
	if err != nil {
		t.Fatal(err)
	}
	for range 10 {
		again, err := c.Package(zip)
		if err != nil || !bytes.Equal(p.Archive, again.Archive) {
			t.Fatalf("two packagings differ (%v)", err)
		}
	}
	ch, err := loader.LoadArchive(bytes.NewReader(p.Archive))
	if err != nil {
		t.Fatal(err)
	}
	if ch.Metadata.Version != "v1.2.3" || ch.Metadata.AppVersion != "v1.2.3" {
		t.Errorf("version %s, appVersion %s", ch.Metadata.Version, ch.Metadata.AppVersion)
	}
	for _, f := range ch.Templates {
		if strings.HasSuffix(f.Name, ".bak") {
			t.Errorf("%s was packaged despite .helmignore", f.Name)
		}
	}
	var values string
	for _, f := range ch.Raw {
		if f.Name == "values.yaml" {
			values = string(f.Data)
		}
	}
	if !strings.Contains(values, `tag: "v1.2.3" # set by the release`) || !strings.Contains(values, "# the image") {
		t.Errorf("the release step's edit kept neither the value nor the comments:\n%s", values)
	}

	for _, tt := range []struct {
		name string
		edit func(*Chart)
		want string
	}{
		{"another chart in the folder", func(c *Chart) { c.Name = "other" }, `holds chart "demo"`},
		{"no such folder", func(c *Chart) { c.Dir = "charts/demo" }, "has no folder charts/demo"},
		{"a failing release step", func(c *Chart) {
			c.release = func(string) error { return os.ErrPermission }
		}, "release step"},
		{"a value the release cannot set", func(c *Chart) {
			c.release = func(root string) error {
				return editYAML(filepath.Join(root, "deploy", "demo", "values.yaml"), map[string]string{"image.digest": "x"})
			}
		}, "no value at image.digest"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			bad := c
			tt.edit(&bad)
			if _, err := bad.Package(zip); err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("got %v, want an error with %q", err, tt.want)
			}
		})
	}
}

func TestFind(t *testing.T) {
	if c, err := Find("cert-manager", "v1.21.2"); err != nil || c.Module.Path != "github.com/cert-manager/cert-manager" {
		t.Errorf("cert-manager v1.21.2: %+v, %v", c, err)
	}
	for _, tt := range []struct{ name, version, want string }{
		{"cert-manager", "v1.21.3", "no pinned module for that version (it has v1.21.1, v1.21.2)"},
		{"kamaji", "26.3.6-edge", "cannot be made here"},
		{"nginx", "1.0.0", "knows no module that carries it"},
	} {
		if _, err := Find(tt.name, tt.version); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("Find(%s, %s) = %v, want %q", tt.name, tt.version, err, tt.want)
		}
	}
	for _, c := range Charts {
		if _, ok := Unavailable[c.Name]; ok {
			t.Errorf("%s is both made and unavailable", c.Name)
		}
		if !strings.HasPrefix(c.Sum, "h1:") || c.From == "" {
			t.Errorf("%s: a pin needs its h1: hash and where its release steps were read", c.Ref())
		}
	}
}
