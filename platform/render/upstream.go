package render

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"cozy.dev/cozy/platform/upstream"
)

// Checked is one upstream HelmRelease of a layout rendered with its chart.
type Checked struct {
	// File is the layout file that holds the HelmRelease.
	File    string
	Release string
	Chart   upstream.Chart
	// Files are the chart's rendered templates, as Template gives them.
	Files map[string]string
}

// CheckCharts renders the upstream charts Cozy makes (platform/upstream)
// that the layout's HelmReleases install, with the values each
// HelmRelease gives, as helm-controller would: a render error, values the
// chart's schema refuses, or a key the chart does not define
// (upstream.UnknownValues) is an error naming the HelmRelease. Only the
// HelmReleases named in releases are checked, or all with nil; a chart
// Cozy cannot make is not checked.
func CheckCharts(ctx context.Context, l *Layout, maker upstream.ChartMaker, kubeVersion string, releases []string) ([]Checked, error) {
	objs, err := l.Objects()
	if err != nil {
		return nil, err
	}
	var out []Checked
	var problems []string
	for _, o := range objs {
		if o.GetKind() != "HelmRelease" || (releases != nil && !slices.Contains(releases, o.GetName())) {
			continue
		}
		kind, _, _ := unstructured.NestedString(o.Object, "spec", "chart", "spec", "sourceRef", "kind")
		name, _, _ := unstructured.NestedString(o.Object, "spec", "chart", "spec", "chart")
		version, _, _ := unstructured.NestedString(o.Object, "spec", "chart", "spec", "version")
		c, err := upstream.Find(name, version)
		if kind != "HelmRepository" || err != nil {
			continue
		}
		p, err := maker.Make(ctx, name, version)
		if err != nil {
			return nil, fmt.Errorf("HelmRelease %s: %w", o.GetName(), err)
		}
		release, ns, values, err := ReleaseInputs(o.Unstructured)
		if err != nil {
			return nil, fmt.Errorf("%s: HelmRelease %s: %w", o.File, o.GetName(), err)
		}
		fail := func(msg string) {
			problems = append(problems, fmt.Sprintf("%s: HelmRelease %s (chart %s): %s", o.File, o.GetName(), c.Ref(), msg))
		}
		for _, k := range upstream.UnknownValues(p.Chart, values) {
			fail("values key " + k + " is not one the chart defines")
		}
		files, err := Template(p.Chart, values, release, ns, kubeVersion)
		if err != nil {
			fail(err.Error())
			continue
		}
		out = append(out, Checked{File: o.File, Release: o.GetName(), Chart: c, Files: files})
	}
	if len(problems) > 0 {
		return out, fmt.Errorf("the upstream charts refuse the platform's values:\n- %s", strings.Join(problems, "\n- "))
	}
	return out, nil
}

// ReleaseInputs is what helm-controller installs a HelmRelease's chart
// with: the release name (spec.releaseName, else the HelmRelease's), the
// namespace (spec.targetNamespace, else the HelmRelease's) and the values.
// The values go through JSON: those built in Go (the operator's) hold
// typed maps, and Helm must see the plain form a cluster would give.
func ReleaseInputs(hr *unstructured.Unstructured) (release, namespace string, values map[string]any, err error) {
	release, _, _ = unstructured.NestedString(hr.Object, "spec", "releaseName")
	namespace, _, _ = unstructured.NestedString(hr.Object, "spec", "targetNamespace")
	values = map[string]any{}
	if v, ok, _ := unstructured.NestedFieldNoCopy(hr.Object, "spec", "values"); ok {
		data, err := json.Marshal(v)
		if err == nil {
			err = json.Unmarshal(data, &values)
		}
		if err != nil {
			return "", "", nil, fmt.Errorf("values: %w", err)
		}
	}
	return cmp.Or(release, hr.GetName()), cmp.Or(namespace, hr.GetNamespace()), values, nil
}
