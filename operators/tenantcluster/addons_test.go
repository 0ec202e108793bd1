package tenantcluster

import (
	"strings"
	"testing"
)

func TestParseChartRef(t *testing.T) {
	for _, tt := range []struct {
		in, addon, want, err string
	}{
		{in: "cilium=HelmRepository/cozy-addons/cilium/cilium@1.18.4", addon: "cilium", want: "HelmRepository/cozy-addons/cilium/cilium@1.18.4"},
		{in: "metrics-server=HelmRepository/mirror/charts/metrics-server@>=3.12.0 <4", addon: "metrics-server", want: "HelmRepository/mirror/charts/metrics-server@>=3.12.0 <4"},
		{in: "metrics-server=HelmRepository/mirror/charts/metrics server", err: "want a name or a folder"},
		{in: "metrics-server=HelmRepository/mirror/charts/metrics-server@~3.13", addon: "metrics-server", want: "HelmRepository/mirror/charts/metrics-server@~3.13"},
		{in: "kubevirt-csi-node=GitRepository/flux-system/flux-system/./charts/kubevirt-csi-node", addon: "kubevirt-csi-node", want: "GitRepository/flux-system/flux-system/./charts/kubevirt-csi-node"},
		{in: "kubevirt-csi-node=Bucket/cozy/charts/csi/node", addon: "kubevirt-csi-node", want: "Bucket/cozy/charts/csi/node"},
		{in: "cilium", err: "want ADDON=KIND/NAMESPACE/NAME/CHART"},
		{in: "calico=HelmRepository/a/b/calico", err: "ADDON one of cilium, kubevirt-csi-node, metrics-server"},
		{in: "cilium=HelmRepository/cozy-addons/cilium", err: "want KIND/NAMESPACE/NAME/CHART"},
		{in: "cilium=OCIRepository/cozy-addons/cilium/cilium", err: "want HelmRepository, GitRepository or Bucket"},
		{in: "cilium=HelmRepository/Cozy_Addons/cilium/cilium", err: `source namespace "Cozy_Addons"`},
		{in: "cilium=HelmRepository/cozy-addons//cilium", err: `source name ""`},
		{in: "cilium=HelmRepository/cozy-addons/cilium/@1.0", err: `chart ""`},
		{in: "cilium=HelmRepository/cozy-addons/cilium/cilium@", err: "empty version"},
		{in: "cilium=HelmRepository/cozy-addons/cilium/charts/cilium", err: "a HelmRepository chart is a name"},
	} {
		addon, ref, err := ParseChartRef(tt.in)
		if tt.err != "" {
			if err == nil || !strings.Contains(err.Error(), tt.err) {
				t.Errorf("ParseChartRef(%q) = %v, want an error saying %q", tt.in, err, tt.err)
			}
			continue
		}
		if err != nil || addon != tt.addon || ref.String() != tt.want {
			t.Errorf("ParseChartRef(%q) = %s %s %v, want %s %s", tt.in, addon, ref, err, tt.addon, tt.want)
		}
	}
}

// FuzzParseChartRef: any flag value is refused or read into a reference
// that prints back as it was given.
func FuzzParseChartRef(f *testing.F) {
	for _, ref := range DefaultAddonConfig().Charts {
		f.Add("cilium=" + ref.String())
	}
	f.Add("metrics-server=HelmRepository/a/b/c@@1")
	f.Add("cilium=HelmRepository/a/b/c/d/e")
	f.Fuzz(func(t *testing.T, s string) {
		addon, ref, err := ParseChartRef(s)
		if err != nil {
			return
		}
		if got := addon + "=" + ref.String(); got != s {
			t.Fatalf("ParseChartRef(%q) prints back as %q", s, got)
		}
		again, ref2, err := ParseChartRef(addon + "=" + ref.String())
		if err != nil || again != addon || ref2 != ref {
			t.Fatalf("round trip of %q: %s %+v %v", s, again, ref2, err)
		}
	})
}
