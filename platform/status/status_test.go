package status

import (
	"context"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/yaml"
)

// obj builds a Flux object from YAML.
func obj(t *testing.T, y string) unstructured.Unstructured {
	t.Helper()
	// Through JSON, as the API server's answers are decoded: integers
	// stay int64.
	j, err := yaml.YAMLToJSON([]byte(y))
	if err != nil {
		t.Fatal(err)
	}
	var u unstructured.Unstructured
	if err := u.UnmarshalJSON(j); err != nil {
		t.Fatal(err)
	}
	return u
}

const (
	root = `apiVersion: kustomize.toolkit.fluxcd.io/v1
kind: Kustomization
metadata: {name: flux-system, namespace: flux-system, generation: 1}
spec: {sourceRef: {kind: GitRepository, name: flux-system}}
status:
  observedGeneration: 1
  conditions: [{type: Ready, status: "True", reason: ReconciliationSucceeded, message: "Applied revision: main@sha1:abc"}]`
	gitReady = `apiVersion: source.toolkit.fluxcd.io/v1
kind: GitRepository
metadata: {name: flux-system, namespace: flux-system, generation: 1}
status:
  observedGeneration: 1
  conditions: [{type: Ready, status: "True", reason: Succeeded, message: "stored artifact"}]`
	gitFailing = `apiVersion: source.toolkit.fluxcd.io/v1
kind: GitRepository
metadata: {name: flux-system, namespace: flux-system, generation: 1}
status:
  observedGeneration: 1
  conditions: [{type: Ready, status: "False", reason: GitOperationFailed, message: "failed to checkout and determine revision: authentication required"}]`
	networking = `apiVersion: kustomize.toolkit.fluxcd.io/v1
kind: Kustomization
metadata:
  name: networking
  namespace: flux-system
  generation: 1
  labels: {cozy.dev/component: networking, kustomize.toolkit.fluxcd.io/name: flux-system, kustomize.toolkit.fluxcd.io/namespace: flux-system}
spec: {sourceRef: {kind: GitRepository, name: flux-system}}
status:
  observedGeneration: 1
  conditions: [{type: Ready, status: "False", reason: HealthCheckFailed, message: "timeout waiting for: [HelmRelease/cozy-cilium/cilium status: 'InProgress']"}]`
	ciliumRepo = `apiVersion: source.toolkit.fluxcd.io/v1
kind: HelmRepository
metadata:
  name: cilium
  namespace: cozy-cilium
  generation: 1
  labels: {kustomize.toolkit.fluxcd.io/name: networking, kustomize.toolkit.fluxcd.io/namespace: flux-system}
spec: {url: "https://helm.cilium.io"}
status:
  observedGeneration: 1
  conditions: [{type: Ready, status: "False", reason: FetchFailed, message: "failed to fetch Helm repository index: dial tcp: lookup helm.cilium.io: no such host"}]`
	ciliumRelease = `apiVersion: helm.toolkit.fluxcd.io/v2
kind: HelmRelease
metadata:
  name: cilium
  namespace: cozy-cilium
  generation: 1
  labels: {kustomize.toolkit.fluxcd.io/name: networking, kustomize.toolkit.fluxcd.io/namespace: flux-system}
status:
  observedGeneration: 1
  conditions: [{type: Ready, status: "False", reason: ChartNotReady, message: "HelmChart 'cozy-cilium/cozy-cilium-cilium' is not ready"}]`
	certManager = `apiVersion: kustomize.toolkit.fluxcd.io/v1
kind: Kustomization
metadata:
  name: cert-manager
  namespace: flux-system
  generation: 1
  labels: {cozy.dev/component: cert-manager, kustomize.toolkit.fluxcd.io/name: flux-system, kustomize.toolkit.fluxcd.io/namespace: flux-system}
spec: {dependsOn: [{name: networking}], sourceRef: {kind: GitRepository, name: flux-system}}
status:
  observedGeneration: 1
  conditions: [{type: Ready, status: "False", reason: DependencyNotReady, message: "dependency 'flux-system/networking' is not ready"}]`
	operatorReady = `apiVersion: kustomize.toolkit.fluxcd.io/v1
kind: Kustomization
metadata:
  name: cozy-operator
  namespace: flux-system
  generation: 2
  labels: {cozy.dev/component: cozy-operator}
spec: {dependsOn: [{name: cert-manager}]}
status:
  observedGeneration: 2
  conditions: [{type: Ready, status: "True", reason: ReconciliationSucceeded}]`
	operatorRelease = `apiVersion: helm.toolkit.fluxcd.io/v2
kind: HelmRelease
metadata:
  name: cozy-operator
  namespace: cozy-system
  generation: 1
  labels: {kustomize.toolkit.fluxcd.io/name: cozy-operator, kustomize.toolkit.fluxcd.io/namespace: flux-system}
status:
  observedGeneration: 1
  conditions: [{type: Ready, status: "True", reason: InstallSucceeded}]`
	// The same release after a spec change Flux has not acted on.
	operatorReleaseStale = `apiVersion: helm.toolkit.fluxcd.io/v2
kind: HelmRelease
metadata:
  name: cozy-operator
  namespace: cozy-system
  generation: 2
  labels: {kustomize.toolkit.fluxcd.io/name: cozy-operator, kustomize.toolkit.fluxcd.io/namespace: flux-system}
status:
  observedGeneration: 1
  conditions: [{type: Ready, status: "True", reason: InstallSucceeded}]`
	ociHelmRepo = `apiVersion: source.toolkit.fluxcd.io/v1
kind: HelmRepository
metadata:
  name: oci
  namespace: cozy-system
  labels: {kustomize.toolkit.fluxcd.io/name: cozy-operator, kustomize.toolkit.fluxcd.io/namespace: flux-system}
spec: {type: oci, url: "oci://ghcr.io/x"}`
	suspended = `apiVersion: kustomize.toolkit.fluxcd.io/v1
kind: Kustomization
metadata: {name: kamaji, namespace: flux-system, labels: {cozy.dev/component: kamaji}}
spec: {suspend: true}
status:
  conditions: [{type: Ready, status: "True"}]`
	fresh = `apiVersion: kustomize.toolkit.fluxcd.io/v1
kind: Kustomization
metadata: {name: kamaji, namespace: flux-system, labels: {cozy.dev/component: kamaji}}`
)

type want struct {
	name, message string
	ready         bool
}

func TestBuild(t *testing.T) {
	tests := []struct {
		name           string
		ks, srcs, rels []string
		components     []want // in the order the report lists them
		ready          bool
	}{
		{
			name:       "everything ready",
			ks:         []string{operatorReady, root},
			srcs:       []string{gitReady, ociHelmRepo},
			rels:       []string{operatorRelease},
			components: []want{{"flux-system", "", true}, {"cozy-operator", "", true}},
			ready:      true,
		},
		{
			name: "a chart that cannot be fetched, and what waits for it",
			ks:   []string{certManager, networking, root},
			srcs: []string{gitReady, ciliumRepo},
			rels: []string{ciliumRelease},
			components: []want{
				{"flux-system", "", true},
				// The source's failure, not the release's or the
				// Kustomization's consequence of it.
				{"networking", "HelmRepository cozy-cilium/cilium: failed to fetch Helm repository index: dial tcp: lookup helm.cilium.io: no such host", false},
				{"cert-manager", "dependency 'flux-system/networking' is not ready", false},
			},
		},
		{
			name:       "the platform repository fails",
			ks:         []string{root},
			srcs:       []string{gitFailing},
			components: []want{{"flux-system", "GitRepository flux-system/flux-system: failed to checkout and determine revision: authentication required", false}},
		},
		{
			name:       "a failing release",
			ks:         []string{networking},
			srcs:       nil,
			rels:       []string{ciliumRelease},
			components: []want{{"networking", "HelmRelease cozy-cilium/cilium: HelmChart 'cozy-cilium/cozy-cilium-cilium' is not ready", false}},
		},
		{
			name:       "a change Flux has not reconciled yet",
			ks:         []string{operatorReady},
			rels:       []string{operatorReleaseStale},
			components: []want{{"cozy-operator", "HelmRelease cozy-system/cozy-operator: Flux has not reconciled the latest change yet", false}},
		},
		{
			// Flux leaves observedGeneration behind on failures: the
			// failure is still the latest word.
			name:       "a failure never reconciled successfully",
			ks:         []string{strings.Replace(certManager, "observedGeneration: 1", "observedGeneration: -1", 1)},
			components: []want{{"cert-manager", "dependency 'flux-system/networking' is not ready", false}},
		},
		{
			name:       "suspended",
			ks:         []string{suspended},
			components: []want{{"kamaji", "suspended: Flux does not reconcile it (flux resume)", false}},
		},
		{
			name:       "not reconciled yet",
			ks:         []string{fresh},
			components: []want{{"kamaji", "Flux has not reconciled it yet", false}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var ks, srcs, rels []unstructured.Unstructured
			for _, y := range tt.ks {
				ks = append(ks, obj(t, y))
			}
			for _, y := range tt.srcs {
				srcs = append(srcs, obj(t, y))
			}
			for _, y := range tt.rels {
				rels = append(rels, obj(t, y))
			}
			rep := build(ks, srcs, rels)
			if rep.Ready != tt.ready {
				t.Errorf("Ready = %v, want %v", rep.Ready, tt.ready)
			}
			if len(rep.Components) != len(tt.components) {
				t.Fatalf("%d components, want %d: %+v", len(rep.Components), len(tt.components), rep.Components)
			}
			for i, w := range tt.components {
				c := rep.Components[i]
				if c.Name != w.name || c.Ready != w.ready || c.Message != w.message {
					t.Errorf("component %d = %s ready=%v %q\n want %s ready=%v %q", i, c.Name, c.Ready, c.Message, w.name, w.ready, w.message)
				}
			}
		})
	}
}

// TestRootSourceCountedOnce: the GitRepository every component reads is
// reported by the root only.
func TestRootSourceCountedOnce(t *testing.T) {
	rep := build([]unstructured.Unstructured{obj(t, root), obj(t, networking)}, []unstructured.Unstructured{obj(t, gitFailing)}, nil)
	for _, c := range rep.Components {
		n := len(c.Sources)
		if (c.Name == "flux-system") != (n == 1) {
			t.Errorf("%s lists %d sources", c.Name, n)
		}
	}
}

func TestCollect(t *testing.T) {
	var objs []runtime.Object
	for _, y := range []string{root, gitReady, networking, ciliumRepo, ciliumRelease} {
		u := obj(t, y)
		objs = append(objs, &u)
	}
	c := fake.NewClientBuilder().WithRuntimeObjects(objs...).Build()
	rep, err := Collect(context.Background(), c, "flux-system")
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Components) != 2 || rep.Ready || !strings.Contains(rep.Components[1].Message, "no such host") {
		t.Fatalf("report: %+v", rep)
	}
	ok, why, err := RootReady(context.Background(), c, "flux-system", "flux-system")
	if err != nil || !ok || why != "" {
		t.Errorf("RootReady = %v %q %v", ok, why, err)
	}
	if _, err := Collect(context.Background(), c, "elsewhere"); err == nil || !strings.Contains(err.Error(), "platform install") {
		t.Errorf("no Kustomizations: err = %v", err)
	}
}

// A component the rendering switched off has no Kustomization: the
// components ConfigMap makes it a row of its own, off, that does not
// count against Ready; one still being pruned keeps its own row.
func TestCollectShowsOffComponents(t *testing.T) {
	cm := `apiVersion: v1
kind: ConfigMap
metadata: {name: cozy-platform-components, namespace: flux-system}
data: {networking: "on", linstor: "off", kamaji: "off"}`
	kamaji := strings.ReplaceAll(networking, "networking", "kamaji")
	var objs []runtime.Object
	for _, y := range []string{root, gitReady, kamaji, cm} {
		u := obj(t, y)
		objs = append(objs, &u)
	}
	c := fake.NewClientBuilder().WithRuntimeObjects(objs...).Build()
	rep, err := Collect(context.Background(), c, "flux-system")
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, comp := range rep.Components {
		names = append(names, comp.Name)
		switch comp.Name {
		case "linstor":
			if !comp.Off || !comp.Ready || !strings.Contains(comp.Message, "platform.components.linstor.enabled: false") {
				t.Errorf("linstor: %+v", comp)
			}
		case "kamaji":
			if comp.Off || comp.Ready {
				t.Errorf("kamaji, off but not pruned yet, must report its Kustomization: %+v", comp)
			}
		}
	}
	if strings.Join(names, " ") != "flux-system kamaji linstor" {
		t.Errorf("rows %v", names)
	}
}
