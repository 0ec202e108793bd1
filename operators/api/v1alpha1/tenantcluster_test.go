package v1alpha1

import (
	"os"
	"path/filepath"
	"regexp"
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

// CheckVersion accepts exactly what the CRD's version rule accepts: the
// rule's own regular expression (CEL's matches is RE2, as Go's regexp)
// against a table of versions.
func TestCheckVersionMatchesCRD(t *testing.T) {
	var rule string
	for _, r := range loadCRD(t).Spec.Versions[0].Schema.OpenAPIV3Schema.Properties["spec"].Properties["version"].XValidations {
		if strings.Contains(r.Message, "supported Kubernetes release") {
			rule = r.Rule
		}
	}
	expr, ok := strings.CutPrefix(rule, "self.matches('")
	expr, ok2 := strings.CutSuffix(expr, "')")
	if !ok || !ok2 {
		t.Fatalf("the version rule %q is not self.matches('...')", rule)
	}
	re := regexp.MustCompile(strings.ReplaceAll(expr, `\\`, `\`))
	for _, v := range []string{"v1.34.0", "v1.36.3", "v1.37.99", "v1.33.9", "v1.38.0", "v1.36.03", "v1.36.100", "v1.36", "1.36.3",
		"v1.36.3-rc.1", "v11.36.3", "v1.3.6", "v1.36.", "v1.36.x", "", "v1..3", "v1.036.3"} {
		if got, want := CheckVersion(v) == nil, re.MatchString(v); got != want {
			t.Errorf("CheckVersion(%q) accepts: %t, the CRD rule: %t", v, got, want)
		}
	}
	if err := CheckVersion("v1.30.1"); err == nil || !strings.Contains(err.Error(), "v1.34.x to v1.37.x") {
		t.Errorf("CheckVersion(v1.30.1) = %v, want the supported range", err)
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
