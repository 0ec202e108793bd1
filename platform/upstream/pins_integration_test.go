//go:build integration

package upstream_test

import (
	"context"
	"maps"
	"path"
	"slices"
	"strings"
	"testing"

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
	proxy, err := testenv.ModuleProxy(context.Background(), upstream.Modules()...)
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
	checked, err := render.CheckCharts(context.Background(), l, upstream.Maker{Source: src}, r.Cluster.KubernetesVersion, nil)
	if err != nil {
		t.Fatal(err)
	}
	byRelease := map[string]render.Checked{}
	for _, c := range checked {
		byRelease[c.File+" "+c.Release] = c
		images := 0
		for _, f := range slices.Sorted(maps.Keys(c.Files)) {
			docs, err := render.Decode([]byte(c.Files[f]))
			if err != nil {
				t.Fatalf("chart %s, %s: %v", c.Chart.Ref(), f, err)
			}
			for _, d := range docs {
				for _, ct := range render.Containers(d.Object) {
					images++
					if why := unpinned(ct.Image); why != "" {
						t.Errorf("chart %s, %s %s, container %s: image %q %s", c.Chart.Ref(), d.GetKind(), d.GetName(), ct.Name, ct.Image, why)
					}
				}
			}
		}
		if images == 0 {
			t.Errorf("chart %s rendered no container at all", c.Chart.Ref())
		}
		t.Logf("chart %s from %s: %d templates rendered, %d containers", c.Chart.Ref(), c.Chart.Module, len(c.Files), images)
	}

	// Every upstream HelmRelease was checked, or its chart is one no
	// module carries.
	oci := map[string]*unstructured.Unstructured{}
	for _, o := range objs {
		if o.GetKind() == "OCIRepository" {
			oci[o.GetNamespace()+"/"+o.GetName()] = o.Unstructured
		}
	}
	var unavailable []string
	for _, o := range objs {
		if o.GetKind() != "HelmRelease" {
			continue
		}
		name, version, own := chartOf(o.Unstructured, oci)
		_, done := byRelease[o.File+" "+o.GetName()]
		switch _, na := upstream.Unavailable[name]; {
		case own || done:
		case na:
			unavailable = append(unavailable, name)
		default:
			t.Errorf("%s: HelmRelease %s (chart %s %s) was not checked", o.File, o.GetName(), name, version)
		}
	}
	for name := range upstream.Unavailable {
		if !slices.Contains(unavailable, name) {
			t.Errorf("upstream.Unavailable lists %s, which the platform does not install", name)
		}
	}
	t.Logf("checked %d charts; not made here (upstream.Unavailable): %v", len(checked), unavailable)
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
