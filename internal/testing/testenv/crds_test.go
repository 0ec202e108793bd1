package testenv

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/yaml"
)

const fixtureCRD = `apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: widgets.example.com
  labels: {upstream: kept}
spec:
  group: example.com
  names: {kind: Widget, plural: widgets}
  scope: Namespaced
  versions:
  - name: v1
    served: true
    storage: true
    schema: {openAPIV3Schema: {type: object}}
`

func TestReadKustomizedCRDs(t *testing.T) {
	tests := []struct {
		name       string
		files      map[string]string
		wantNames  []string
		wantLabels map[string]string
		wantErr    string
	}{
		{
			name: "labels from commonLabels and labels pairs are added",
			files: map[string]string{
				"kustomization.yaml": "resources: [a.yaml]\ncommonLabels: {x/v1beta1: v1alpha1}\nlabels:\n- pairs: {x/v1beta2: v1alpha2}\n",
				"a.yaml":             fixtureCRD,
			},
			wantNames:  []string{"widgets.example.com"},
			wantLabels: map[string]string{"upstream": "kept", "x/v1beta1": "v1alpha1", "x/v1beta2": "v1alpha2"},
		},
		{
			name: "several documents and empty ones",
			files: map[string]string{
				"kustomization.yaml": "resources: [a.yaml]\n",
				"a.yaml":             "---\n" + fixtureCRD + "---\n---\n" + strings.Replace(fixtureCRD, "widgets.example.com", "gadgets.example.com", 1),
			},
			wantNames:  []string{"widgets.example.com", "gadgets.example.com"},
			wantLabels: map[string]string{"upstream": "kept"},
		},
		{
			name:    "no kustomization",
			files:   map[string]string{"a.yaml": fixtureCRD},
			wantErr: "kustomization.yaml: no such file",
		},
		{
			name:    "no resources",
			files:   map[string]string{"kustomization.yaml": "patches: []\n"},
			wantErr: "lists no resources",
		},
		{
			name:    "missing resource",
			files:   map[string]string{"kustomization.yaml": "resources: [gone.yaml]\n"},
			wantErr: "gone.yaml: no such file",
		},
		{
			name: "not a CRD",
			files: map[string]string{
				"kustomization.yaml": "resources: [a.yaml]\n",
				"a.yaml":             "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n",
			},
			wantErr: `a.yaml: expected a CustomResourceDefinition, found ConfigMap "x"`,
		},
		{
			name: "broken YAML",
			files: map[string]string{
				"kustomization.yaml": "resources: [a.yaml]\n",
				"a.yaml":             "kind: [\n",
			},
			wantErr: "a.yaml:",
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			for name, content := range tc.files {
				if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			crds, err := readKustomizedCRDs(dir)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error = %v, want one containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var names []string
			for _, crd := range crds {
				names = append(names, crd.Name)
				for k, v := range tc.wantLabels {
					if crd.Labels[k] != v {
						t.Errorf("%s label %s = %q, want %q", crd.Name, k, crd.Labels[k], v)
					}
				}
				if len(crd.Labels) != len(tc.wantLabels) {
					t.Errorf("%s labels = %v, want %v", crd.Name, crd.Labels, tc.wantLabels)
				}
			}
			if strings.Join(names, ",") != strings.Join(tc.wantNames, ",") {
				t.Errorf("CRDs = %v, want %v", names, tc.wantNames)
			}
		})
	}
}

// The pinned upstream modules must yield the kinds Cozy uses, carrying the
// Cluster API contract labels that kustomize would have added.
func TestUpstreamCRDs(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	crds, err := LoadCRDs(ctx, UpstreamCRDs())
	if err != nil {
		t.Fatal(err)
	}
	byName := map[string]map[string]string{}
	for _, crd := range crds {
		byName[crd.Name] = crd.Labels
	}
	want := map[string]map[string]string{
		"clusters.cluster.x-k8s.io":                                {},
		"machinedeployments.cluster.x-k8s.io":                      {},
		"kubeadmconfigtemplates.bootstrap.cluster.x-k8s.io":        {"cluster.x-k8s.io/v1beta2": "v1beta2"},
		"kamajicontrolplanes.controlplane.cluster.x-k8s.io":        {"cluster.x-k8s.io/v1beta2": "v1alpha2"},
		"kubevirtclusters.infrastructure.cluster.x-k8s.io":         {"cluster.x-k8s.io/v1beta1": "v1alpha1"},
		"kubevirtmachinetemplates.infrastructure.cluster.x-k8s.io": {"cluster.x-k8s.io/v1beta1": "v1alpha1"},
		"helmreleases.helm.toolkit.fluxcd.io":                      {},
		"gitrepositories.source.toolkit.fluxcd.io":                 {},
		"kustomizations.kustomize.toolkit.fluxcd.io":               {},
	}
	for name, labels := range want {
		got, ok := byName[name]
		if !ok {
			t.Errorf("CRD %s not loaded", name)
			continue
		}
		for k, v := range labels {
			if got[k] != v {
				t.Errorf("CRD %s label %s = %q, want %q", name, k, got[k], v)
			}
		}
	}
}

func TestModuleDirUnknownModule(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, err := ModuleDir(ctx, "sigs.k8s.io/cluster-api", "v0.0.0-not-a-version")
	if err == nil || !strings.Contains(err.Error(), "go mod download sigs.k8s.io/cluster-api@v0.0.0-not-a-version") {
		t.Fatalf("error = %v, want one naming the module", err)
	}
}

// The platform's components' modules yield the CRDs of every kind the
// platform renders for them: MetalLB's and the Cluster API operator's
// from kustomize directories, KubeVirt's from a YAML file, CDI's from the
// string literals of a generated Go file.
func TestPlatformCRDs(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	crds, err := LoadCRDs(ctx, PlatformCRDs())
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]bool{}
	for _, crd := range crds {
		names[crd.Name] = true
	}
	for _, want := range []string{
		"ipaddresspools.metallb.io", "l2advertisements.metallb.io",
		"coreproviders.operator.cluster.x-k8s.io", "bootstrapproviders.operator.cluster.x-k8s.io",
		"controlplaneproviders.operator.cluster.x-k8s.io", "infrastructureproviders.operator.cluster.x-k8s.io",
		"kubevirts.kubevirt.io", "cdis.cdi.kubevirt.io",
		"volumesnapshotclasses.snapshot.storage.k8s.io", "volumesnapshots.snapshot.storage.k8s.io",
	} {
		if !names[want] {
			t.Errorf("no CRD %s among the %d loaded", want, len(crds))
		}
	}
}

// KubeVirt's VirtualMachine and VirtualMachineInstance CRDs, which
// virt-operator builds at run time, come out of its module whole: both
// API versions, each with the kind's schema, VirtualMachine's status a
// subresource and VirtualMachineInstance's not.
func TestKubeVirtVMCRDs(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	crds, err := KubeVirtVMCRDs(ctx)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]struct {
		field  string // a field of spec only this kind's schema has
		status bool
	}{
		"virtualmachines.kubevirt.io":         {"runStrategy", true},
		"virtualmachineinstances.kubevirt.io": {"domain", false},
	}
	if len(crds) != len(want) {
		t.Fatalf("%d CRDs, want %d", len(crds), len(want))
	}
	for _, crd := range crds {
		w, ok := want[crd.Name]
		if !ok {
			t.Errorf("unexpected CRD %s", crd.Name)
			continue
		}
		var versions []string
		for _, v := range crd.Spec.Versions {
			versions = append(versions, fmt.Sprintf("%s served=%t storage=%t", v.Name, v.Served, v.Storage))
			if v.Schema == nil || v.Schema.OpenAPIV3Schema == nil {
				t.Errorf("%s %s: no schema", crd.Name, v.Name)
				continue
			}
			if _, ok := v.Schema.OpenAPIV3Schema.Properties["spec"].Properties[w.field]; !ok {
				t.Errorf("%s %s: no spec.%s in its schema", crd.Name, v.Name, w.field)
			}
			if got := v.Subresources != nil && v.Subresources.Status != nil; got != w.status {
				t.Errorf("%s %s: status subresource %t, want %t", crd.Name, v.Name, got, w.status)
			}
		}
		if got := strings.Join(versions, ", "); got != "v1 served=true storage=true, v1alpha3 served=true storage=false" {
			t.Errorf("%s: versions %s", crd.Name, got)
		}
	}
}

// A validations file whose schema does not decode is an error naming the
// kind, not a CRD without validation.
func TestReadKubeVirtSchemasBroken(t *testing.T) {
	path := filepath.Join(t.TempDir(), "validations_generated.go")
	src := "package components\n\nvar CRDsValidation = map[string]string{\n\t\"virtualmachine\": `openAPIV3Schema:\n  type: [object`,\n}\n"
	if err := os.WriteFile(path, []byte(src), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := readKubeVirtSchemas(path); err == nil || !strings.Contains(err.Error(), "the schema of virtualmachine") {
		t.Fatalf("error = %v, want one naming virtualmachine", err)
	}
}

// TestPlatformCRDsMatchThePins: the CRDs the tests load are those of the
// versions the platform installs.
func TestPlatformCRDsMatchThePins(t *testing.T) {
	data, err := os.ReadFile("../../../charts/platform/values.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var values struct {
		Versions map[string]string `json:"versions"`
	}
	if err := yaml.Unmarshal(data, &values); err != nil {
		t.Fatal(err)
	}
	pins := map[string]string{
		"go.universe.tf/metallb":                  values.Versions["metallb"],
		"sigs.k8s.io/cluster-api-operator":        values.Versions["clusterAPIOperator"],
		"kubevirt.io/kubevirt":                    values.Versions["kubevirt"],
		"kubevirt.io/containerized-data-importer": values.Versions["cdi"],
		SnapshotterClientModule:                   values.Versions["snapshotController"],
	}
	for _, src := range PlatformCRDs() {
		if pin := pins[src.Module]; strings.TrimPrefix(src.Version, "v") != strings.TrimPrefix(pin, "v") {
			t.Errorf("%s: the tests load %s, the platform pins %q", src.Module, src.Version, pin)
		}
	}
}
