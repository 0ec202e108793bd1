package main

import (
	"reflect"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"cozy.dev/cozy/operators/tenantcluster"
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
	if want := tenantcluster.DefaultAddonConfig().Charts; !reflect.DeepEqual(o.addons.Charts, want) {
		t.Errorf("the chart's add-on charts %+v, want the operator's defaults %+v", o.addons.Charts, want)
	}

	o, err = parse(chartArgs(t, map[string]any{
		"logLevel": "debug",
		"addons": map[string]any{
			"charts": map[string]any{"cilium": map[string]any{
				"sourceRef": map[string]any{"kind": "HelmRepository", "namespace": "mirror", "name": "addons"},
				"chart":     "cilium", "version": "~1.18",
			}},
			"images": map[string]any{"clusterAutoscaler": "registry.example.com/ca:v1", "kubevirtCSIDriver": "registry.example.com/csi:v2"},
		},
	}))
	if err != nil {
		t.Fatal(err)
	}
	want := []string{o.addons.Charts["cilium"].String(), o.addons.ClusterAutoscalerImage, o.addons.CSIDriverImage, o.logLevel.String()}
	if got := strings.Join(want, " "); got != "HelmRepository/mirror/addons/cilium@~1.18 registry.example.com/ca:v1 registry.example.com/csi:v2 debug" {
		t.Errorf("overrides parsed as %s", got)
	}
	if got := o.addons.Charts["kubevirt-csi-node"].Source.Kind; got != "GitRepository" {
		t.Errorf("an add-on chart not overridden lost its default: %s", got)
	}
	if !strings.HasPrefix(o.addons.CCMImage, "quay.io/kubevirt/") {
		t.Errorf("an image not overridden lost its default: %s", o.addons.CCMImage)
	}
	if !reflect.DeepEqual(o.workerImages, tenantcluster.WorkerImages{}) {
		t.Errorf("worker images %+v without the chart's workerImage", o.workerImages)
	}
	if o.permittedGPUs != nil || !o.loadBalancer {
		t.Errorf("by default: permitted GPUs %v (want none), load balancer %v (want true)", o.permittedGPUs, o.loadBalancer)
	}

	o, err = parse(chartArgs(t, map[string]any{
		"workerImage": map[string]any{"repository": "10.0.0.1:5000/cozy.dev/tenant-worker", "insecure": true, "mirror": "http://10.0.0.1:5000",
			"mirrors": map[string]any{"harbor.example.com": []any{"https://harbor.example.com/proxy", "http://10.0.0.2:5000"}, "*": []any{"http://10.0.0.3:5000"}}},
		"permittedGPUs": []any{"nvidia.com/GA102GL_A10", "nvidia.com/AD104GL_L4"},
		"loadBalancer":  false,
	}))
	if err != nil {
		t.Fatal(err)
	}
	if want := (tenantcluster.WorkerImages{Repository: "10.0.0.1:5000/cozy.dev/tenant-worker", Insecure: true, Mirror: "http://10.0.0.1:5000",
		Mirrors: map[string][]string{"harbor.example.com": {"https://harbor.example.com/proxy", "http://10.0.0.2:5000"}, "*": {"http://10.0.0.3:5000"}}}); !reflect.DeepEqual(o.workerImages, want) {
		t.Errorf("worker images %+v, want %+v", o.workerImages, want)
	}
	if want := []string{"nvidia.com/GA102GL_A10", "nvidia.com/AD104GL_L4"}; !reflect.DeepEqual(o.permittedGPUs, want) {
		t.Errorf("permitted GPUs %v, want %v", o.permittedGPUs, want)
	}
	if o.loadBalancer {
		t.Error("loadBalancer: false did not reach the operator")
	}
}

func TestParseRejects(t *testing.T) {
	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{"--addon-chart=cilium=HelmRepository/cozy-addons/cilium"}, "want KIND/NAMESPACE/NAME/CHART"},
		{[]string{"--addon-chart=calico=HelmRepository/a/b/calico"}, "ADDON one of cilium, kubevirt-csi-node, metrics-server"},
		{[]string{"--log-level=loud"}, "--log-level"},
		{[]string{"--concurrency=0"}, "at least 1"},
		{[]string{"--worker-registry-mirror=10.0.0.1:5000"}, "want http(s)://HOST[:PORT]"},
		{[]string{"--worker-registry-mirror=http://10.0.0.1:5000/v2/docker.io"}, "want http(s)://HOST[:PORT]"},
		{[]string{"--worker-registry-mirror=ftp://10.0.0.1"}, "want http(s)://HOST[:PORT]"},
		{[]string{"--worker-registry-mirror-for=docker.io"}, "want HOST=URL[,URL...]"},
		{[]string{"--worker-registry-mirror-for=docker.io="}, "want HOST=URL[,URL...]"},
		{[]string{"--worker-registry-mirror-for=Docker.io=http://10.0.0.1:5000"}, "lower case: docker.io"},
		{[]string{"--worker-registry-mirror-for=docker.io/library=http://10.0.0.1:5000"}, "not a registry host"},
		{[]string{"--worker-registry-mirror-for=docker.io=http://10.0.0.1:5000,10.0.0.2:5000"}, `"10.0.0.2:5000" is not an http(s) URL`},
		{[]string{"--worker-registry-mirror-for=docker.io=http://a:5000", "--worker-registry-mirror-for=docker.io=http://b:5000"}, "docker.io is given twice"},
		{[]string{"--worker-registry-mirror=http://10.0.0.1:5000", "--worker-registry-mirror-for=quay.io=http://b:5000"}, "--worker-registry-mirror covers quay.io already"},
		{[]string{"--leader-elect", "extra"}, "unexpected arguments"},
		{[]string{"--no-such-flag"}, "not defined"},
		{[]string{"--worker-image-repository=10.0.0.1:5000/cozy.dev/tenant-worker:v1.36.3"}, "want HOST[:PORT]/PATH without a tag"},
		{[]string{"--worker-image-repository=tenant-worker"}, "want HOST[:PORT]/PATH without a tag"},
		{[]string{"--worker-image-repository=Bad/Upper"}, "want HOST[:PORT]/PATH without a tag"},
	} {
		if _, err := parse(tt.args); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("parse(%q) = %v, want an error saying %q", tt.args, err, tt.want)
		}
	}
}
