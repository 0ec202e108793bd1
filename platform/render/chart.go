package render

import (
	"encoding/json"
	"fmt"
	"io/fs"
	"path"
	"regexp"
	"sort"
	"strings"

	"helm.sh/helm/v3/pkg/chart"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/engine"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"cozy.dev/cozy/bootstrap/rack"
	"cozy.dev/cozy/charts"
)

// LoadChart loads chart name (a folder of charts.FS) the way Helm loads a
// chart directory.
func LoadChart(name string) (*chart.Chart, error) {
	var files []*loader.BufferedFile
	err := fs.WalkDir(charts.FS, name, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		data, err := fs.ReadFile(charts.FS, p)
		if err != nil {
			return err
		}
		files = append(files, &loader.BufferedFile{Name: strings.TrimPrefix(p, name+"/"), Data: data})
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("read chart %s: %w", name, err)
	}
	if len(files) == 0 {
		return nil, fmt.Errorf("chart %s is not embedded", name)
	}
	c, err := loader.LoadFiles(files)
	if err != nil {
		return nil, fmt.Errorf("load chart %s: %w", name, err)
	}
	return c, nil
}

// Chart renders a chart with values over its defaults, as `helm template`
// would for a release named release in namespace, on Kubernetes
// kubeVersion (empty: the version a rack gets by default). The values are checked
// against the chart's values.schema.json first. The result maps each
// template's path below templates/ to its non-empty output.
func Chart(c *chart.Chart, values map[string]any, release, namespace, kubeVersion string) (map[string]string, error) {
	return renderChart(c, values, release, namespace, kubeVersion, true)
}

// Template renders an upstream chart as Chart does, but as `helm
// template` and helm-controller do: a value a template reads and nobody
// set is empty, not an error (Cozy's own charts are held to strict mode).
func Template(c *chart.Chart, values map[string]any, release, namespace, kubeVersion string) (map[string]string, error) {
	return renderChart(c, values, release, namespace, kubeVersion, false)
}

func renderChart(c *chart.Chart, values map[string]any, release, namespace, kubeVersion string, strict bool) (map[string]string, error) {
	caps := chartutil.DefaultCapabilities.Copy()
	if kubeVersion == "" {
		kubeVersion = rack.DefaultKubernetesVersion
	}
	kv, err := chartutil.ParseKubeVersion(kubeVersion)
	if err != nil {
		return nil, fmt.Errorf("kubernetes version %q: %w", kubeVersion, err)
	}
	caps.KubeVersion = *kv
	if want := c.Metadata.KubeVersion; want != "" && !chartutil.IsCompatibleRange(want, caps.KubeVersion.String()) {
		return nil, fmt.Errorf("chart %s needs Kubernetes %s, the cluster runs %s", c.Name(), want, caps.KubeVersion.String())
	}
	// As helm install does: subcharts whose condition or tags the values
	// turn off are dropped (metallb's frr-k8s), and import-values merged.
	// It edits the chart, so on a copy: callers reuse theirs.
	c = cloneChart(c)
	if err := chartutil.ProcessDependenciesWithMerge(c, values); err != nil {
		return nil, fmt.Errorf("chart %s dependencies: %w", c.Name(), err)
	}
	vals, err := chartutil.CoalesceValues(c, values)
	if err != nil {
		return nil, fmt.Errorf("chart %s values: %w", c.Name(), err)
	}
	if err := chartutil.ValidateAgainstSchema(c, vals); err != nil {
		details := strings.TrimSpace(strings.TrimPrefix(err.Error(), c.Name()+":\n"))
		return nil, &SchemaError{Chart: c.Name(), Details: humanize(details, c.Schema)}
	}
	top, err := chartutil.ToRenderValuesWithSchemaValidation(c, vals,
		chartutil.ReleaseOptions{Name: release, Namespace: namespace, IsInstall: true, Revision: 1}, caps, true)
	if err != nil {
		return nil, fmt.Errorf("chart %s values: %w", c.Name(), err)
	}
	out, err := engine.Engine{Strict: strict}.Render(c, top)
	if err != nil {
		return nil, fmt.Errorf("render chart %s: %w", c.Name(), err)
	}
	// A subchart's templates are keyed charts/<sub>/templates/<file>.
	prefix := c.Name() + "/templates/"
	files := map[string]string{}
	for name, text := range out {
		rel, ok := strings.CutPrefix(name, prefix)
		if !ok {
			rel = strings.TrimPrefix(name, c.Name()+"/")
			ok = strings.HasPrefix(rel, "charts/") && strings.Contains(rel, "/templates/")
		}
		if !ok || strings.TrimSpace(text) == "" || path.Base(rel) == "NOTES.txt" {
			continue // partials, NOTES.txt, disabled templates
		}
		files[rel] = text
	}
	return files, nil
}

// Operator renders the cozy-operator chart as the platform installs it:
// release cozy-operator in the cozy-system namespace. Files are keyed by
// their path under templates/.
func Operator(values map[string]any) (map[string]string, error) {
	c, err := LoadChart(charts.CozyOperator)
	if err != nil {
		return nil, err
	}
	return Chart(c, values, "cozy-operator", "cozy-system", "")
}

// OperatorTemplate renders the cozy-operator chart as Operator does and
// decodes the objects of one of its templates (a path under templates/).
func OperatorTemplate(values map[string]any, file string) ([]*unstructured.Unstructured, error) {
	files, err := Operator(values)
	if err != nil {
		return nil, err
	}
	data, ok := files[file]
	if !ok {
		return nil, fmt.Errorf("the cozy-operator chart has no template %s", file)
	}
	return Decode([]byte(data))
}

// SchemaError is values that the chart's values.schema.json rejects.
type SchemaError struct {
	Chart string
	// Details lists each violation: the value's path and what is wrong.
	Details string
}

func (e *SchemaError) Error() string {
	return fmt.Sprintf("values for chart %s do not match its values.schema.json:\n%s", e.Chart, e.Details)
}

// sortedKeys returns m's keys in order, for deterministic output.
func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

var patternMismatch = regexp.MustCompile(`does not match pattern '((?:[^']|'')*)'`)

// humanize replaces the regular expressions in schema messages with the
// description the schema gives next to each pattern ("is not an IPv4 CIDR
// such as 10.244.0.0/16"), so a person reads what was expected.
func humanize(details string, schema []byte) string {
	described := map[string]string{}
	var walk func(v any)
	walk = func(v any) {
		switch v := v.(type) {
		case map[string]any:
			p, _ := v["pattern"].(string)
			d, _ := v["description"].(string)
			if p != "" && d != "" {
				described[p] = d
			}
			for _, k := range sortedKeys(v) {
				walk(v[k])
			}
		case []any:
			for _, e := range v {
				walk(e)
			}
		}
	}
	var doc any
	if json.Unmarshal(schema, &doc) != nil {
		return details
	}
	walk(doc)
	return patternMismatch.ReplaceAllStringFunc(details, func(m string) string {
		// The validator prints the pattern as Go quotes it in JSON.
		re := patternMismatch.FindStringSubmatch(m)[1]
		for p, d := range described {
			if q, _ := json.Marshal(p); re == p || re == strings.Trim(string(q), `"`) {
				return "is not " + d
			}
		}
		return m
	})
}

// cloneChart copies what ProcessDependencies edits: the chart, its
// metadata's dependency list, and its subcharts, recursively. Templates,
// files and values are shared, unchanged.
func cloneChart(c *chart.Chart) *chart.Chart {
	cp := *c
	if c.Metadata != nil {
		md := *c.Metadata
		md.Dependencies = nil
		for _, d := range c.Metadata.Dependencies {
			dc := *d
			md.Dependencies = append(md.Dependencies, &dc)
		}
		cp.Metadata = &md
	}
	var subs []*chart.Chart
	for _, d := range c.Dependencies() {
		subs = append(subs, cloneChart(d))
	}
	cp.SetDependencies(subs...)
	return &cp
}
