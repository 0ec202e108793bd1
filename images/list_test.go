package images

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"os"
	"slices"
	"strings"
	"testing"

	"cozy.dev/cozy/bootstrap/rack"
	"cozy.dev/cozy/platform/render"
)

var update = flag.Bool("update", false, "rewrite the golden files")

func exampleRack(t *testing.T, edit func(string) string) *rack.Rack {
	t.Helper()
	data, err := rack.Example("lab")
	if err != nil {
		t.Fatal(err)
	}
	text := string(data)
	if edit != nil {
		text = edit(text)
	}
	r, err := rack.Parse([]byte(text), "example.yaml", t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// The example rack's list is exactly testdata/example.json (go test
// -update rewrites it; review the diff).
func TestListExampleGolden(t *testing.T) {
	l, err := ForRack(context.Background(), exampleRack(t, nil), nil)
	if err != nil {
		t.Fatal(err)
	}
	got, err := json.MarshalIndent(l, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	got = append(got, '\n')
	const golden = "testdata/example.json"
	if *update {
		if err := os.WriteFile(golden, got, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatalf("%v (go test -update)", err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("the example rack's list differs from %s (go test -update, then review the diff):\n%s", golden, got)
	}
}

// What the list holds follows what the rack renders.
func TestListFollowsTheRack(t *testing.T) {
	tests := []struct {
		name      string
		edit      func(string) string
		versions  []string          // --tenant-version
		want      map[string]string // image -> one of what needs it
		wantNot   []string
		notListed string
	}{
		{
			name: "example",
			want: map[string]string{
				"registry.k8s.io/pause:3.10.1":                                     "talos: pause (pod sandbox)",
				"registry.k8s.io/pause:3.10.2":                                     "tenant workers: pause (pod sandbox)",
				"registry.k8s.io/kas-network-proxy/proxy-agent:v0.34.0":            "tenant workers: konnectivity-agent",
				"registry.k8s.io/kas-network-proxy/proxy-server:v0.34.0":           "tenant control planes: konnectivity-server",
				"ghcr.io/siderolabs/kubelet:v" + rack.DefaultKubernetesVersion:     "talos: kubelet",
				"registry.k8s.io/kube-apiserver:v" + rack.DefaultKubernetesVersion: "talos: kube-apiserver",
				"registry.k8s.io/coredns/coredns:v1.14.2":                          "talos: coredns",
				"ghcr.io/cozy-dev/cozy-operator:0.1.0":                             "cozy-operator",
				"quay.io/kubevirt/kubevirt-cloud-controller-manager:v0.5.1":        "tenant add-on: kubevirt-ccm (kubevirt-cloud-controller-manager)",
				"registry.k8s.io/sig-storage/csi-node-driver-registrar:v2.15.0":    "tenant add-on: kubevirt-csi-node (csi-node-driver-registrar)",
			},
			// cozy-patch.yaml turns the CNI and kube-proxy off.
			wantNot:   []string{"ghcr.io/siderolabs/flannel:v0.28.4", "registry.k8s.io/kube-proxy:v" + rack.DefaultKubernetesVersion},
			notListed: "tenant add-on cilium: chart cilium",
		},
		{
			name: "flannel and kube-proxy through a rack patch",
			edit: func(s string) string {
				return strings.Replace(s, "          servers: [time.cloudflare.com]\n", "          servers: [time.cloudflare.com]\n      cluster:\n        network:\n          cni:\n            name: flannel\n        proxy:\n          disabled: false\n", 1)
			},
			want: map[string]string{
				"ghcr.io/siderolabs/flannel:v0.28.4":                           "talos: flannel",
				"registry.k8s.io/kube-proxy:v" + rack.DefaultKubernetesVersion: "talos: kube-proxy",
			},
		},
		{
			name: "the operator's image from platform.values",
			edit: func(s string) string {
				return strings.Replace(s, "platform:", "platform:\n  values:\n    cozyOperator:\n      image: {repository: registry.example.com/cozy/operator, tag: dev}", 1)
			},
			want:    map[string]string{"registry.example.com/cozy/operator:dev": "cozy-operator"},
			wantNot: []string{"ghcr.io/cozy-dev/cozy-operator:0.1.0"},
		},
		{
			name:      "no tenant versions named",
			wantNot:   []string{"registry.k8s.io/kube-scheduler:v1.35.4"},
			notListed: "tenant control planes: kube-apiserver, kube-controller-manager, kube-scheduler at each tenant's Kubernetes version",
		},
		{
			name:     "tenant versions named",
			versions: []string{"v1.35.4", "v1.36.3"},
			want: map[string]string{
				"registry.k8s.io/kube-apiserver:v1.35.4":          "tenant control planes v1.35.4: kube-apiserver",
				"registry.k8s.io/kube-controller-manager:v1.35.4": "tenant control planes v1.35.4: kube-controller-manager",
				"registry.k8s.io/kube-scheduler:v1.35.4":          "tenant control planes v1.35.4: kube-scheduler",
				"registry.k8s.io/kube-apiserver:v1.36.3":          "tenant control planes v1.36.3: kube-apiserver",
			},
			notListed: "tenant workers v1.36.3: cozy.dev/tenant-worker:v1.36.3 (Cozy's own: hack/worker-image.sh v1.36.3",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l, err := ForRack(context.Background(), exampleRack(t, tt.edit), nil, tt.versions...)
			if err != nil {
				t.Fatal(err)
			}
			byRef := map[string][]string{}
			for _, img := range l.Images {
				byRef[img.Ref] = img.NeededBy
			}
			for ref, by := range tt.want {
				if !slices.Contains(byRef[ref], by) {
					t.Errorf("%s: needed by %v, want %q among them", ref, byRef[ref], by)
				}
			}
			for _, ref := range tt.wantNot {
				if _, ok := byRef[ref]; ok {
					t.Errorf("%s is listed: %v", ref, byRef[ref])
				}
			}
			if !slices.IsSorted(l.Refs()) || len(slices.Compact(l.Refs())) != len(l.Images) {
				t.Errorf("not sorted and unique: %v", l.Refs())
			}
			if tt.notListed != "" && !slices.ContainsFunc(l.NotListed, func(s string) bool { return strings.HasPrefix(s, tt.notListed) }) {
				t.Errorf("notListed lacks %q: %v", tt.notListed, l.NotListed)
			}
		})
	}
}

// A tenant version no TenantCluster accepts is refused with the range.
func TestListRefusesUnsupportedTenantVersion(t *testing.T) {
	for _, v := range []string{"v1.30.2", "1.36.3", "v1.36"} {
		_, err := ForRack(context.Background(), exampleRack(t, nil), nil, "v1.36.3", v)
		if err == nil || !strings.Contains(err.Error(), "tenant version \""+v+"\"") || !strings.Contains(err.Error(), "v1.34.x to v1.37.x") {
			t.Errorf("%s: %v", v, err)
		}
	}
}

// Without a ChartMaker, no upstream chart is rendered: every upstream
// HelmRelease must then be named in NotListed (with its chart), so that no
// image, whether the chart's default or one Cozy's values set, is missed
// silently.
func TestUpstreamReleasesNotListedWithoutCharts(t *testing.T) {
	r := exampleRack(t, nil)
	l, err := render.Render(r)
	if err != nil {
		t.Fatal(err)
	}
	objs, err := l.Objects()
	if err != nil {
		t.Fatal(err)
	}
	list, err := ForRack(context.Background(), r, nil)
	if err != nil {
		t.Fatal(err)
	}
	own := ownCharts{name: "flux-system", namespace: "flux-system"}
	seen := 0
	for _, o := range objs {
		if o.GetKind() != "HelmRelease" {
			continue
		}
		if _, mine, _ := own.chart(o.Unstructured); mine {
			continue
		}
		seen++
		want := "platform " + o.GetLabels()["cozy.dev/component"] + ": chart "
		name := o.GetName()
		if !slices.ContainsFunc(list.NotListed, func(s string) bool {
			return strings.HasPrefix(s, want) && strings.Contains(s, name)
		}) {
			t.Errorf("%s: HelmRelease %s is neither rendered nor in NotListed: %v", o.File, name, list.NotListed)
		}
	}
	if seen < 5 {
		t.Errorf("only %d upstream HelmReleases seen; is the platform rendered?", seen)
	}
}
