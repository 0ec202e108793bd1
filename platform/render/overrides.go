package render

import (
	"bytes"
	"encoding/json"
	"fmt"
	"path"
	"slices"
	"strings"

	yaml "go.yaml.in/yaml/v3"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// applyOverrides merges each component's values (comps, the chart's
// components section: components.<component>.values.<HelmRelease>: {...})
// over the values the platform gives that HelmRelease, in the rendered
// files, and returns the HelmReleases it merged into. Only the
// HelmRelease's document is re-encoded; its comments are kept.
func applyOverrides(comps map[string]any, files map[string]string) ([]string, error) {
	var merged, problems []string
	for _, comp := range sortedKeys(comps) {
		overrides, _, _ := unstructured.NestedMap(comps, comp, "values")
		for _, release := range sortedKeys(overrides) {
			o, ok := overrides[release].(map[string]any)
			if !ok {
				problems = append(problems, fmt.Sprintf("components.%s.values.%s: not a map of values", comp, release))
				continue
			}
			if err := override(files, comp, release, o); err != nil {
				problems = append(problems, fmt.Sprintf("components.%s.values.%s: %v", comp, release, err))
				continue
			}
			merged = append(merged, release)
		}
	}
	if len(problems) > 0 {
		return nil, fmt.Errorf("platform components:\n- %s", strings.Join(problems, "\n- "))
	}
	return merged, nil
}

// override merges o into the values of HelmRelease release in the files
// of component comp.
func override(files map[string]string, comp, release string, o map[string]any) error {
	var releases []string
	for _, f := range sortedKeys(files) {
		if path.Dir(f) != "components/"+comp {
			continue
		}
		docs := strings.Split(files[f], "\n---\n")
		for i, doc := range docs {
			var n yaml.Node
			if err := yaml.Unmarshal([]byte(doc), &n); err != nil || len(n.Content) == 0 {
				continue
			}
			top := n.Content[0]
			if value(top, "kind") == nil || value(top, "kind").Value != "HelmRelease" {
				continue
			}
			name := value(value(top, "metadata"), "name")
			if name == nil {
				continue
			}
			releases = append(releases, name.Value)
			if name.Value != release {
				continue
			}
			// Through JSON: numbers the rack decoded as json.Number
			// must encode as numbers, not strings.
			var plain any
			data, err := json.Marshal(o)
			if err == nil {
				err = json.Unmarshal(data, &plain)
			}
			var add yaml.Node
			if err == nil {
				err = add.Encode(plain)
			}
			if err != nil {
				return err
			}
			spec := value(top, "spec")
			if vals := value(spec, "values"); vals != nil {
				merge(vals, &add)
			} else {
				spec.Content = append(spec.Content, &yaml.Node{Kind: yaml.ScalarNode, Value: "values"}, &add)
			}
			var buf bytes.Buffer
			enc := yaml.NewEncoder(&buf)
			enc.SetIndent(2)
			if err := enc.Encode(&n); err != nil {
				return err
			}
			docs[i] = strings.TrimRight(buf.String(), "\n")
			files[f] = strings.Join(docs, "\n---\n")
			return nil
		}
	}
	if len(releases) == 0 {
		return fmt.Errorf("component %s installs no HelmRelease", comp)
	}
	slices.Sort(releases)
	return fmt.Errorf("component %s has no HelmRelease %s (it has %s)", comp, release, strings.Join(releases, ", "))
}

// value is the value node of key in mapping node m, or nil.
func value(m *yaml.Node, key string) *yaml.Node {
	if m == nil || m.Kind != yaml.MappingNode {
		return nil
	}
	for i := 0; i+1 < len(m.Content); i += 2 {
		if m.Content[i].Value == key {
			return m.Content[i+1]
		}
	}
	return nil
}

// merge sets every key of mapping add in mapping dst: maps merge key by
// key, anything else replaces (a list is replaced whole, as Helm merges
// values).
func merge(dst, add *yaml.Node) {
	for i := 0; i+1 < len(add.Content); i += 2 {
		k, v := add.Content[i], add.Content[i+1]
		old := value(dst, k.Value)
		switch {
		case old == nil:
			dst.Content = append(dst.Content, k, v)
		case old.Kind == yaml.MappingNode && v.Kind == yaml.MappingNode:
			merge(old, v)
		default:
			*old = *v
		}
	}
}
