package render_test

import (
	"slices"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	kubevirtv1 "kubevirt.io/api/core/v1"
	cdiv1beta1 "kubevirt.io/containerized-data-importer-api/pkg/apis/core/v1beta1"
)

// TestUpstreamCustomResources decodes the custom resources whose CRDs the
// platform installs itself (so no test API server serves them) strictly
// into their upstream Go types: a misspelt field fails here.
func TestUpstreamCustomResources(t *testing.T) {
	objs, err := mustRender(t, exampleRack(t, "prod")).Objects()
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, o := range objs {
		switch o.GetAPIVersion() + " " + o.GetKind() {
		case "kubevirt.io/v1 KubeVirt":
			kv := &kubevirtv1.KubeVirt{}
			strict(t, o, kv)
			gates := kv.Spec.Configuration.DeveloperConfiguration.FeatureGates
			for _, want := range []string{"DeclarativeHotplugVolumes", "Snapshot"} {
				if !slices.Contains(gates, want) {
					t.Errorf("KubeVirt feature gates %v lack %s", gates, want)
				}
			}
			seen["KubeVirt"] = true
		case "cdi.kubevirt.io/v1beta1 CDI":
			strict(t, o, &cdiv1beta1.CDI{})
			seen["CDI"] = true
		}
	}
	for _, k := range []string{"KubeVirt", "CDI"} {
		if !seen[k] {
			t.Errorf("no %s rendered", k)
		}
	}
}

// TestPiraeusTalosOverride: the satellite override for Talos has the
// form the Piraeus operator documents in docs/how-to/talos.md, a
// podTemplate (not the older patches list), removing what Talos lacks.
func TestPiraeusTalosOverride(t *testing.T) {
	objs, err := mustRender(t, exampleRack(t, "prod")).Objects()
	if err != nil {
		t.Fatal(err)
	}
	var talos map[string]any
	for _, o := range objs {
		if o.GetKind() != "HelmRelease" || o.GetName() != "linstor-cluster" {
			continue
		}
		confs, _, _ := unstructured.NestedSlice(o.Object, "spec", "values", "linstorSatelliteConfigurations")
		for _, c := range confs {
			if m, _ := c.(map[string]any); m["name"] == "talos" {
				talos = m
			}
		}
	}
	if talos == nil {
		t.Fatal("no linstorSatelliteConfigurations entry named talos")
	}
	if _, ok := talos["patches"]; ok {
		t.Error("the talos override uses patches; Piraeus documents podTemplate")
	}
	deleted := func(list string) []string {
		items, _, _ := unstructured.NestedSlice(talos, "podTemplate", "spec", list)
		var out []string
		for _, it := range items {
			if m, _ := it.(map[string]any); m["$patch"] == "delete" {
				out = append(out, m["name"].(string))
			}
		}
		return out
	}
	if got, want := deleted("initContainers"), []string{"drbd-shutdown-guard", "drbd-module-loader"}; !slices.Equal(got, want) {
		t.Errorf("init containers deleted: %v, want %v", got, want)
	}
	if got, want := deleted("volumes"), []string{"run-systemd-system", "run-drbd-shutdown-guard", "systemd-bus-socket", "lib-modules", "usr-src"}; !slices.Equal(got, want) {
		t.Errorf("volumes deleted: %v, want %v", got, want)
	}
}
