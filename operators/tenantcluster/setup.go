package tenantcluster

import (
	"context"
	"maps"
	"strings"

	helmv2 "github.com/fluxcd/helm-controller/api/v2"
	corev1 "k8s.io/api/core/v1"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/selection"
	"k8s.io/apimachinery/pkg/types"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	bootstrapv1 "sigs.k8s.io/cluster-api/api/bootstrap/kubeadm/v1beta2"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	v1 "cozy.dev/cozy/operators/api/v1alpha1"
)

func exists(label string) labels.Selector {
	r, err := labels.NewRequirement(label, selection.Exists, nil)
	if err != nil {
		panic(err)
	}
	return labels.NewSelector().Add(*r)
}

// Scheme holds every type the operator reads or writes.
func Scheme() (*runtime.Scheme, error) {
	s := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{
		clientgoscheme.AddToScheme, v1.AddToScheme, clusterv1.AddToScheme, bootstrapv1.AddToScheme, helmv2.AddToScheme,
	} {
		if err := add(s); err != nil {
			return nil, err
		}
	}
	return s, nil
}

// CacheOptions keep the operator's cache to what it reads: every
// TenantCluster, and of everything else only what carries the
// TenantCluster label (its children), Cluster API's cluster-name label
// (kubeconfig Secrets, MachineSets). Managed fields are dropped.
func CacheOptions() cache.Options {
	clusterNamed := cache.ByObject{Label: exists(clusterv1.ClusterNameLabel)}
	return cache.Options{
		DefaultLabelSelector: exists(LabelTenantCluster),
		DefaultTransform:     cache.TransformStripManagedFields(),
		ByObject: map[client.Object]cache.ByObject{
			&v1.TenantCluster{}:     {Label: labels.Everything()},
			&corev1.Secret{}:        clusterNamed,
			&clusterv1.MachineSet{}: clusterNamed,
		},
	}
}

// ManagerOptions are the manager options every run of the controller
// shares (cozy-operator and the tests): its Scheme, its CacheOptions, and
// unstructured reads served from that cache too. Callers add metrics,
// probes and leader election.
func ManagerOptions() (ctrl.Options, error) {
	s, err := Scheme()
	if err != nil {
		return ctrl.Options{}, err
	}
	return ctrl.Options{
		Scheme: s,
		Cache:  CacheOptions(),
		Client: client.Options{Cache: &client.CacheOptions{Unstructured: true}},
	}, nil
}

// tenantClusterChanged passes the updates the controller acts on: a new
// spec (generation), a deletion, labels or annotations. Its own status
// and finalizer writes come back as updates that change none of these.
var tenantClusterChanged = predicate.Funcs{
	UpdateFunc: func(e event.UpdateEvent) bool {
		o, n := e.ObjectOld, e.ObjectNew
		return o.GetGeneration() != n.GetGeneration() ||
			o.GetDeletionTimestamp().IsZero() != n.GetDeletionTimestamp().IsZero() ||
			!maps.Equal(o.GetLabels(), n.GetLabels()) || !maps.Equal(o.GetAnnotations(), n.GetAnnotations())
	},
}

// SetupWithManager registers the controller: it watches TenantClusters
// and, to react when they change, its children, the kubeconfig Secrets
// and the MachineSets (which hold old templates).
func (r *Reconciler) SetupWithManager(mgr ctrl.Manager, concurrency int) error {
	if r.Client == nil {
		r.Client = mgr.GetClient()
	}
	w, err := newWriter(mgr.GetConfig(), mgr.GetHTTPClient(), mgr.GetRESTMapper())
	if err != nil {
		return err
	}
	r.writer = w
	r.imageChecks = newImageChecks(r.WorkerImages)
	b := ctrl.NewControllerManagedBy(mgr).
		Named("tenantcluster").
		For(&v1.TenantCluster{}, builder.WithPredicates(tenantClusterChanged)).
		WithOptions(controller.Options{MaxConcurrentReconciles: concurrency})
	for _, k := range childKinds {
		switch k.Read {
		case readTyped:
			obj, err := mgr.GetScheme().New(k.GVK)
			if err != nil {
				return err
			}
			b = b.Owns(obj.(client.Object))
		case readUnstructured:
			u := &unstructured.Unstructured{}
			u.SetGroupVersionKind(k.GVK)
			b = b.Owns(u)
		default:
			pm := &metav1.PartialObjectMetadata{}
			pm.SetGroupVersionKind(k.GVK)
			b = b.Owns(pm, builder.OnlyMetadata)
		}
	}
	toCluster := func(suffix string) handler.EventHandler {
		return handler.EnqueueRequestsFromMapFunc(func(_ context.Context, obj client.Object) []reconcile.Request {
			name := obj.GetLabels()[clusterv1.ClusterNameLabel]
			if name == "" || (suffix != "" && obj.GetName() != name+suffix) {
				return nil
			}
			return []reconcile.Request{{NamespacedName: types.NamespacedName{Namespace: obj.GetNamespace(), Name: name}}}
		})
	}
	b = b.Watches(&corev1.Secret{}, toCluster("-kubeconfig"), builder.OnlyMetadata).
		Watches(&clusterv1.MachineSet{}, toCluster(""))
	return b.Complete(r)
}

// isNoKind is true when a kind's CRD is not installed.
func isNoKind(err error) bool {
	return apimeta.IsNoMatchError(err) || strings.Contains(err.Error(), "no matches for kind")
}
