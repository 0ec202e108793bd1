package upstream

import (
	"slices"
	"testing"

	"helm.sh/helm/v3/pkg/chart"
	"helm.sh/helm/v3/pkg/chart/loader"
)

func TestUnknownValues(t *testing.T) {
	sub := &chart.Chart{
		Metadata: &chart.Metadata{APIVersion: "v2", Name: "sub", Version: "1.0.0"},
		Values:   map[string]any{"enabled": false, "port": 80},
	}
	c, err := loader.LoadFiles([]*loader.BufferedFile{
		{Name: "Chart.yaml", Data: []byte("apiVersion: v2\nname: top\nversion: 1.0.0\ndependencies:\n  - name: sub\n    version: 1.0.0\n    alias: helper\n")},
		{Name: "values.yaml", Data: []byte("image:\n  repository: x\n  tag: \"\"\nnodeSelector: {}\nextra: null\nlist: [a]\n")},
		{Name: "values.schema.json", Data: []byte(`{"properties": {
			"fromSchema": {"type": "string"},
			"typed": {"$ref": "#/$defs/typed"},
			"open": {"type": "object"}},
		  "$defs": {"typed": {"type": "object", "properties": {"known": {"type": "string"}}}}}`)},
		{Name: "templates/a.yaml", Data: []byte("{{ if hasKey .Values \"optional\" }}{{ .Values.optional }}{{ end }}{{ .Values.image.pullPolicy }}\n")},
	})
	if err != nil {
		t.Fatal(err)
	}
	c.AddDependency(sub)
	for _, tt := range []struct {
		name   string
		values map[string]any
		want   []string
	}{
		{"defaults", map[string]any{"image": map[string]any{"tag": "v1"}}, nil},
		{"misspelt", map[string]any{"imag": map[string]any{"tag": "v1"}}, []string{"imag"}},
		{"nested", map[string]any{"image": map[string]any{"tga": "v1"}}, []string{"image.tga"}},
		{"read by a template", map[string]any{"optional": 1, "image": map[string]any{"pullPolicy": "Always"}}, nil},
		{"free-form", map[string]any{"nodeSelector": map[string]any{"a": "b"}, "extra": map[string]any{"x": 1}}, nil},
		{"in the schema", map[string]any{"fromSchema": "x", "open": map[string]any{"any": 1}}, nil},
		{"in a referenced schema", map[string]any{"typed": map[string]any{"known": "a", "unknown": "b"}}, []string{"typed.unknown"}},
		{"a subchart by alias", map[string]any{"helper": map[string]any{"enabled": true, "prot": 1}}, []string{"helper.prot"}},
		{"global", map[string]any{"global": map[string]any{"anything": 1}}, nil},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if got := UnknownValues(c, tt.values); !slices.Equal(got, tt.want) {
				t.Errorf("got %v, want %v", got, tt.want)
			}
		})
	}
}
