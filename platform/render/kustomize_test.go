package render_test

import (
	"fmt"
	"path"
	"strings"
	"testing"

	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/yaml"

	"cozy.dev/cozy/platform/render"
)

// TestKustomizeBuilds runs kustomize (the library kustomize-controller
// builds with) on the cluster folder and every component folder, as Flux
// will. Remote release manifests cannot be fetched here, so each is
// replaced by a stand-in CRD, which must come out unprunable
// (snapshot_integration_test.go builds one component with the real files).
func TestKustomizeBuilds(t *testing.T) {
	for name, l := range layouts(t) {
		t.Run(name, func(t *testing.T) {
			fs := filesys.MakeFsInMemory()
			var dirs []string
			for _, p := range l.Paths() {
				data := l.Files[p]
				if path.Base(p) == "kustomization.yaml" {
					dirs = append(dirs, path.Dir(p))
					var standins map[string][]byte
					data, standins = withLocal(t, p, data, func(i int, _ string) (string, []byte) {
						return fmt.Sprintf("standin-crd-%d.yaml", i), []byte(standinCRD(i))
					})
					for name, crd := range standins {
						if err := fs.WriteFile("/"+path.Join(path.Dir(p), name), crd); err != nil {
							t.Fatal(err)
						}
					}
				}
				if err := fs.WriteFile("/"+p, data); err != nil {
					t.Fatal(err)
				}
			}
			k := krusty.MakeKustomizer(krusty.MakeDefaultOptions())
			for _, dir := range dirs {
				res, err := k.Run(fs, "/"+dir)
				if err != nil {
					t.Errorf("kustomize build %s: %v", dir, err)
					continue
				}
				if len(res.Resources()) == 0 {
					t.Errorf("kustomize build %s: no objects", dir)
				}
				for _, r := range res.Resources() {
					if r.GetKind() == "CustomResourceDefinition" && r.GetAnnotations()["kustomize.toolkit.fluxcd.io/prune"] != "disabled" {
						t.Errorf("kustomize build %s: Flux may prune CRD %s", dir, r.GetName())
					}
				}
				if dir == l.ClusterDir {
					// The root applies only the component Kustomizations
					// and the list of components on and off.
					for _, r := range res.Resources() {
						if r.GetKind() != "Kustomization" && (r.GetKind() != "ConfigMap" || r.GetName() != render.ComponentsConfigMap) {
							t.Errorf("the cluster folder's root applies %s %s itself", r.GetKind(), r.GetName())
						}
					}
				}
			}
		})
	}
}

// standinCRD is the stand-in for remote resource i of a kustomization.
func standinCRD(i int) string {
	return fmt.Sprintf(`apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: standin%[1]ds.example.com
spec:
  group: example.com
  names: {kind: Standin%[1]d, plural: standin%[1]ds}
  scope: Namespaced
  versions: [{name: v1, served: true, storage: true, schema: {openAPIV3Schema: {type: object}}}]
`, i)
}

// withLocal replaces the https:// resources of a kustomization.yaml
// with the files local(i, url) names and holds (i counts them from 0),
// and returns those by file name.
func withLocal(t *testing.T, file string, data []byte, local func(i int, url string) (string, []byte)) ([]byte, map[string][]byte) {
	t.Helper()
	var k map[string]any
	if err := yaml.Unmarshal(data, &k); err != nil {
		t.Fatalf("%s: %v", file, err)
	}
	res, _ := k["resources"].([]any)
	var kept []any
	files := map[string][]byte{}
	for _, r := range res {
		if s, _ := r.(string); strings.HasPrefix(s, "https://") {
			name, content := local(len(files), s)
			files[name] = content
			r = name
		}
		kept = append(kept, r)
	}
	k["resources"] = kept
	out, err := yaml.Marshal(k)
	if err != nil {
		t.Fatal(err)
	}
	return out, files
}
