package v1alpha1

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/yaml"
)

func loadCRD(t *testing.T) *apiextensionsv1.CustomResourceDefinition {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("..", "..", "..", "charts", "cozy-operator", "crds", "tenancy.cozy.dev_tenantclusters.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var crd apiextensionsv1.CustomResourceDefinition
	if err := yaml.UnmarshalStrict(data, &crd); err != nil {
		t.Fatal(err)
	}
	return &crd
}

// The version rule in the CRD and SupportedVersions list the same minors.
func TestSupportedVersionsMatchCRD(t *testing.T) {
	crd := loadCRD(t)
	rules := crd.Spec.Versions[0].Schema.OpenAPIV3Schema.Properties["spec"].Properties["version"].XValidations
	var rule string
	for _, r := range rules {
		if strings.Contains(r.Message, "supported Kubernetes release") {
			rule = r.Rule
		}
	}
	if rule == "" {
		t.Fatal("no supported-release rule on spec.version")
	}
	for _, v := range SupportedVersions {
		minor := strings.TrimPrefix(v, "v1.")
		if !strings.Contains(rule, minor) {
			t.Errorf("SupportedVersions has %s, the CRD rule %q does not", v, rule)
		}
	}
	first, last := SupportedVersions[0], SupportedVersions[len(SupportedVersions)-1]
	for _, r := range rules {
		if strings.Contains(r.Message, "supported Kubernetes release") && !strings.Contains(r.Message, first+".x to "+last+".x") {
			t.Errorf("message %q does not name %s.x to %s.x", r.Message, first, last)
		}
	}
}

func TestPrinterColumns(t *testing.T) {
	var names []string
	for _, c := range loadCRD(t).Spec.Versions[0].AdditionalPrinterColumns {
		names = append(names, c.Name)
	}
	if got := strings.Join(names, ","); got != "Version,Phase,Workers,Endpoint,Age" {
		t.Errorf("printer columns %s", got)
	}
}

func TestAddonIsEnabled(t *testing.T) {
	for _, tt := range []struct {
		a    Addon
		want bool
	}{{Addon{}, true}, {Addon{Enabled: ptr.To(true)}, true}, {Addon{Enabled: ptr.To(false)}, false}} {
		if got := tt.a.IsEnabled(); got != tt.want {
			t.Errorf("%+v: IsEnabled = %v", tt.a, got)
		}
	}
}
