package tenantcluster

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	helmv2 "github.com/fluxcd/helm-controller/api/v2"
	"golang.org/x/sync/errgroup"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"k8s.io/utils/ptr"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	v1 "cozy.dev/cozy/operators/api/v1alpha1"
)

const (
	// FieldOwner is the one field manager of everything the operator
	// applies.
	FieldOwner = "cozy-operator"
	// Finalizer holds a TenantCluster until its children are gone, in
	// order.
	Finalizer = "tenancy.cozy.dev/cleanup"
	// AnnotationAppliedHash is the hash of what the operator last applied
	// to a child; an equal hash means there is nothing to send.
	AnnotationAppliedHash = "tenancy.cozy.dev/applied-hash"
)

// Reconciler keeps a TenantCluster's children as Desired and
// DesiredAddons build them, and its status as the children report.
type Reconciler struct {
	Client   client.Client
	Recorder events.EventRecorder
	Addons   AddonConfig
	// WorkerImages is where node groups that name no image find theirs.
	WorkerImages WorkerImages
	// NoLoadBalancer says that Services of type LoadBalancer get no
	// address here (the platform has no pool): a TenantCluster exposed
	// so says why its control plane waits.
	NoLoadBalancer bool
	// PermittedGPUs are the device names the platform's KubeVirt lists
	// in permittedHostDevices; a group asking for another is held.
	PermittedGPUs []string

	// applied remembers the generation each child had after the
	// operator's last apply, so a change by someone else (a new
	// generation, same hash annotation) is put back.
	applied sync.Map
	// writer creates and applies children, imageChecks asks the
	// registry for worker images (SetupWithManager makes both).
	writer      *writer
	imageChecks *imageChecks
}

// Reconcile is level-based: it reads the TenantCluster and its children
// from the cache and does whatever is missing, whatever came before.
func (r *Reconciler) Reconcile(ctx context.Context, req ctrl.Request) (res ctrl.Result, err error) {
	start := time.Now()
	defer func() { observeReconcile(start, res, err) }()

	tc := &v1.TenantCluster{}
	if err := r.Client.Get(ctx, req.NamespacedName, tc); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	res, err = r.reconcile(ctx, tc)
	if apierrors.IsConflict(err) {
		// A stale cache: the newer object is on its way and queues
		// another reconcile; retry soon in any case, quietly (not an
		// error in the log, not an Event).
		logf.FromContext(ctx).V(1).Info("conflict; retrying", "error", err.Error())
		return ctrl.Result{RequeueAfter: conflictRetry}, nil
	}
	if err != nil {
		// For the people who own the TenantCluster to see.
		r.event(tc, corev1.EventTypeWarning, "ReconcileFailed", "Reconcile", "%v", err)
	}
	return res, err
}

// conflictRetry is how soon a reconcile that lost an optimistic-lock
// race runs again.
const conflictRetry = 200 * time.Millisecond

func (r *Reconciler) reconcile(ctx context.Context, tc *v1.TenantCluster) (ctrl.Result, error) {
	if !tc.DeletionTimestamp.IsZero() {
		return r.finalize(ctx, tc)
	}
	if !controllerutil.ContainsFinalizer(tc, Finalizer) {
		patch := client.MergeFromWithOptions(tc.DeepCopy(), client.MergeFromWithOptimisticLock{})
		controllerutil.AddFinalizer(tc, Finalizer)
		if err := r.Client.Patch(ctx, tc, patch); err != nil {
			return ctrl.Result{}, err
		}
		countWrite("patch", "TenantCluster")
	}

	existing, err := r.list(ctx, tc)
	if err != nil {
		return ctrl.Result{}, err
	}
	o := observe(tc, existing)
	if o.Kubeconfig, err = r.kubeconfigSecret(ctx, tc); err != nil {
		return ctrl.Result{}, err
	}
	cp := readControlPlane(o.ControlPlane)
	versions := plan(tc.Spec.Version, cp, o.MachineDeployments)
	// Groups waiting for their disk are left as they are: none of their
	// objects is applied or pruned, so no VM is made to fail its import.
	held := r.heldGroups(ctx, tc, o, versions)
	build := tc
	if len(held) > 0 {
		build = tc.DeepCopy()
		build.Spec.NodeGroups = slices.DeleteFunc(build.Spec.NodeGroups, func(g v1.NodeGroup) bool { _, ok := held[g.Name]; return ok })
	}
	// The CRD's validation makes build errors unreachable; if one gets
	// through, retrying will not help (ReconcileFailed says why).
	children, err := DesiredAt(build, versions, r.WorkerImages)
	if err != nil {
		return ctrl.Result{}, reconcile.TerminalError(err)
	}
	desired := children.All()
	addons, keepAddons, err := r.desiredAddons(tc, o)
	if err != nil {
		return ctrl.Result{}, reconcile.TerminalError(err)
	}
	desired = append(desired, addons...)

	var res ctrl.Result
	for _, h := range held {
		if h.Reason == ReasonWorkerImageMissing {
			res.RequeueAfter = workerImageRetry // someone may push it
		}
	}
	facts := platformFacts{Held: held, NoLoadBalancer: r.NoLoadBalancer}
	if !cp.Ready || cp.Status != versions.ControlPlane {
		if facts.ControlPlaneImagesMissing = r.missingControlPlaneImages(ctx, tc, versions.ControlPlane); facts.ControlPlaneImagesMissing != "" {
			res.RequeueAfter = workerImageRetry // someone may push them
		}
	}
	r.announceUpgrade(tc, cp, versions, o)
	created, err := r.applyAll(ctx, desired, existing)
	if err != nil {
		return ctrl.Result{}, err
	}
	if created > 0 {
		r.event(tc, corev1.EventTypeNormal, "Created", "Apply", "created %d objects", created)
	}
	if err := r.prune(ctx, tc, desired, existing, keepAddons, held); err != nil {
		return ctrl.Result{}, err
	}
	if created > 0 {
		// The cache has not seen the new children yet, so a status now
		// would be stale and written twice; their watch events bring the
		// TenantCluster back.
		return res, nil
	}
	return res, r.updateStatus(ctx, tc, computeStatus(tc, o, versions, EnabledAddons(tc), facts))
}

// applyParallelism bounds the applies one reconcile has in flight. The
// API server does not check references between Cluster API objects, so
// their order does not matter, and a new cluster's dozen objects cost a
// round trip or two instead of twelve.
const applyParallelism = 6

// applyAll applies the children and counts those that did not exist.
func (r *Reconciler) applyAll(ctx context.Context, desired []*unstructured.Unstructured, existing map[objectKey]client.Object) (int, error) {
	var created atomic.Int32
	err := inWaves(desired, func(u *unstructured.Unstructured) error {
		did, err := r.apply(ctx, u, existing)
		if err != nil {
			return fmt.Errorf("apply %s %s: %w", u.GetKind(), u.GetName(), err)
		}
		if did && existing[keyOf(u)] == nil {
			created.Add(1)
		}
		return nil
	})
	return int(created.Load()), err
}

// inWaves runs f for every child, applyParallelism at once: Roles first,
// since the API server checks a RoleBinding against the Role it grants
// (RBAC escalation rules), so the Role must exist; then the rest.
func inWaves(desired []*unstructured.Unstructured, f func(*unstructured.Unstructured) error) error {
	for _, wave := range [][]*unstructured.Unstructured{
		slices.DeleteFunc(slices.Clone(desired), func(u *unstructured.Unstructured) bool { return u.GetKind() != "Role" }),
		slices.DeleteFunc(slices.Clone(desired), func(u *unstructured.Unstructured) bool { return u.GetKind() == "Role" }),
	} {
		// No shared cancellation: one failed apply must not stop the
		// others, or a pair that fails together would fail forever.
		var g errgroup.Group
		g.SetLimit(applyParallelism)
		for _, u := range wave {
			g.Go(func() error { return f(u) })
		}
		if err := g.Wait(); err != nil {
			return err
		}
	}
	return nil
}

// desiredAddons are the add-ons' objects once the tenant has an API
// endpoint and a kubeconfig Secret. Until then keep is true: add-ons
// already made stay even if the Secret goes away for a while, since
// removing them is for the finalizer or the TenantCluster's toggles.
func (r *Reconciler) desiredAddons(tc *v1.TenantCluster, o Observed) (objs []*unstructured.Unstructured, keep bool, err error) {
	ep := clusterv1.APIEndpoint{}
	if o.Cluster != nil {
		ep = o.Cluster.Spec.ControlPlaneEndpoint
	}
	if o.Kubeconfig == "" || !ep.IsValid() {
		return nil, true, nil
	}
	objs, err = DesiredAddons(tc, r.Addons, ep.Host, ep.Port)
	return objs, false, err
}

// objectKey names a child.
type objectKey struct {
	GVK  schema.GroupVersionKind
	Name string
}

func keyOf(u *unstructured.Unstructured) objectKey {
	return objectKey{GVK: u.GroupVersionKind(), Name: u.GetName()}
}

// list reads every child of the TenantCluster from the cache, by label.
func (r *Reconciler) list(ctx context.Context, tc *v1.TenantCluster) (map[objectKey]client.Object, error) {
	out := map[objectKey]client.Object{}
	opts := []client.ListOption{client.InNamespace(tc.Namespace), client.MatchingLabels{LabelTenantCluster: tc.Name}}
	for _, k := range childKinds {
		objs, err := listKind(ctx, r.Client, k, opts...)
		if err != nil {
			if isNoKind(err) {
				continue // that provider is not installed; applying will say so
			}
			return nil, fmt.Errorf("list %s: %w", k.GVK.Kind, err)
		}
		for _, obj := range objs {
			if !ownedBy(obj, tc) {
				continue
			}
			out[objectKey{GVK: k.GVK, Name: obj.GetName()}] = obj
		}
	}
	return out, nil
}

// listKind lists one kind of child from the cache: into its Go type where
// the operator reads the object (newList), else as unstructured objects or
// metadata only, as the kind's Read says.
func listKind(ctx context.Context, c client.Client, k childKind, opts ...client.ListOption) ([]client.Object, error) {
	list := newList(k)
	if err := c.List(ctx, list, opts...); err != nil {
		return nil, err
	}
	items, err := apimeta.ExtractList(list) // pointers into list's items
	if err != nil {
		return nil, err
	}
	out := make([]client.Object, 0, len(items))
	for _, item := range items {
		obj := item.(client.Object)
		if pm, ok := obj.(*metav1.PartialObjectMetadata); ok {
			pm.SetGroupVersionKind(k.GVK) // a metadata list's items come without it
		}
		out = append(out, obj)
	}
	return out, nil
}

// typedLists are the children the operator reads into their Go types.
var typedLists = map[schema.GroupVersionKind]func() client.ObjectList{
	gvkCluster:           func() client.ObjectList { return &clusterv1.ClusterList{} },
	gvkMachineDeployment: func() client.ObjectList { return &clusterv1.MachineDeploymentList{} },
	gvkHelmRelease:       func() client.ObjectList { return &helmv2.HelmReleaseList{} },
	gvkDeployment:        func() client.ObjectList { return &appsv1.DeploymentList{} },
}

// newList is an empty list for one kind of child.
func newList(k childKind) client.ObjectList {
	if typed, ok := typedLists[k.GVK]; ok {
		return typed()
	}
	listGVK := k.GVK.GroupVersion().WithKind(k.GVK.Kind + "List")
	if k.Read == readUnstructured {
		l := &unstructured.UnstructuredList{}
		l.SetGroupVersionKind(listGVK)
		return l
	}
	l := &metav1.PartialObjectMetadataList{}
	l.SetGroupVersionKind(listGVK)
	return l
}

func ownedBy(obj client.Object, tc *v1.TenantCluster) bool {
	for _, ref := range obj.GetOwnerReferences() {
		if ref.UID == tc.UID && ref.Controller != nil && *ref.Controller {
			return true
		}
	}
	return false
}

// observe picks, from the children, what the status and the upgrade
// plan read.
func observe(tc *v1.TenantCluster, existing map[objectKey]client.Object) Observed {
	o := Observed{
		MachineDeployments: map[string]*clusterv1.MachineDeployment{},
		HelmReleases:       map[string]*helmv2.HelmRelease{},
		Deployments:        map[string]*appsv1.Deployment{},
	}
	for key, obj := range existing {
		switch x := obj.(type) {
		case *clusterv1.Cluster:
			if key.Name == tc.Name {
				o.Cluster = x
			}
		case *unstructured.Unstructured:
			if key.GVK == gvkKamaji && key.Name == tc.Name {
				o.ControlPlane = x
			}
		case *clusterv1.MachineDeployment:
			o.MachineDeployments[x.Labels[LabelNodeGroup]] = x
		case *helmv2.HelmRelease:
			o.HelmReleases[x.Labels[LabelAddon]] = x
		case *appsv1.Deployment:
			o.Deployments[x.Labels[LabelAddon]] = x
		}
	}
	return o
}

// kubeconfigSecret is the name of the tenant's kubeconfig Secret if
// Cluster API has written it.
func (r *Reconciler) kubeconfigSecret(ctx context.Context, tc *v1.TenantCluster) (string, error) {
	s := &metav1.PartialObjectMetadata{}
	s.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("Secret"))
	name := KubeconfigSecret(tc.Name)
	if err := r.Client.Get(ctx, types.NamespacedName{Namespace: tc.Namespace, Name: name}, s); err != nil {
		return "", client.IgnoreNotFound(err)
	}
	return name, nil
}

// apply sends a child to the API server with server-side apply, unless
// the child already carries the hash of exactly this object and nobody
// changed it since: a converged cluster costs no writes.
func (r *Reconciler) apply(ctx context.Context, u *unstructured.Unstructured, existing map[objectKey]client.Object) (bool, error) {
	hash := hashObject(u)
	ann := u.GetAnnotations()
	if ann == nil {
		ann = map[string]string{}
	}
	ann[AnnotationAppliedHash] = hash
	u.SetAnnotations(ann)

	key := keyOf(u)
	cacheKey := appliedKey(u.GetNamespace(), key)
	cur := existing[key]
	if cur != nil && cur.GetAnnotations()[AnnotationAppliedHash] == hash {
		gen, seen := r.applied.Load(cacheKey)
		if !seen || gen.(int64) == cur.GetGeneration() {
			return false, nil
		}
	}
	if k, _ := kindOf(key.GVK); k.Template && cur == nil {
		// A template is named by its content, so under one name it never
		// changes and no field of it is ever dropped: whether its fields
		// belong to a create or an apply makes no difference, and a POST
		// costs the API server less than a server-side apply that creates
		// (TestBenchRequestCosts). A put-back after someone edited it is
		// an apply, like any other child's.
		gen, err := r.writer.create(ctx, u)
		if err == nil {
			countWrite("create", key.GVK.Kind)
			r.applied.Store(cacheKey, gen)
			return true, nil
		}
		if !apierrors.IsAlreadyExists(err) {
			return false, err
		}
		// The cache was behind: apply over what is there.
	}
	gen, err := r.writer.apply(ctx, u)
	if err != nil {
		return false, err
	}
	countWrite("apply", key.GVK.Kind)
	r.applied.Store(cacheKey, gen)
	return true, nil
}

// appliedKey names a child in Reconciler.applied.
func appliedKey(namespace string, key objectKey) string {
	return namespace + "/" + key.Name + "/" + key.GVK.String()
}

// hashObject hashes what the operator means to apply. The builders never
// set the hash annotation, and apply hashes before it adds it.
func hashObject(u *unstructured.Unstructured) string {
	data, err := json.Marshal(u.Object)
	if err != nil {
		panic(err) // built from our own types
	}
	sum := sha256.Sum256(data)
	return hex.EncodeToString(sum[:])[:16]
}

// prune deletes children that are no longer wanted: the objects of a
// removed node group or a disabled add-on, and old templates once no
// MachineDeployment or MachineSet refers to them.
func (r *Reconciler) prune(ctx context.Context, tc *v1.TenantCluster, desired []*unstructured.Unstructured, existing map[objectKey]client.Object, keepAddons bool, held map[string]hold) error {
	want := map[objectKey]bool{}
	for _, u := range desired {
		want[keyOf(u)] = true
	}
	var inUse map[string]bool
	var pruned []string
	for key, obj := range existing {
		if want[key] || !obj.GetDeletionTimestamp().IsZero() {
			continue
		}
		k, _ := kindOf(key.GVK)
		if keepAddons && obj.GetLabels()[LabelAddon] != "" {
			continue
		}
		if g := obj.GetLabels()[LabelNodeGroup]; g != "" {
			if _, ok := held[g]; ok {
				continue // a held group keeps what it has
			}
		}
		if key.GVK == gvkCluster || key.GVK == gvkKamaji || key.GVK == gvkKubevirtCluster {
			continue // only the finalizer removes the cluster itself
		}
		if k.Template {
			if inUse == nil {
				var err error
				if inUse, err = r.templatesInUse(ctx, tc, existing); err != nil {
					return err
				}
			}
			if inUse[key.GVK.Kind+"/"+key.Name] {
				continue
			}
		}
		if err := r.delete(ctx, obj, key.GVK); err != nil {
			return err
		}
		pruned = append(pruned, key.GVK.Kind+" "+key.Name)
	}
	if len(pruned) > 0 {
		slices.Sort(pruned)
		r.event(tc, corev1.EventTypeNormal, "Pruned", "Delete", "deleted %s", strings.Join(pruned, ", "))
	}
	return nil
}

// templatesInUse are the templates ("Kind/name") the cluster's
// MachineDeployments and MachineSets still refer to: a MachineSet being
// scaled down during a rollout may still need its old template.
func (r *Reconciler) templatesInUse(ctx context.Context, tc *v1.TenantCluster, existing map[objectKey]client.Object) (map[string]bool, error) {
	used := map[string]bool{}
	add := func(s clusterv1.MachineSpec) {
		used[s.InfrastructureRef.Kind+"/"+s.InfrastructureRef.Name] = true
		used[s.Bootstrap.ConfigRef.Kind+"/"+s.Bootstrap.ConfigRef.Name] = true
	}
	for _, obj := range existing {
		if md, ok := obj.(*clusterv1.MachineDeployment); ok {
			add(md.Spec.Template.Spec)
		}
	}
	var sets clusterv1.MachineSetList
	if err := r.Client.List(ctx, &sets, client.InNamespace(tc.Namespace), client.MatchingLabels{clusterv1.ClusterNameLabel: tc.Name}); err != nil && !isNoKind(err) {
		return nil, fmt.Errorf("list MachineSets: %w", err)
	}
	for _, ms := range sets.Items {
		add(ms.Spec.Template.Spec)
	}
	return used, nil
}

func (r *Reconciler) delete(ctx context.Context, obj client.Object, gvk schema.GroupVersionKind) error {
	pm := &metav1.PartialObjectMetadata{}
	pm.SetGroupVersionKind(gvk)
	pm.SetNamespace(obj.GetNamespace())
	pm.SetName(obj.GetName())
	err := r.Client.Delete(ctx, pm, client.Preconditions{UID: ptr.To(obj.GetUID())}, client.PropagationPolicy(metav1.DeletePropagationBackground))
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("delete %s %s: %w", gvk.Kind, obj.GetName(), err)
	}
	r.applied.Delete(appliedKey(obj.GetNamespace(), objectKey{GVK: gvk, Name: obj.GetName()}))
	countWrite("delete", gvk.Kind)
	return nil
}

// updateStatus writes the status if it changed.
func (r *Reconciler) updateStatus(ctx context.Context, tc *v1.TenantCluster, st v1.TenantClusterStatus) error {
	if equality.Semantic.DeepEqual(tc.Status, st) {
		return nil
	}
	old := tc.Status.Phase
	patch := client.MergeFromWithOptions(tc.DeepCopy(), client.MergeFromWithOptimisticLock{})
	tc.Status = st
	if err := r.Client.Status().Patch(ctx, tc, patch); err != nil {
		return fmt.Errorf("update status: %w", err)
	}
	countWrite("status", "TenantCluster")
	// The first phase is no news: the Created event says it.
	if old != st.Phase && old != "" {
		r.event(tc, corev1.EventTypeNormal, string(st.Phase), "Status", "phase %s", phaseChange(old, st.Phase))
	}
	return nil
}

func phaseChange(from, to v1.Phase) string {
	if from == "" {
		return string(to)
	}
	return string(from) + " → " + string(to)
}

// announceUpgrade records the steps of an upgrade as Events.
func (r *Reconciler) announceUpgrade(tc *v1.TenantCluster, cp controlPlaneState, v Versions, o Observed) {
	if cp.Spec != "" && cp.Spec != v.ControlPlane {
		r.event(tc, corev1.EventTypeNormal, "UpgradingControlPlane", "Upgrade", "upgrading the control plane from %s to %s", cp.Spec, v.ControlPlane)
	} else if cp.Spec != "" && v.ControlPlane != tc.Spec.Version {
		// Logged, not an Event: it repeats on every reconcile until the
		// workers settle.
		logf.Log.V(1).Info("control plane upgrade waits for rolling workers", "tenantcluster", client.ObjectKeyFromObject(tc))
	}
	for name, md := range o.MachineDeployments {
		if want := v.Group(name); md.Spec.Template.Spec.Version != want {
			r.event(tc, corev1.EventTypeNormal, "UpgradingNodeGroup", "Upgrade", "upgrading node group %s from %s to %s", name, md.Spec.Template.Spec.Version, want)
		}
	}
}

func (r *Reconciler) event(tc *v1.TenantCluster, typ, reason, action, note string, args ...any) {
	if r.Recorder != nil {
		r.Recorder.Eventf(tc, nil, typ, reason, action, note, args...)
	}
}
