package render_test

import (
	"slices"
	"strings"
	"testing"

	"cozy.dev/cozy/platform/render"
)

// A chart's rendered templates decode in the order of their paths, and a
// template that is not YAML objects is named in the error.
func TestDecodeChart(t *testing.T) {
	objs, err := render.DecodeChart(map[string]string{
		"templates/service.yaml":    "apiVersion: v1\nkind: Service\nmetadata: {name: b}\n",
		"templates/deployment.yaml": "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: a}\n---\napiVersion: v1\nkind: ConfigMap\nmetadata: {name: c}\n",
	})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, o := range objs {
		got = append(got, o.GetKind()+"/"+o.GetName())
	}
	if want := []string{"Deployment/a", "ConfigMap/c", "Service/b"}; !slices.Equal(got, want) {
		t.Errorf("objects %v, want %v", got, want)
	}
	_, err = render.DecodeChart(map[string]string{"templates/broken.yaml": "metadata: {name: x}\n"})
	if err == nil || !strings.HasPrefix(err.Error(), "templates/broken.yaml: ") {
		t.Errorf("a document without kind: %v, want an error naming templates/broken.yaml", err)
	}
}
