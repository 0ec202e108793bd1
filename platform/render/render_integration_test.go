//go:build integration

package render_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"cozy.dev/cozy/internal/testing/testenv"
	"cozy.dev/cozy/platform/render"
)

// installedByPlatform maps the kinds whose CRDs come from the platform's
// own components (inside their Helm charts or release manifests) to the
// component that installs them. The test below first applies the layout
// without those CRDs, to check that each object waits for the component
// that owns its CRD, then installs them from their modules
// (testenv.PlatformCRDs) and checks those objects against them.
var installedByPlatform = map[string]string{
	"metallb.io/v1beta1 IPAddressPool":                          "metallb",
	"metallb.io/v1beta1 L2Advertisement":                        "metallb",
	"kubevirt.io/v1 KubeVirt":                                   "kubevirt",
	"cdi.kubevirt.io/v1beta1 CDI":                               "cdi",
	"operator.cluster.x-k8s.io/v1alpha2 CoreProvider":           "cluster-api",
	"operator.cluster.x-k8s.io/v1alpha2 BootstrapProvider":      "cluster-api",
	"operator.cluster.x-k8s.io/v1alpha2 ControlPlaneProvider":   "cluster-api",
	"operator.cluster.x-k8s.io/v1alpha2 InfrastructureProvider": "cluster-api",
	"snapshot.storage.k8s.io/v1 VolumeSnapshotClass":            "snapshot-controller",
}

// installCRDs installs the CRDs of sources and waits until they are
// served.
func installCRDs(ctx context.Context, env *testenv.Env, sources []testenv.CRDSource) error {
	crds, err := testenv.LoadCRDs(ctx, sources)
	if err != nil {
		return err
	}
	_, err = envtest.InstallCRDs(env.Config, envtest.CRDInstallOptions{CRDs: crds, MaxTime: 2 * time.Minute})
	return err
}

// TestServerAcceptsLayout server-side applies (dry run, strict field
// validation) every rendered object against a real kube-apiserver with
// the Flux, Cluster API, CAPK and Kamaji CRDs: the Flux objects of every
// component, the namespaces, the Cilium ConfigMap, and the objects of the
// cozy-operator chart; then, with the CRDs of MetalLB, the Cluster API
// operator, KubeVirt and CDI, the objects of those kinds.
func TestServerAcceptsLayout(t *testing.T) {
	env := testenv.Start(t, testenv.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	apply := func(u *unstructured.Unstructured, dryRun bool) error {
		opts := []client.ApplyOption{client.FieldOwner("cozy-platform-test"), client.ForceOwnership}
		if dryRun {
			opts = append(opts, client.DryRunAll)
		}
		return env.Client.Apply(ctx, client.ApplyConfigurationFromUnstructured(u.DeepCopy()), opts...)
	}
	namespace := func(name string) *unstructured.Unstructured {
		u := &unstructured.Unstructured{}
		u.SetAPIVersion("v1")
		u.SetKind("Namespace")
		u.SetName(name)
		return u
	}
	if err := apply(namespace("flux-system"), false); err != nil {
		t.Fatal(err)
	}

	// Objects of kinds the platform's components install, by layout: tried
	// again once every layout has been through without their CRDs.
	elsewhere := map[string][]render.Object{}
	for name, l := range layouts(t) {
		t.Run(name, func(t *testing.T) {
			objs, err := l.Objects()
			if err != nil {
				t.Fatal(err)
			}
			// The operator chart as Flux will install it.
			files, err := render.Operator(nil)
			if err != nil {
				t.Fatal(err)
			}
			for _, f := range sortedKeys(files) {
				docs, err := render.Decode([]byte(files[f]))
				if err != nil {
					t.Fatalf("cozy-operator %s: %v", f, err)
				}
				for _, d := range docs {
					objs = append(objs, render.Object{File: "charts/cozy-operator/templates/" + f, Unstructured: d})
				}
			}

			// Namespaces for real: namespaced objects need them even in a dry run.
			for _, o := range objs {
				if o.GetKind() == "Namespace" {
					if err := apply(o.Unstructured, false); err != nil {
						t.Fatalf("%s: namespace %s: %v", o.File, o.GetName(), err)
					}
				}
			}

			flux := decodeFlux(t, l)
			deps := graph{}
			for id, k := range flux.kustomizations {
				for _, d := range k.Spec.DependsOn {
					deps[key(k.Namespace, d.Name)] = append(deps[key(k.Namespace, d.Name)], id)
				}
			}

			accepted := 0
			for _, o := range objs {
				what := fmt.Sprintf("%s: %s %s/%s", o.File, o.GetKind(), o.GetNamespace(), o.GetName())
				err := apply(o.Unstructured, true)
				switch {
				case err == nil:
					accepted++
				case meta.IsNoMatchError(err):
					owner, ok := installedByPlatform[o.GetAPIVersion()+" "+o.GetKind()]
					if !ok {
						t.Errorf("%s: the API server does not serve this kind and no platform component installs it: %v", what, err)
						continue
					}
					comp := o.GetLabels()["cozy.dev/component"]
					if comp != owner && !deps.reaches(key("flux-system", owner), key("flux-system", comp)) {
						t.Errorf("%s: component %s does not wait for %s, which installs its CRD", what, comp, owner)
					}
					elsewhere[name] = append(elsewhere[name], o)
				default:
					t.Errorf("%s: refused: %v", what, err)
				}
			}
			t.Logf("%d objects accepted by the API server; %d are kinds the platform's own components install", accepted, len(elsewhere[name]))
			if accepted < 40 {
				t.Errorf("only %d objects were accepted; the layout lost objects", accepted)
			}
		})
	}

	// Now with the CRDs those components install.
	if len(elsewhere) == 0 {
		t.Fatal("no layout has an object of a kind the platform's components install: the second pass would check nothing")
	}
	if err := installCRDs(ctx, env, testenv.PlatformCRDs()); err != nil {
		t.Fatal(err)
	}
	for name, objs := range elsewhere {
		t.Run(name+"/platform-crds", func(t *testing.T) {
			for _, o := range objs {
				// KubeVirt's namespace comes with its release manifest.
				if ns := o.GetNamespace(); ns != "" {
					if err := apply(namespace(ns), false); err != nil {
						t.Fatal(err)
					}
				}
			}
			for _, o := range objs {
				if err := apply(o.Unstructured, true); err != nil {
					t.Errorf("%s: %s %s/%s refused by its component's CRD: %v", o.File, o.GetKind(), o.GetNamespace(), o.GetName(), err)
				}
			}
			t.Logf("%d objects accepted with the platform's components' CRDs", len(objs))
		})
	}
}
