package upstream

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	yaml "go.yaml.in/yaml/v3"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/api/types"
	"sigs.k8s.io/kustomize/kyaml/filesys"
)

// capiOperatorRelease does what the Cluster API operator's Makefile
// (release: chart-manifest-modification, release-chart) does to its chart
// before `helm package`: point values.yaml at the released image, pull it
// IfNotPresent, and render config/chart with kustomize into the chart's
// templates.
func capiOperatorRelease(image, tag string) func(root string) error {
	return func(root string) error {
		chart := filepath.Join(root, "hack", "charts", "cluster-api-operator")
		err := editYAML(filepath.Join(chart, "values.yaml"), map[string]string{
			"image.manager.repository": image,
			"image.manager.tag":        tag,
			"image.manager.pullPolicy": "IfNotPresent",
		})
		if err != nil {
			return err
		}
		opts := krusty.MakeDefaultOptions()
		opts.LoadRestrictions = types.LoadRestrictionsRootOnly
		m, err := krusty.MakeKustomizer(opts).Run(filesys.MakeFsOnDisk(), filepath.Join(root, "config", "chart"))
		if err != nil {
			return fmt.Errorf("kustomize build config/chart: %w", err)
		}
		out, err := m.AsYaml()
		if err != nil {
			return err
		}
		return os.WriteFile(filepath.Join(chart, "templates", "operator-components.yaml"), out, 0o644)
	}
}

// editYAML sets scalar values at dotted paths of a YAML file, keeping its
// comments and order (what `yq eval -i '.a.b = "v"'` does).
func editYAML(file string, set map[string]string) error {
	data, err := os.ReadFile(file)
	if err != nil {
		return err
	}
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		return fmt.Errorf("%s: %w", file, err)
	}
	for p, v := range set {
		n := lookup(&doc, p)
		if n == nil || n.Kind != yaml.ScalarNode {
			return fmt.Errorf("%s: no value at %s to set", file, p)
		}
		n.Value, n.Tag, n.Style = v, "!!str", yaml.DoubleQuotedStyle
	}
	out, err := yaml.Marshal(&doc)
	if err != nil {
		return err
	}
	return os.WriteFile(file, out, 0o644)
}

// lookup finds the node at a dotted path of mapping keys.
func lookup(doc *yaml.Node, dotted string) *yaml.Node {
	n := doc
	if n.Kind == yaml.DocumentNode && len(n.Content) > 0 {
		n = n.Content[0]
	}
	for _, key := range strings.Split(dotted, ".") {
		if n.Kind != yaml.MappingNode {
			return nil
		}
		var next *yaml.Node
		for j := 0; j+1 < len(n.Content); j += 2 {
			if n.Content[j].Value == key {
				next = n.Content[j+1]
			}
		}
		if next == nil {
			return nil
		}
		n = next
	}
	return n
}
