// Package upstream makes the Helm charts of the platform's upstream
// components without their Helm repositories: each chart is cut from the
// Go module its project publishes on the module proxy, at the pinned
// version, checked against a pinned checksum, and packaged the way the
// project's own release does (`helm package --version --app-version`,
// plus the release's edits where it makes any). The archives are
// reproducible: the same module gives the same bytes, so a mirror holds
// one digest per pin.
//
// Charts that no module carries are listed in Unavailable with the
// reason; docs/images.md repeats them.
package upstream

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"golang.org/x/mod/module"
)

// Chart is one upstream chart at one version and where it comes from.
type Chart struct {
	// Name is the chart's name, as the platform's HelmReleases give it.
	Name string
	// Version is the chart version the platform pins (charts/platform
	// values.yaml, versions).
	Version string
	// Module is the Go module whose zip holds the chart.
	Module module.Version
	// Sum is the module zip's go.sum hash ("h1:…"). A zip with any other
	// content is refused, whatever the proxy serves.
	Sum string
	// Dir is the chart's folder inside the module.
	Dir string
	// AppVersion, when set, replaces the chart's appVersion, as the
	// release's `helm package --app-version` does.
	AppVersion string
	// Also lists other folders of the module the release step reads.
	Also []string
	// release runs the project's release edits on the extracted module
	// (root) before the chart in root/Dir is loaded.
	release func(root string) error
	// From says where the release steps were read, for the reader.
	From string
}

// Ref is "name version", for messages.
func (c Chart) Ref() string { return c.Name + " " + c.Version }

// Charts are the upstream charts Cozy can make, one entry per version.
var Charts = []Chart{
	{
		Name: "cilium", Version: "1.20.2",
		Module: module.Version{Path: "github.com/cilium/cilium", Version: "v1.20.2"},
		Sum:    "h1:dqiEGIcXc+gqCLYG/l7VCFJ8GHyb4HUrwbZOpkX5dL8=",
		Dir:    "install/kubernetes/cilium",
		From:   "the chart is released as it is in the tree (Chart.yaml already says 1.20.2)",
	},
	{
		Name: "cilium", Version: "1.18.4",
		Module: module.Version{Path: "github.com/cilium/cilium", Version: "v1.18.4"},
		Sum:    "h1:/HrbeMmk46UDkJs4uJemIqxB7wuZ+QRMNVscNYua5C8=",
		Dir:    "install/kubernetes/cilium",
		From:   "the chart is released as it is in the tree; the tenants' CNI (cozy-operator's add-on)",
	},
	{
		Name: "kube-ovn", Version: "v1.15.4",
		Module: module.Version{Path: "github.com/kubeovn/kube-ovn", Version: "v1.15.4"},
		Sum:    "h1:yBxMraUzNlX/q8Y7o+2PSY5+G7IEx2wgo3yusSnIAN8=",
		Dir:    "charts/kube-ovn",
		From:   "the chart is released as it is in the tree (Chart.yaml already says v1.15.4)",
	},
	{
		Name: "cert-manager", Version: "v1.21.2",
		Module:     module.Version{Path: "github.com/cert-manager/cert-manager", Version: "v1.21.2"},
		Sum:        "h1:UWgoYM+KLNtRlqmoWOKjKBOBUPVHeepQ6/ac3ERJW68=",
		Dir:        "deploy/charts/cert-manager",
		AppVersion: "v1.21.2",
		From:       "make/manifests.mk: helm package --app-version=$(VERSION) --version=$(VERSION); the images' tags default to appVersion",
	},
	{
		// One patch older: racks on it upgrade through the mirror.
		Name: "cert-manager", Version: "v1.21.1",
		Module:     module.Version{Path: "github.com/cert-manager/cert-manager", Version: "v1.21.1"},
		Sum:        "h1:0LttV37Q5c2CBNoHkjuI8sLKTXWZDC2SwQkxrBMKV9w=",
		Dir:        "deploy/charts/cert-manager",
		AppVersion: "v1.21.1",
		From:       "make/manifests.mk: helm package --app-version=$(VERSION) --version=$(VERSION); the images' tags default to appVersion",
	},
	{
		Name: "metallb", Version: "0.15.2",
		Module: module.Version{Path: "go.universe.tf/metallb", Version: "v0.15.2"},
		Sum:    "h1:r7KDgJtk3KZe3qb36zRVrVCYHxLR03nPGT+qFXOomJM=",
		Dir:    "charts/metallb",
		From:   "the chart is released as it is in the tree, its crds and frr-k8s subcharts included",
	},
	{
		Name: "cluster-api-operator", Version: "0.29.0",
		Module:     module.Version{Path: "sigs.k8s.io/cluster-api-operator", Version: "v0.29.0"},
		Sum:        "h1:i8j3auZqWlbiTiMnHqzyFlppHAfzZuqYYlBLDD3cNe4=",
		Dir:        "hack/charts/cluster-api-operator",
		AppVersion: "0.29.0",
		Also:       []string{"config"},
		release:    capiOperatorRelease("registry.k8s.io/capi-operator/cluster-api-operator", "v0.29.0"),
		From:       "Makefile release, chart-manifest-modification and release-chart: the image and pull policy in values.yaml, kustomize build config/chart into templates/operator-components.yaml, helm package --version/--app-version 0.29.0",
	},
}

// Unavailable are the platform's charts that no module on the proxy
// carries, and why.
var Unavailable = map[string]string{
	"kamaji": "github.com/clastix/kamaji is served by the module proxy at v1.0.0 (2024); the pseudo-versions of the 28 edge tags tried " +
		"(edge-25.9.2 to edge-26.2.5, 26.3.6-edge, 26.4.5-edge, 26.6.1-edge), the one the pinned Kamaji control-plane provider v0.20.0 " +
		"requires (v1.0.1-0.20260330073609-e51909fae3f5) among them, are refused (403); its kamaji-etcd subchart lives in " +
		"clastix/kamaji-etcd, which the proxy refuses too",
	"piraeus":         "github.com/piraeusdatastore/piraeus-operator/v2 is refused by the module proxy (403) at v2.4.1 to v2.9.1",
	"linstor-cluster": "it lives in piraeusdatastore/helm-charts, which is not a Go module",
}

// Modules are the modules of every chart in Charts, each once.
func Modules() []module.Version {
	var out []module.Version
	for _, c := range Charts {
		if !slices.Contains(out, c.Module) {
			out = append(out, c.Module)
		}
	}
	return out
}

// Find returns the chart name at version.
func Find(name, version string) (Chart, error) {
	var have []string
	for _, c := range Charts {
		if c.Name != name {
			continue
		}
		if c.Version == version {
			return c, nil
		}
		have = append(have, c.Version)
	}
	if why, ok := Unavailable[name]; ok {
		return Chart{}, fmt.Errorf("chart %s %s cannot be made here: %s", name, version, why)
	}
	if len(have) == 0 {
		return Chart{}, fmt.Errorf("chart %s: Cozy knows no module that carries it", name)
	}
	slices.Sort(have)
	return Chart{}, fmt.Errorf("chart %s %s: Cozy has no pinned module for that version (it has %s)", name, version, strings.Join(have, ", "))
}

// ChartMaker makes a chart by name and version; Maker is the one that
// fetches modules, tests may stand in.
type ChartMaker interface {
	Make(ctx context.Context, name, version string) (*Packaged, error)
}

// Maker makes charts by name and version, from Source.
type Maker struct{ Source Source }

// Make finds the chart, fetches its module and packages it.
func (m Maker) Make(ctx context.Context, name, version string) (*Packaged, error) {
	c, err := Find(name, version)
	if err != nil {
		return nil, err
	}
	zip, err := m.Source.Zip(ctx, c.Module, c.Sum)
	if err != nil {
		return nil, err
	}
	return c.Package(zip)
}
