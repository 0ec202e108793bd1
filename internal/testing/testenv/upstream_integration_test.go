//go:build integration

package testenv_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"cozy.dev/cozy/internal/testing/testenv"
)

// Each case is a kind Cozy's operator and platform create. The valid object
// must be stored as sent (checked through one nested field, so a pruned or
// mis-versioned schema fails); the invalid one must be refused by the
// server's own schema with a message naming the field.
var upstreamKinds = []struct {
	kind      string
	valid     string
	keptField []string // path of a field that must survive the round trip
	keptValue string
	invalid   string
	wantError []string // substrings of the API server's message
}{
	{
		kind: "Cluster",
		valid: `
apiVersion: cluster.x-k8s.io/v1beta2
kind: Cluster
metadata: {name: tenant-a}
spec:
  clusterNetwork:
    pods: {cidrBlocks: [10.243.0.0/16]}
    services: {cidrBlocks: [10.95.0.0/16]}
  controlPlaneRef: {apiGroup: controlplane.cluster.x-k8s.io, kind: KamajiControlPlane, name: tenant-a}
  infrastructureRef: {apiGroup: infrastructure.cluster.x-k8s.io, kind: KubevirtCluster, name: tenant-a}`,
		keptField: []string{"spec", "controlPlaneRef", "apiGroup"},
		keptValue: "controlplane.cluster.x-k8s.io",
		// v1beta1-style ref (apiVersion, no apiGroup): v1beta2 requires apiGroup.
		invalid: `
apiVersion: cluster.x-k8s.io/v1beta2
kind: Cluster
metadata: {name: bad}
spec:
  controlPlaneRef: {apiVersion: controlplane.cluster.x-k8s.io/v1alpha2, kind: KamajiControlPlane, name: bad}`,
		wantError: []string{"spec.controlPlaneRef.apiGroup", "Required value"},
	},
	{
		kind: "MachineDeployment",
		valid: `
apiVersion: cluster.x-k8s.io/v1beta2
kind: MachineDeployment
metadata: {name: tenant-a-md0}
spec:
  clusterName: tenant-a
  replicas: 2
  selector: {matchLabels: {pool: md0}}
  rollout: {strategy: {type: RollingUpdate, rollingUpdate: {maxSurge: 1, maxUnavailable: 0}}}
  template:
    metadata: {labels: {pool: md0}}
    spec:
      clusterName: tenant-a
      version: v1.36.0
      bootstrap:
        configRef: {apiGroup: bootstrap.cluster.x-k8s.io, kind: KubeadmConfigTemplate, name: tenant-a-md0}
      infrastructureRef: {apiGroup: infrastructure.cluster.x-k8s.io, kind: KubevirtMachineTemplate, name: tenant-a-md0}`,
		keptField: []string{"spec", "template", "spec", "bootstrap", "configRef", "kind"},
		keptValue: "KubeadmConfigTemplate",
		invalid: `
apiVersion: cluster.x-k8s.io/v1beta2
kind: MachineDeployment
metadata: {name: bad}
spec:
  replicas: 1
  selector: {}
  template:
    spec:
      clusterName: tenant-a
      bootstrap: {dataSecretName: x}
      infrastructureRef: {apiGroup: infrastructure.cluster.x-k8s.io, kind: KubevirtMachineTemplate, name: x}`,
		wantError: []string{"spec.clusterName", "Required value"},
	},
	{
		kind: "KubeadmConfigTemplate",
		valid: `
apiVersion: bootstrap.cluster.x-k8s.io/v1beta2
kind: KubeadmConfigTemplate
metadata: {name: tenant-a-md0}
spec:
  template:
    spec:
      joinConfiguration:
        nodeRegistration:
          kubeletExtraArgs:
          - {name: cgroup-driver, value: cgroupfs}`,
		keptField: []string{"spec", "template", "spec", "joinConfiguration", "nodeRegistration", "kubeletExtraArgs"},
		invalid: `
apiVersion: bootstrap.cluster.x-k8s.io/v1beta2
kind: KubeadmConfigTemplate
metadata: {name: bad}
spec:
  template:
    spec:
      joinConfiguration:
        nodeRegistration:
          kubeletExtraArgs: {cgroup-driver: cgroupfs}`,
		// v1beta1's map shape: v1beta2 wants a list of {name, value}.
		wantError: []string{"kubeletExtraArgs", "must be of type array"},
	},
	{
		kind: "KamajiControlPlane",
		valid: `
apiVersion: controlplane.cluster.x-k8s.io/v1alpha2
kind: KamajiControlPlane
metadata: {name: tenant-a}
spec:
  version: v1.36.0
  replicas: 2
  dataStoreName: default
  network: {serviceType: ClusterIP}`,
		keptField: []string{"spec", "dataStoreName"},
		keptValue: "default",
		invalid: `
apiVersion: controlplane.cluster.x-k8s.io/v1alpha2
kind: KamajiControlPlane
metadata: {name: bad}
spec:
  replicas: 2`,
		wantError: []string{"spec.version", "Required value"},
	},
	{
		kind: "KubevirtCluster",
		valid: `
apiVersion: infrastructure.cluster.x-k8s.io/v1alpha1
kind: KubevirtCluster
metadata:
  name: tenant-a
  annotations: {cluster.x-k8s.io/managed-by: kamaji}
spec:
  controlPlaneServiceTemplate:
    spec: {type: ClusterIP}`,
		keptField: []string{"spec", "controlPlaneServiceTemplate", "spec", "type"},
		keptValue: "ClusterIP",
		invalid: `
apiVersion: infrastructure.cluster.x-k8s.io/v1alpha1
kind: KubevirtCluster
metadata: {name: bad}
spec:
  controlPlaneEndpoint: {host: 10.0.0.1}`,
		wantError: []string{"spec.controlPlaneEndpoint.port", "Required value"},
	},
	{
		kind: "KubevirtMachineTemplate",
		valid: `
apiVersion: infrastructure.cluster.x-k8s.io/v1alpha1
kind: KubevirtMachineTemplate
metadata: {name: tenant-a-md0}
spec:
  template:
    spec:
      virtualMachineTemplate:
        spec:
          runStrategy: Always
          template:
            spec:
              domain:
                cpu: {cores: 2}
                memory: {guest: 4Gi}
                devices: {}`,
		keptField: []string{"spec", "template", "spec", "virtualMachineTemplate", "spec", "runStrategy"},
		keptValue: "Always",
		invalid: `
apiVersion: infrastructure.cluster.x-k8s.io/v1alpha1
kind: KubevirtMachineTemplate
metadata: {name: bad}
spec:
  template: {}`,
		wantError: []string{"spec.template.spec", "Required value"},
	},
	{
		kind: "HelmRelease",
		valid: `
apiVersion: helm.toolkit.fluxcd.io/v2
kind: HelmRelease
metadata: {name: kube-ovn}
spec:
  interval: 5m
  chart:
    spec:
      chart: kube-ovn
      version: 1.14.0
      sourceRef: {kind: HelmRepository, name: kube-ovn}`,
		keptField: []string{"spec", "chart", "spec", "sourceRef", "kind"},
		keptValue: "HelmRepository",
		// Both chart and chartRef: Flux's CEL rule allows exactly one.
		invalid: `
apiVersion: helm.toolkit.fluxcd.io/v2
kind: HelmRelease
metadata: {name: bad}
spec:
  interval: 5m
  chart: {spec: {chart: x, sourceRef: {kind: HelmRepository, name: x}}}
  chartRef: {kind: OCIRepository, name: x}`,
		wantError: []string{"either chart or chartRef must be set"},
	},
}

func TestUpstreamKindsAreServedAndValidated(t *testing.T) {
	env := testenv.Start(t, testenv.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "tenant-a"}}
	if err := env.Client.Create(ctx, ns); err != nil {
		t.Fatalf("create namespace: %v", err)
	}

	for _, tc := range upstreamKinds {
		t.Run(tc.kind, func(t *testing.T) {
			valid := mustObject(t, tc.valid, ns.Name)
			if err := env.Client.Create(ctx, valid); err != nil {
				t.Fatalf("valid %s rejected: %v", tc.kind, err)
			}
			got := &unstructured.Unstructured{}
			got.SetGroupVersionKind(valid.GroupVersionKind())
			if err := env.Client.Get(ctx, client.ObjectKeyFromObject(valid), got); err != nil {
				t.Fatalf("get %s back: %v", tc.kind, err)
			}
			v, found, err := unstructured.NestedFieldNoCopy(got.Object, tc.keptField...)
			if err != nil || !found {
				t.Fatalf("%s lost %s on the round trip (pruned by the schema?): found=%v err=%v",
					tc.kind, strings.Join(tc.keptField, "."), found, err)
			}
			if tc.keptValue != "" && fmt.Sprint(v) != tc.keptValue {
				t.Errorf("%s %s = %v, want %s", tc.kind, strings.Join(tc.keptField, "."), v, tc.keptValue)
			}

			invalid := mustObject(t, tc.invalid, ns.Name)
			err = env.Client.Create(ctx, invalid)
			if err == nil {
				t.Fatalf("invalid %s accepted; the CRD schema did not validate it", tc.kind)
			}
			if !apierrors.IsInvalid(err) {
				t.Fatalf("invalid %s: want a 422 Invalid from the schema, got %v", tc.kind, err)
			}
			for _, want := range tc.wantError {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("invalid %s: error %q does not mention %q", tc.kind, err, want)
				}
			}
		})
	}
}

// Without the Kamaji CRD the same object must fail: the test above proves
// the CRDs are loaded, not that the server accepts anything.
func TestKindWithoutCRDIsRefused(t *testing.T) {
	env := testenv.Start(t, testenv.Options{CRDs: []testenv.CRDSource{
		{Module: "github.com/fluxcd/helm-controller", Version: "v1.6.4", Dir: "config/crd"},
	}})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	for _, tc := range upstreamKinds {
		if tc.kind != "KamajiControlPlane" {
			continue
		}
		err := env.Client.Create(ctx, mustObject(t, tc.valid, "default"))
		if !meta.IsNoMatchError(err) {
			t.Fatalf("create KamajiControlPlane without its CRD: want a no-match error, got %v", err)
		}
	}
}

func mustObject(t *testing.T, doc, namespace string) *unstructured.Unstructured {
	t.Helper()
	u := &unstructured.Unstructured{}
	if err := yaml.Unmarshal([]byte(doc), &u.Object); err != nil {
		t.Fatalf("test object does not parse: %v\n%s", err, doc)
	}
	u.SetNamespace(namespace)
	return u
}
