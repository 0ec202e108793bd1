package upgrade

import (
	"slices"
	"strings"
	"testing"

	"cozy.dev/cozy/bootstrap/rack"
)

func TestCheckStep(t *testing.T) {
	for _, tc := range []struct {
		kind, from, to, refused string
	}{
		{"Talos", "v1.13.0", "v1.13.1", ""},
		{"Talos", "v1.13.0", "v1.13.0", ""},
		{"Talos", "v1.13.4", "v1.14.0", ""},
		{"Talos", "v1.13.1", "v1.13.0", "it runs v1.13.1, newer than v1.13.0: Cozy does not downgrade"},
		{"Talos", "v1.13.0", "v1.15.0", "v1.13.0 to v1.15.0 skips a minor version: upgrade one minor at a time (v1.14 first)"},
		{"Talos", "v1.13.0", "v2.0.0", "skips a minor version"},
		{"Talos", "v1.13.0", "latest", `"latest" is not a Talos version`},
		{"Talos", "", "v1.13.0", `it runs Talos version ""`},
		{"Kubernetes", "v1.35.4", "v1.36.3", ""},
		{"Kubernetes", "v1.36.1", "v1.36.3", ""},
		{"Kubernetes", "v1.36.3", "v1.36.1", "it runs v1.36.3, newer than v1.36.1: Cozy does not downgrade"},
		{"Kubernetes", "v1.34.4", "v1.36.3", "v1.34.4 to v1.36.3 skips a minor version: upgrade one minor at a time (v1.35 first)"},
		{"Kubernetes", "latest", "v1.36.3", `it runs Kubernetes version "latest", which Cozy cannot compare with v1.36.3`},
	} {
		err := checkStep(tc.kind, tc.from, tc.to)
		switch {
		case tc.refused == "" && err != nil:
			t.Errorf("%s %s to %s refused: %v", tc.kind, tc.from, tc.to, err)
		case tc.refused != "" && (err == nil || !strings.Contains(err.Error(), tc.refused)):
			t.Errorf("%s %s to %s: %v, want %q", tc.kind, tc.from, tc.to, err, tc.refused)
		}
	}
}

func TestOrderIsControlPlanesFirst(t *testing.T) {
	r := &rack.Rack{Machines: []rack.Machine{
		{Hostname: "w1", Role: rack.RoleWorker}, {Hostname: "cp2", Role: rack.RoleControlPlane},
		{Hostname: "w2", Role: rack.RoleWorker}, {Hostname: "cp1", Role: rack.RoleControlPlane},
	}}
	for _, tc := range []struct {
		vipHolder string
		want      []string
	}{
		{"", []string{"cp2", "cp1", "w1", "w2"}},
		{"cp1", []string{"cp2", "cp1", "w1", "w2"}},
		{"cp2", []string{"cp1", "cp2", "w1", "w2"}},
		{"w1", []string{"cp2", "cp1", "w1", "w2"}}, // not a control plane: no VIP to move
		{"gone", []string{"cp2", "cp1", "w1", "w2"}},
	} {
		if got := order(r, tc.vipHolder); !slices.Equal(got, tc.want) {
			t.Errorf("order with the VIP on %q: %v, want %v: the control planes in rack order, the VIP's holder last, then the workers", tc.vipHolder, got, tc.want)
		}
	}
}
