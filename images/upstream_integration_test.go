//go:build integration

package images

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"slices"
	"strings"
	"testing"

	"cozy.dev/cozy/internal/testing/testenv"
	"cozy.dev/cozy/platform/upstream"
)

// With the upstream charts made from their modules, the example rack's
// list gains every image those charts run with the platform's values, and
// only the charts no module carries stay in NotListed. The whole list is
// testdata/example-upstream.json (go test -tags integration -update).
func TestListRendersUpstreamCharts(t *testing.T) {
	ctx := context.Background()
	proxy, err := testenv.ModuleProxy(ctx, upstream.Modules()...)
	if err != nil {
		t.Fatal(err)
	}
	maker := upstream.Maker{Source: upstream.Source{Proxies: []string{proxy}, Cache: t.TempDir()}}
	l, err := ForRack(ctx, exampleRack(t, nil), maker)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"quay.io/jetstack/cert-manager-controller:v1.21.2",
		"quay.io/metallb/controller:v0.15.2",
		"registry.k8s.io/capi-operator/cluster-api-operator:v0.29.0",
		"docker.io/kubeovn/kube-ovn:v1.15.4",
	} {
		if !slices.ContainsFunc(l.Images, func(i Image) bool { return i.Ref == want }) {
			t.Errorf("the list lacks %s", want)
		}
	}
	for _, n := range l.NotListed {
		for _, made := range []string{"cilium 1.20.2", "cert-manager", "metallb", "kube-ovn", "cluster-api-operator 0.29.0", "tenant add-on cilium"} {
			if strings.Contains(n, made) {
				t.Errorf("NotListed names %q, whose chart Cozy makes", n)
			}
		}
	}
	got, err := json.MarshalIndent(l, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	got = append(got, '\n')
	const golden = "testdata/example-upstream.json"
	if *update {
		if err := os.WriteFile(golden, got, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatalf("%v (go test -tags integration -update)", err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("the list differs from %s (go test -tags integration -run TestListRendersUpstreamCharts -update, then review the diff):\n%s", golden, got)
	}
}
