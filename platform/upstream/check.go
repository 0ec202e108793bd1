package upstream

import (
	"encoding/json"
	"maps"
	"slices"
	"strings"

	"helm.sh/helm/v3/pkg/chart"
)

// UnknownValues lists the paths of values (dotted, "a.b.c") that chart
// c does not define: not in its values.yaml, not in its values.schema.json
// and not a subchart's. Helm passes such keys on silently, so a renamed or
// misspelt key would change nothing. Below a key whose default is an empty
// map or null (nodeSelector: {}, podAnnotations: {}), any key is the
// chart's to accept.
func UnknownValues(c *chart.Chart, values map[string]any) []string {
	var schema map[string]any
	_ = json.Unmarshal(c.Schema, &schema)
	var out []string
	unknown(c, values, c.Values, schema, schema, "", &out)
	slices.Sort(out)
	return out
}

func unknown(c *chart.Chart, values, defaults, root, schema map[string]any, prefix string, out *[]string) {
	for _, k := range slices.Sorted(maps.Keys(values)) {
		p := strings.TrimPrefix(prefix+"."+k, ".")
		if prefix == "" && k == "global" {
			continue // Helm's shared values: every chart and subchart reads them
		}
		if prefix == "" {
			if sub := subchart(c, k); sub != nil {
				if m, ok := values[k].(map[string]any); ok {
					var s map[string]any
					_ = json.Unmarshal(sub.Schema, &s)
					unknown(sub, m, mergeDefaults(sub.Values, c.Values[k]), s, s, p, out)
				}
				continue
			}
		}
		def, inDefaults := defaults[k]
		prop, inSchema := schemaProperty(root, schema, k)
		if !inDefaults && !inSchema {
			if !readByTemplates(c, k) {
				*out = append(*out, p)
			}
			continue
		}
		m, isMap := values[k].(map[string]any)
		if !isMap {
			continue
		}
		dm, _ := def.(map[string]any)
		if inDefaults && len(dm) == 0 && !inSchema {
			continue // free-form: {} or null by default
		}
		if inSchema && len(dm) == 0 {
			if _, has := prop["properties"]; !has {
				continue // the schema leaves it open
			}
		}
		unknown(c, m, dm, root, prop, p, out)
	}
}

// subchart is c's dependency named (or aliased) name.
func subchart(c *chart.Chart, name string) *chart.Chart {
	for _, d := range c.Dependencies() {
		if d.Name() == name {
			return d
		}
	}
	if c.Metadata != nil {
		for _, d := range c.Metadata.Dependencies {
			if d.Alias == name {
				for _, s := range c.Dependencies() {
					if s.Name() == d.Name {
						return s
					}
				}
			}
		}
	}
	return nil
}

// mergeDefaults is a subchart's defaults with the parent's values for it
// over them (keys the parent adds count as defined).
func mergeDefaults(sub map[string]any, parent any) map[string]any {
	out := maps.Clone(sub)
	if out == nil {
		out = map[string]any{}
	}
	if p, ok := parent.(map[string]any); ok {
		maps.Copy(out, p)
	}
	return out
}

// schemaProperty is the JSON schema of property k of an object schema,
// following local references ("$ref": "#/$defs/x") into root.
func schemaProperty(root, schema map[string]any, k string) (map[string]any, bool) {
	props, _ := deref(root, schema)["properties"].(map[string]any)
	p, ok := props[k].(map[string]any)
	return deref(root, p), ok
}

func deref(root, s map[string]any) map[string]any {
	for range 10 { // a reference to a reference, not a loop
		ref, _ := s["$ref"].(string)
		path, ok := strings.CutPrefix(ref, "#/")
		if !ok {
			return s
		}
		var cur any = root
		for _, part := range strings.Split(path, "/") {
			m, _ := cur.(map[string]any)
			cur = m[part]
		}
		next, ok := cur.(map[string]any)
		if !ok {
			return s
		}
		s = next
	}
	return s
}

// readByTemplates says whether a template of c names key: as a field
// (.key) or as a string ("key", as hasKey and index take it).
func readByTemplates(c *chart.Chart, key string) bool {
	for _, t := range c.Templates {
		text := string(t.Data)
		if strings.Contains(text, `"`+key+`"`) {
			return true
		}
		for i := strings.Index(text, "."+key); i >= 0; {
			end := i + 1 + len(key)
			if end == len(text) || !isIdent(text[end]) {
				return true
			}
			next := strings.Index(text[end:], "."+key)
			if next < 0 {
				break
			}
			i = end + next
		}
	}
	return false
}

func isIdent(b byte) bool {
	return b == '_' || b >= '0' && b <= '9' || b >= 'a' && b <= 'z' || b >= 'A' && b <= 'Z'
}
