//go:build integration

package upstream_test

import (
	"cmp"
	"context"
	"encoding/json"
	"maps"
	"path"
	"slices"
	"strings"
	"testing"

	"golang.org/x/mod/module"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"cozy.dev/cozy/bootstrap/rack"
	"cozy.dev/cozy/internal/imageref"
	"cozy.dev/cozy/internal/testing/testenv"
	"cozy.dev/cozy/platform/render"
	"cozy.dev/cozy/platform/upstream"
)

// moduleSource downloads every pinned module with the go command (which
// checks it against the checksum database) and returns a Source reading
// the go command's download cache as a file:// proxy.
func moduleSource(t *testing.T) upstream.Source {
	t.Helper()
	var mods []module.Version
	for _, c := range upstream.Charts {
		mods = append(mods, c.Module)
	}
	proxy, err := testenv.ModuleProxy(context.Background(), mods...)
	if err != nil {
		t.Fatal(err)
	}
	return upstream.Source{Proxies: []string{proxy}, Cache: t.TempDir()}
}

// Every upstream chart the platform installs is made from its module at
// the pinned version and rendered, as helm-controller would, with the
// values Cozy's HelmRelease gives it: the render must succeed, every key
// of Cozy's values must be one the chart defines, and every image must
// carry a version tag or a digest. Charts no module carries must be in
// upstream.Unavailable, with the reason.
func TestPinnedChartsRender(t *testing.T) {
	src := moduleSource(t)
	data, err := rack.Example("example")
	if err != nil {
		t.Fatal(err)
	}
	r, err := rack.Parse(data, "example.yaml", t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	l, err := render.Render(r)
	if err != nil {
		t.Fatal(err)
	}
	objs, err := l.Objects()
	if err != nil {
		t.Fatal(err)
	}
	oci := map[string]*unstructured.Unstructured{}
	for _, o := range objs {
		if o.GetKind() == "OCIRepository" {
			oci[o.GetNamespace()+"/"+o.GetName()] = o.Unstructured
		}
	}
	var checked, unavailable []string
	for _, o := range objs {
		if o.GetKind() != "HelmRelease" {
			continue
		}
		name, version, own := chartOf(o.Unstructured, oci)
		if own {
			continue // Cozy's own charts: images and render tests cover them
		}
		if _, ok := upstream.Unavailable[name]; ok {
			unavailable = append(unavailable, name)
			continue
		}
		t.Run(name, func(t *testing.T) {
			c, err := upstream.Find(name, version)
			if err != nil {
				t.Fatalf("%s: %v", o.File, err)
			}
			zip, err := src.Zip(context.Background(), c.Module, c.Sum)
			if err != nil {
				t.Fatal(err)
			}
			p, err := c.Package(zip)
			if err != nil {
				t.Fatal(err)
			}
			values := valuesOf(t, o.Unstructured)
			for _, k := range upstream.UnknownValues(p.Chart, values) {
				t.Errorf("%s: values key %s: chart %s does not define it", o.File, k, c.Ref())
			}
			ns, _, _ := unstructured.NestedString(o.Object, "spec", "targetNamespace")
			release, _, _ := unstructured.NestedString(o.Object, "spec", "releaseName")
			files, err := render.Template(p.Chart, values, cmp.Or(release, o.GetName()), cmp.Or(ns, o.GetNamespace()), r.Cluster.KubernetesVersion)
			if err != nil {
				t.Fatalf("%s: %v", o.File, err)
			}
			images := 0
			for _, f := range slices.Sorted(maps.Keys(files)) {
				docs, err := render.Decode([]byte(files[f]))
				if err != nil {
					t.Fatalf("chart %s, %s: %v", c.Ref(), f, err)
				}
				for _, d := range docs {
					for _, ct := range render.Containers(d.Object) {
						images++
						if why := unpinned(ct.Image); why != "" {
							t.Errorf("chart %s, %s %s, container %s: image %q %s", c.Ref(), d.GetKind(), d.GetName(), ct.Name, ct.Image, why)
						}
					}
				}
			}
			if images == 0 {
				t.Errorf("chart %s rendered no container at all", c.Ref())
			}
			t.Logf("chart %s from %s: %d templates rendered, %d containers", c.Ref(), c.Module, len(files), images)
		})
		checked = append(checked, name)
	}
	for name := range upstream.Unavailable {
		if !slices.Contains(unavailable, name) {
			t.Errorf("upstream.Unavailable lists %s, which the platform does not install", name)
		}
	}
	t.Logf("checked %v; not made here (upstream.Unavailable): %v", checked, unavailable)
}

// chartOf is the chart name and version a HelmRelease installs, and
// whether it is one of Cozy's own (from the platform's repository). A
// chartRef names an OCIRepository (of oci, by namespace/name): its URL's
// last element and its tag.
func chartOf(hr *unstructured.Unstructured, oci map[string]*unstructured.Unstructured) (name, version string, own bool) {
	if ref, ok, _ := unstructured.NestedString(hr.Object, "spec", "chartRef", "name"); ok {
		repo := oci[hr.GetNamespace()+"/"+ref]
		if repo == nil {
			return ref, "", false
		}
		url, _, _ := unstructured.NestedString(repo.Object, "spec", "url")
		version, _, _ = unstructured.NestedString(repo.Object, "spec", "ref", "tag")
		return path.Base(url), version, false
	}
	chart, _, _ := unstructured.NestedString(hr.Object, "spec", "chart", "spec", "chart")
	version, _, _ = unstructured.NestedString(hr.Object, "spec", "chart", "spec", "version")
	src, _, _ := unstructured.NestedString(hr.Object, "spec", "chart", "spec", "sourceRef", "name")
	return path.Base(chart), version, src == "flux-system"
}

func valuesOf(t *testing.T, hr *unstructured.Unstructured) map[string]any {
	t.Helper()
	values := map[string]any{}
	if v, ok, _ := unstructured.NestedFieldNoCopy(hr.Object, "spec", "values"); ok {
		data, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal(data, &values); err != nil {
			t.Fatal(err)
		}
	}
	return values
}

// unpinned says why an image reference does not name one build: no tag
// and no digest, "latest", or a tag without a version in it ("dev").
func unpinned(image string) string {
	r, err := imageref.Parse(image)
	switch {
	case err != nil:
		return err.Error()
	case r.Digest != "":
		return ""
	case r.Tag == "latest" || strings.IndexFunc(r.Tag, func(c rune) bool { return c >= '0' && c <= '9' }) < 0:
		return "has no fixed tag or digest"
	}
	return ""
}
