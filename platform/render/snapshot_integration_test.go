//go:build integration

package render_test

import (
	"context"
	"os"
	"path"
	"path/filepath"
	"strings"
	"testing"
	"time"

	authorizationv1 "k8s.io/api/authorization/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"

	"cozy.dev/cozy/internal/testing/testenv"
)

// snapshotterRaw is where the snapshot-controller component reads
// external-snapshotter's files: raw.githubusercontent.com at a tag.
const snapshotterRaw = "https://raw.githubusercontent.com/kubernetes-csi/external-snapshotter/"

// snapshotterFile is the file a snapshot-controller resource URL names,
// read from external-snapshotter's Go modules at the same tag (client/ is
// a module of its own): the URL cannot be fetched here, the modules can.
func snapshotterFile(ctx context.Context, url string) ([]byte, error) {
	tag, file, _ := strings.Cut(strings.TrimPrefix(url, snapshotterRaw), "/")
	module := "github.com/kubernetes-csi/external-snapshotter/v8"
	if rest, ok := strings.CutPrefix(file, "client/"); ok {
		module, file = testenv.SnapshotterClientModule, rest
	}
	dir, err := testenv.ModuleDir(ctx, module, tag)
	if err != nil {
		return nil, err
	}
	return os.ReadFile(filepath.Join(dir, filepath.FromSlash(file)))
}

// TestSnapshotControllerComponent builds the snapshot-controller
// component as kustomize-controller would, with the very files its URLs
// name (from external-snapshotter's modules at the pinned tag), and
// applies it to a real API server: the CRDs are served and kept from
// Flux's pruning, everything namespaced moved into
// cozy-snapshot-controller, the image pinned to the tag, and the
// controller's ServiceAccount, there, allowed what it does (its RBAC
// bound to where it now runs); LINSTOR's VolumeSnapshotClass is accepted
// by the real CRD.
func TestSnapshotControllerComponent(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	l := mustRender(t, labRack(t))
	dir := l.ClusterDir + "/components/snapshot-controller"
	fs := filesys.MakeFsInMemory()
	remote := 0
	for _, p := range l.Paths() {
		if !strings.HasPrefix(p, dir+"/") {
			continue
		}
		data := l.Files[p]
		if path.Base(p) == "kustomization.yaml" {
			var files map[string][]byte
			data, files = withLocal(t, p, data, func(_ int, url string) (string, []byte) {
				if !strings.HasPrefix(url, snapshotterRaw) {
					t.Fatalf("%s: %s is not external-snapshotter's", p, url)
				}
				file, err := snapshotterFile(ctx, url)
				if err != nil {
					t.Fatalf("%s: %v", url, err)
				}
				return path.Base(url), file
			})
			for name, file := range files {
				if err := fs.WriteFile("/"+path.Join(dir, name), file); err != nil {
					t.Fatal(err)
				}
			}
			remote += len(files)
		}
		if err := fs.WriteFile("/"+p, data); err != nil {
			t.Fatal(err)
		}
	}
	if remote != 5 {
		t.Fatalf("%d resources from external-snapshotter, want its 3 CRDs and the controller's 2 manifests", remote)
	}
	res, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(fs, "/"+dir)
	if err != nil {
		t.Fatalf("kustomize build %s: %v", dir, err)
	}

	const ns = "cozy-snapshot-controller"
	var crds []*apiextensionsv1.CustomResourceDefinition
	var namespaces, namespaced, rest []*unstructured.Unstructured
	kinds := map[string]int{}
	for _, r := range res.Resources() {
		m, err := r.Map()
		if err != nil {
			t.Fatal(err)
		}
		u := &unstructured.Unstructured{Object: m}
		kinds[u.GetKind()]++
		switch {
		case u.GetKind() == "CustomResourceDefinition":
			if u.GetAnnotations()["kustomize.toolkit.fluxcd.io/prune"] != "disabled" {
				t.Errorf("Flux may prune CRD %s", u.GetName())
			}
			crd := &apiextensionsv1.CustomResourceDefinition{}
			if err := runtime.DefaultUnstructuredConverter.FromUnstructured(m, crd); err != nil {
				t.Fatalf("CRD %s: %v", u.GetName(), err)
			}
			crds = append(crds, crd)
		case u.GetKind() == "Namespace":
			namespaces = append(namespaces, u)
		case u.GetNamespace() != "":
			if u.GetNamespace() != ns {
				t.Errorf("%s %s is in %s, not %s", u.GetKind(), u.GetName(), u.GetNamespace(), ns)
			}
			namespaced = append(namespaced, u)
		default:
			rest = append(rest, u)
		}
		switch u.GetKind() {
		case "Deployment":
			containers, _, _ := unstructured.NestedSlice(m, "spec", "template", "spec", "containers")
			if len(containers) != 1 || containers[0].(map[string]any)["image"] != "registry.k8s.io/sig-storage/snapshot-controller:v8.6.0" {
				t.Errorf("Deployment %s runs %v, want snapshot-controller v8.6.0", u.GetName(), containers)
			}
		case "ClusterRoleBinding":
			subjects, _, _ := unstructured.NestedSlice(m, "subjects")
			for _, s := range subjects {
				if s.(map[string]any)["namespace"] != ns {
					t.Errorf("ClusterRoleBinding %s binds %v, not the ServiceAccount in %s", u.GetName(), s, ns)
				}
			}
		}
	}
	if kinds["CustomResourceDefinition"] != 3 || kinds["Deployment"] != 1 || kinds["VolumeSnapshotClass"] != 1 || len(namespaced) < 4 {
		t.Fatalf("built %v, %d namespaced: want 3 CRDs, the controller's Deployment, ServiceAccount and leader-election RBAC, and a VolumeSnapshotClass", kinds, len(namespaced))
	}

	// A real API server takes it, in Flux's order: CRDs and namespaces,
	// then the rest.
	env := testenv.Start(t, testenv.Options{CRDs: []testenv.CRDSource{}})
	apply := func(objs []*unstructured.Unstructured) {
		t.Helper()
		for _, u := range objs {
			if err := env.Client.Apply(ctx, client.ApplyConfigurationFromUnstructured(u), client.FieldOwner("kustomize-controller"), client.ForceOwnership); err != nil {
				t.Fatalf("%s %s: %v", u.GetKind(), u.GetName(), err)
			}
		}
	}
	if _, err := envtest.InstallCRDs(env.Config, envtest.CRDInstallOptions{CRDs: crds, MaxTime: 2 * time.Minute}); err != nil {
		t.Fatal(err)
	}
	apply(namespaces)
	apply(namespaced)
	apply(rest)

	// What the controller does, asked as its ServiceAccount.
	sa := "system:serviceaccount:" + ns + ":snapshot-controller"
	for _, a := range []authorizationv1.ResourceAttributes{
		{Group: "snapshot.storage.k8s.io", Resource: "volumesnapshots", Verb: "watch"},
		{Group: "snapshot.storage.k8s.io", Resource: "volumesnapshotcontents", Verb: "create"},
		{Group: "snapshot.storage.k8s.io", Resource: "volumesnapshots", Subresource: "status", Verb: "patch", Namespace: "tenants"},
		{Resource: "persistentvolumeclaims", Verb: "update", Namespace: "tenants"},
		{Group: "coordination.k8s.io", Resource: "leases", Verb: "update", Namespace: ns},
	} {
		review := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{User: sa, ResourceAttributes: &a}}
		if err := env.Client.Create(ctx, review); err != nil {
			t.Fatal(err)
		}
		if !review.Status.Allowed {
			t.Errorf("%s may not %s %s/%s in %q: %s", sa, a.Verb, a.Resource, a.Subresource, a.Namespace, review.Status.Reason)
		}
	}
	// And not where it does not run.
	review := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{User: sa,
		ResourceAttributes: &authorizationv1.ResourceAttributes{Group: "coordination.k8s.io", Resource: "leases", Verb: "update", Namespace: "kube-system"}}}
	if err := env.Client.Create(ctx, review); err != nil {
		t.Fatal(err)
	}
	if review.Status.Allowed {
		t.Error("the snapshot-controller may take leases in kube-system: its leader-election RBAC did not move")
	}
}
