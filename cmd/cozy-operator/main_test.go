package main

import (
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"cozy.dev/cozy/platform/render"
)

// chartArgs renders the cozy-operator chart with values and returns the
// manager container's arguments.
func chartArgs(t *testing.T, values map[string]any) []string {
	t.Helper()
	docs, err := render.OperatorTemplate(values, "deployment.yaml")
	if err != nil || len(docs) != 1 {
		t.Fatalf("deployment.yaml: %v (%d documents)", err, len(docs))
	}
	var d appsv1.Deployment
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(docs[0].Object, &d); err != nil {
		t.Fatal(err)
	}
	return d.Spec.Template.Spec.Containers[0].Args
}

// TestChartArgsParse: what the chart passes is what the binary takes.
func TestChartArgsParse(t *testing.T) {
	o, err := parse(chartArgs(t, nil))
	if err != nil {
		t.Fatalf("the chart's default arguments: %v", err)
	}
	if !o.leaderElect || o.leaderNS != "cozy-system" || o.metricsAddr != ":8443" || !o.metricsSecure || o.probeAddr != ":8081" {
		t.Errorf("defaults parsed as %+v", o)
	}
	if src := o.addons.ChartSource; src.Namespace != "cozy-system" || src.Name != "cozy-addons" {
		t.Errorf("add-on chart source %+v", src)
	}

	o, err = parse(chartArgs(t, map[string]any{
		"logLevel": "debug",
		"addons": map[string]any{
			"chartSource": "mirror/addons",
			"images":      map[string]any{"clusterAutoscaler": "registry.example.com/ca:v1", "kubevirtCSIDriver": "registry.example.com/csi:v2"},
		},
	}))
	if err != nil {
		t.Fatal(err)
	}
	want := []string{o.addons.ChartSource.Namespace + "/" + o.addons.ChartSource.Name, o.addons.ClusterAutoscalerImage, o.addons.CSIDriverImage, o.logLevel.String()}
	if got := strings.Join(want, " "); got != "mirror/addons registry.example.com/ca:v1 registry.example.com/csi:v2 debug" {
		t.Errorf("overrides parsed as %s", got)
	}
	if !strings.HasPrefix(o.addons.CCMImage, "quay.io/kubevirt/") {
		t.Errorf("an image not overridden lost its default: %s", o.addons.CCMImage)
	}
}

func TestParseRejects(t *testing.T) {
	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{"--addon-charts=cozy-addons"}, "want NAMESPACE/NAME"},
		{[]string{"--log-level=loud"}, "--log-level"},
		{[]string{"--concurrency=0"}, "at least 1"},
		{[]string{"--leader-elect", "extra"}, "unexpected arguments"},
		{[]string{"--no-such-flag"}, "not defined"},
	} {
		if _, err := parse(tt.args); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("parse(%q) = %v, want an error saying %q", tt.args, err, tt.want)
		}
	}
}
