package images

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"testing"

	"helm.sh/helm/v3/pkg/chart"
	"helm.sh/helm/v3/pkg/chartutil"
	helmregistry "helm.sh/helm/v3/pkg/registry"
)

// demoChart is a small chart packaged by Helm.
func demoChart(t *testing.T, version string) (*chart.Metadata, []byte) {
	t.Helper()
	meta := &chart.Metadata{APIVersion: "v2", Name: "demo", Version: version, AppVersion: "1.0"}
	c := &chart.Chart{
		Metadata:  meta,
		Templates: []*chart.File{{Name: "templates/cm.yaml", Data: []byte("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: demo}\n")}},
	}
	file, err := chartutil.Save(c, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	return meta, data
}

// A chart Mirror pushes is what Helm's own OCI client (the one
// source-controller uses for HelmRepository type oci) pulls back: the
// same archive and metadata, under ChartPath/NAME:TAG with "+" as "_".
// A second run finds it there.
func TestMirrorChartsHelmPulls(t *testing.T) {
	reg := startRegistry(t)
	meta, archive := demoChart(t, "1.2.3+build.1")
	img, err := ChartImage(meta, archive)
	if err != nil {
		t.Fatal(err)
	}
	again, _ := ChartImage(meta, archive)
	d1, _ := img.Digest()
	d2, _ := again.Digest()
	if d1 != d2 {
		t.Fatalf("the same chart gave two digests, %s and %s", d1, d2)
	}
	o := MirrorOptions{
		Registry: reg, Insecure: true, Source: &Upstream{}, ChartPath: "platform/charts",
		Charts: []MirrorChart{{Name: "demo", Version: "1.2.3+build.1", Image: img}},
	}
	rs, err := Mirror(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	want := reg + "/platform/charts/demo:1.2.3_build.1"
	if len(rs) != 1 || rs[0].Status != StatusCopied || rs[0].Target != want || rs[0].Chart != "demo 1.2.3+build.1" || rs[0].Digest != d1.String() {
		t.Fatalf("results %+v, want demo copied to %s", rs, want)
	}

	hc, err := helmregistry.NewClient(helmregistry.ClientOptPlainHTTP(),
		helmregistry.ClientOptCredentialsFile(filepath.Join(t.TempDir(), "config.json")))
	if err != nil {
		t.Fatal(err)
	}
	got, err := hc.Pull(want)
	if err != nil {
		t.Fatalf("helm pull %s: %v", want, err)
	}
	if !bytes.Equal(got.Chart.Data, archive) || got.Chart.Meta.Name != "demo" || got.Chart.Meta.Version != "1.2.3+build.1" {
		t.Errorf("helm pulled %d bytes of %s %s, want the %d pushed", len(got.Chart.Data), got.Chart.Meta.Name, got.Chart.Meta.Version, len(archive))
	}

	rs, err = Mirror(context.Background(), o)
	if err != nil || rs[0].Status != StatusPresent {
		t.Errorf("second mirror: %+v, %v; want present", rs, err)
	}
	o.ChartPath = "/charts"
	if _, err := Mirror(context.Background(), o); err == nil {
		t.Error("a chart path with a leading / was taken")
	}
}
