package render_test

import (
	"slices"
	"testing"

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
			for _, want := range []string{"LiveMigration", "HotplugVolumes", "Snapshot"} {
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
