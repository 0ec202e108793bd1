//go:build integration

package cli

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"helm.sh/helm/v3/pkg/chart/loader"
	helmregistry "helm.sh/helm/v3/pkg/registry"

	"cozy.dev/cozy/images"
	"cozy.dev/cozy/internal/testing/testenv"
	"cozy.dev/cozy/platform/upstream"
)

// images mirror --rack pushes, beside the images, every upstream chart
// Cozy makes for the rack's platform, under the path of its
// platform.mirror, where Helm's own OCI client pulls them; a second run
// finds them there. The modules come from the go command's download cache
// through --module-proxy file://, so nothing leaves the machine.
func TestImagesMirrorCharts(t *testing.T) {
	proxy, err := testenv.ModuleProxy(context.Background(), upstream.Modules()...)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	reg := serveRegistry(t, filepath.Join(dir, "registry"))
	ex, _, code := run("rack", "init")
	if code != 0 {
		t.Fatal("rack init failed")
	}
	ex = strings.Replace(ex, "  # mirror: http://10.0.0.1:5000/charts", "  mirror: http://"+reg.addr+"/cozy/charts", 1)
	rackFile := filepath.Join(dir, "rack.yaml")
	if err := os.WriteFile(rackFile, []byte(ex), 0o644); err != nil {
		t.Fatal(err)
	}

	out, stderr, code := run("images", "list", "--rack", rackFile, "-o", "json", "--module-proxy", proxy)
	var list []images.Image
	if code != 0 || json.Unmarshal([]byte(out), &list) != nil {
		t.Fatalf("images list: exit %d, %s\n%s", code, out, stderr)
	}
	// A random image cannot stand for one pinned by digest (Cilium's
	// envoy): those are left out of the layout, and must be the only
	// failures.
	var byTag []images.Image
	pinned := map[string]bool{}
	for _, img := range list {
		if strings.Contains(img.Ref, "@sha256:") {
			pinned[img.Ref] = true
		} else {
			byTag = append(byTag, img)
		}
	}
	lay := filepath.Join(dir, "layout")
	randomLayout(t, lay, byTag)

	mirror := func() []images.Result {
		t.Helper()
		out, stderr, _ := run("images", "mirror", "--rack", rackFile, "--from", lay, "--to", reg.addr, "--insecure", "--module-proxy", proxy, "-o", "json")
		var rs []images.Result
		if err := json.Unmarshal([]byte(out), &rs); err != nil {
			t.Fatalf("images mirror: %v\n%s\n%s", err, out, stderr)
		}
		var kept []images.Result
		for _, r := range rs {
			if pinned[r.Image] && r.Status == images.StatusFailed && strings.Contains(r.Error, "not found in OCI layout") {
				continue
			}
			kept = append(kept, r)
		}
		return kept
	}
	charts := map[string]images.Result{}
	for _, r := range mirror() {
		if r.Chart != "" {
			charts[r.Chart] = r
		} else if r.Status != images.StatusCopied {
			t.Errorf("image %s: %+v", r.Image, r)
		}
	}
	for _, want := range []string{"cilium 1.20.2", "cilium 1.18.4", "kube-ovn v1.15.4", "cert-manager v1.21.2", "metallb 0.15.2", "cluster-api-operator 0.29.0"} {
		r, ok := charts[want]
		name, version, _ := strings.Cut(want, " ")
		if target := reg.addr + "/cozy/charts/" + name + ":" + version; !ok || r.Status != images.StatusCopied || r.Target != target {
			t.Errorf("chart %s: %+v, want copied to %s", want, r, target)
		}
	}
	if len(charts) != 6 {
		t.Errorf("%d charts mirrored, want 6: %v", len(charts), charts)
	}

	hc, err := helmregistry.NewClient(helmregistry.ClientOptPlainHTTP(),
		helmregistry.ClientOptCredentialsFile(filepath.Join(dir, "helm-registry.json")))
	if err != nil {
		t.Fatal(err)
	}
	pulled, err := hc.Pull(reg.addr + "/cozy/charts/cert-manager:v1.21.2")
	if err != nil {
		t.Fatalf("helm pull cert-manager: %v", err)
	}
	ch, err := loader.LoadArchive(strings.NewReader(string(pulled.Chart.Data)))
	if err != nil || ch.Metadata.AppVersion != "v1.21.2" {
		t.Errorf("the pulled cert-manager chart: %v, appVersion %v", err, ch)
	}

	for _, r := range mirror() {
		if r.Status != images.StatusPresent {
			t.Errorf("second mirror: %+v, want present", r)
		}
	}
}

// platform render checks the values a rack gives a component's
// HelmRelease against the upstream chart before writing anything: a value
// the chart's schema refuses and a key the chart does not define are
// refused, naming them; good values are written; --module-proxy off skips
// the check with a warning.
func TestPlatformRenderChecksComponentValues(t *testing.T) {
	c, err := upstream.Find("cert-manager", "v1.21.2")
	if err != nil {
		t.Fatal(err)
	}
	proxy, err := testenv.ModuleProxy(context.Background(), c.Module)
	if err != nil {
		t.Fatal(err)
	}
	ex, _, code := run("rack", "init")
	if code != 0 {
		t.Fatal("rack init failed")
	}
	const line = "platform:                       # what the platform layer (Flux) reads\n"
	rackWith := func(values string) string {
		f := filepath.Join(t.TempDir(), "rack.yaml")
		body := strings.Replace(ex, line, "platform:\n  components:\n    cert-manager:\n      values:\n        cert-manager: "+values+"\n", 1)
		if err := os.WriteFile(f, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		return f
	}
	for _, tt := range []struct {
		name, values string
		code         int
		want         string
	}{
		{"the schema refuses it", `{replicaCount: "two"}`, 1, "at '/replicaCount': got string, want number"},
		{"a key the chart lacks", `{replicaCuont: 2}`, 1, "values key replicaCuont is not one the chart defines"},
		{"good values", `{replicaCount: 2}`, 0, ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			out := filepath.Join(t.TempDir(), "repo")
			_, stderr, code := run("platform", "render", "--rack", rackWith(tt.values), "--out", out, "--module-proxy", proxy)
			if code != tt.code || !strings.Contains(stderr, tt.want) {
				t.Fatalf("exit %d, want %d with %q:\n%s", code, tt.code, tt.want, stderr)
			}
			_, err := os.Stat(out)
			if wrote := err == nil; wrote != (tt.code == 0) {
				t.Errorf("exit %d, but the layout was written: %v", code, wrote)
			}
		})
	}
	_, stderr, code := run("platform", "render", "--rack", rackWith(`{replicaCuont: 2}`), "--out", filepath.Join(t.TempDir(), "repo"), "--module-proxy", "off")
	if code != 0 || !strings.Contains(stderr, "not checked against their charts") {
		t.Errorf("--module-proxy off: exit %d\n%s", code, stderr)
	}
}
