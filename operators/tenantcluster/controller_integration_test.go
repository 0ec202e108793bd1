//go:build integration

package tenantcluster

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	helmv2 "github.com/fluxcd/helm-controller/api/v2"
	dto "github.com/prometheus/client_model/go"
	"go.uber.org/zap/zapcore"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"cozy.dev/cozy/internal/testing/poll"
	"cozy.dev/cozy/internal/testing/testenv"
	v1 "cozy.dev/cozy/operators/api/v1alpha1"
	"cozy.dev/cozy/platform/render"
)

// operatorEnv is a real kube-apiserver with the upstream CRDs and ours,
// and the operator's controller running against it in-process.
type operatorEnv struct {
	env *testenv.Env
	c   client.Client
	// images is the operator's worker image registry, on loopback.
	images WorkerImages
}

// startAPIServer is a real kube-apiserver with the upstream CRDs and
// our TenantCluster CRD as the chart ships it, and a client that knows
// the operator's types.
func startAPIServer(t *testing.T) (*testenv.Env, *runtime.Scheme) {
	t.Helper()
	scheme, err := Scheme()
	if err != nil {
		t.Fatal(err)
	}
	// Reconcile errors go to stderr, which go test shows for a failure
	// (and controller-runtime does not warn that no logger was set).
	ctrl.SetLogger(zap.New(zap.WriteTo(os.Stderr), zap.Level(zapcore.ErrorLevel)))
	return testenv.Start(t, testenv.Options{
		Scheme:   scheme,
		CRDFiles: []string{filepath.Join("..", "..", "charts", "cozy-operator", "crds", "tenancy.cozy.dev_tenantclusters.yaml")},
	}), scheme
}

func startOperator(t *testing.T) *operatorEnv {
	t.Helper()
	env, scheme := startAPIServer(t)
	images, _ := workerRegistry(t, testVersions...)
	mgr := newManager(t, asOperator(t, env), scheme, false, images)
	stop := run(t, mgr)
	t.Cleanup(stop)
	return &operatorEnv{env: env, c: env.Client, images: images}
}

// newManager is the operator's manager as cmd/cozy-operator builds it,
// with or without leader election (a Lease in cozy-system).
func newManager(t *testing.T, cfg *rest.Config, scheme *runtime.Scheme, leaderElect bool, images WorkerImages, opts ...func(*Reconciler)) ctrl.Manager {
	t.Helper()
	mo, err := ManagerOptions()
	if err != nil {
		t.Fatal(err)
	}
	mo.Scheme = scheme
	mo.Metrics, mo.HealthProbeBindAddress = metricsserver.Options{BindAddress: "0"}, "0"
	mo.LeaderElection, mo.LeaderElectionID, mo.LeaderElectionNamespace = leaderElect, "cozy-operator.tenancy.cozy.dev", "cozy-system"
	mo.LeaderElectionReleaseOnCancel = true
	// Several managers run in one test binary.
	mo.Controller = config.Controller{SkipNameValidation: ptr.To(true)}
	mgr, err := ctrl.NewManager(cfg, mo)
	if err != nil {
		t.Fatal(err)
	}
	r := &Reconciler{Recorder: mgr.GetEventRecorder("cozy-operator"), Addons: DefaultAddonConfig(), WorkerImages: images,
		PermittedGPUs: []string{"nvidia.com/GA102GL_A10"}}
	for _, o := range opts {
		o(r)
	}
	if err := r.SetupWithManager(mgr, 4); err != nil {
		t.Fatal(err)
	}
	return mgr
}

// run starts a manager; the function it returns stops it and reports
// its error.
func run(t *testing.T, mgr ctrl.Manager) func() {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	var once sync.Once
	return func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("manager: %v", err)
			}
		})
	}
}

// asOperator returns a config that acts as the operator's
// ServiceAccount, bound to the ClusterRole of the cozy-operator chart as
// Helm renders it: every test then also proves the chart grants what the
// operator needs (RBAC escalation checks included: it creates Roles).
func asOperator(t *testing.T, env *testenv.Env) *rest.Config {
	t.Helper()
	ctx := context.Background()
	if err := env.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "cozy-system"}}); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"serviceaccount.yaml", "rbac.yaml"} {
		docs, err := render.OperatorTemplate(nil, f)
		if err != nil || len(docs) == 0 {
			t.Fatalf("chart template %s: %v (%d documents)", f, err, len(docs))
		}
		for _, d := range docs {
			if err := env.Client.Create(ctx, d); err != nil {
				t.Fatalf("%s %s: %v", d.GetKind(), d.GetName(), err)
			}
		}
	}
	cfg := rest.CopyConfig(env.Config)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: "system:serviceaccount:cozy-system:cozy-operator"}
	// The API server enforces RBAC: what the chart does not grant fails.
	sa, err := client.New(cfg, client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := sa.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "not-granted"}}); !apierrors.IsForbidden(err) {
		t.Fatalf("the operator's ServiceAccount created a Namespace (%v): RBAC is not enforced", err)
	}
	return cfg
}

// installFinalizerPolicy creates the chart's mutating admission policy
// that gives new TenantClusters their finalizer, and waits until the API
// server applies it (a dry-run create shows the finalizer).
func installFinalizerPolicy(t *testing.T, env *testenv.Env) {
	t.Helper()
	ctx := context.Background()
	docs, err := render.OperatorTemplate(nil, "finalizer-policy.yaml")
	if err != nil || len(docs) != 2 {
		t.Fatalf("chart template finalizer-policy.yaml: %v (%d documents, want the policy and its binding)", err, len(docs))
	}
	for _, d := range docs {
		if err := env.Client.Create(ctx, d); err != nil {
			t.Fatalf("%s %s: %v", d.GetKind(), d.GetName(), err)
		}
	}
	if err := env.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "policy-probe"}}); err != nil {
		t.Fatal(err)
	}
	poll.Within(t, waitLimit, 100*time.Millisecond, "the finalizer policy in force", func() error {
		probe := fixture(t)
		probe.UID, probe.ResourceVersion, probe.Namespace = "", "", "policy-probe"
		if err := env.Client.Create(ctx, probe, client.DryRunAll); err != nil {
			return err
		}
		if !controllerutil.ContainsFinalizer(probe, Finalizer) {
			return fmt.Errorf("a new TenantCluster has finalizers %v", probe.Finalizers)
		}
		return nil
	})
}

// create makes the namespace and the TenantCluster of the fixture, with
// the add-on toggles given.
func (e *operatorEnv) create(t *testing.T, ctx context.Context, mutate func(*v1.TenantCluster)) *v1.TenantCluster {
	t.Helper()
	tc := fixture(t)
	tc.UID, tc.ResourceVersion = "", ""
	if mutate != nil {
		mutate(tc)
	}
	if err := e.c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: tc.Namespace}}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	if err := e.c.Create(ctx, tc); err != nil {
		t.Fatal(err)
	}
	return tc
}

// waitLimit is how long a test waits for the operator: generous enough
// for a loaded CI machine.
const waitLimit = 90 * time.Second

func (e *operatorEnv) get(ctx context.Context, tc *v1.TenantCluster) (*v1.TenantCluster, error) {
	out := &v1.TenantCluster{}
	return out, e.c.Get(ctx, client.ObjectKeyFromObject(tc), out)
}

// children lists what exists with the TenantCluster's label, by
// "Kind/name".
func (e *operatorEnv) children(ctx context.Context, tc *v1.TenantCluster) (map[string]*unstructured.Unstructured, error) {
	out := map[string]*unstructured.Unstructured{}
	for _, k := range childKinds {
		l := &unstructured.UnstructuredList{}
		l.SetGroupVersionKind(k.GVK.GroupVersion().WithKind(k.GVK.Kind + "List"))
		if err := e.c.List(ctx, l, client.InNamespace(tc.Namespace), client.MatchingLabels{LabelTenantCluster: tc.Name}); err != nil {
			return nil, err
		}
		for i := range l.Items {
			out[k.GVK.Kind+"/"+l.Items[i].GetName()] = &l.Items[i]
		}
	}
	return out, nil
}

// wantChildren waits until exactly the objects Desired builds exist.
func (e *operatorEnv) wantChildren(t *testing.T, ctx context.Context, tc *v1.TenantCluster, v Versions, extra ...string) map[string]*unstructured.Unstructured {
	t.Helper()
	var got map[string]*unstructured.Unstructured
	poll.Within(t, waitLimit, 100*time.Millisecond, "children", func() error {
		cur, err := e.get(ctx, tc)
		if err != nil {
			return err
		}
		want, err := DesiredAt(cur, v, e.images)
		if err != nil {
			return err
		}
		names := slices.Clone(extra)
		for _, u := range want.All() {
			names = append(names, u.GetKind()+"/"+u.GetName())
		}
		if got, err = e.children(ctx, cur); err != nil {
			return err
		}
		var have []string
		for k := range got {
			have = append(have, k)
		}
		slices.Sort(names)
		slices.Sort(have)
		if !slices.Equal(names, have) {
			return fmt.Errorf("children\n have %v\n want %v\n warnings: %v", have, names, e.warnings(ctx, tc))
		}
		for _, u := range want.All() {
			g := got[u.GetKind()+"/"+u.GetName()]
			if v, _, _ := unstructured.NestedString(u.Object, "spec", "version"); v != "" {
				if gv, _, _ := unstructured.NestedString(g.Object, "spec", "version"); gv != v {
					// What the upgrade plan reads: a MachineDeployment
					// whose status lags its generation holds the control
					// plane.
					var mds []string
					for k, o := range got {
						if o.GetKind() == gvkMachineDeployment.Kind {
							og, _, _ := unstructured.NestedInt64(o.Object, "status", "observedGeneration")
							mds = append(mds, fmt.Sprintf("%s generation %d observed %d template %s", k, o.GetGeneration(), og, infraRef(o)))
						}
					}
					slices.Sort(mds)
					return fmt.Errorf("%s %s: version %s, want %s (%s)", u.GetKind(), u.GetName(), gv, v, strings.Join(mds, ", "))
				}
			}
			if v, _, _ := unstructured.NestedString(u.Object, "spec", "template", "spec", "version"); v != "" {
				if gv, _, _ := unstructured.NestedString(g.Object, "spec", "template", "spec", "version"); gv != v {
					return fmt.Errorf("%s %s: version %s, want %s", u.GetKind(), u.GetName(), gv, v)
				}
			}
		}
		return nil
	})
	return got
}

// warnings are the operator's Warning Events on the TenantCluster.
func (e *operatorEnv) warnings(ctx context.Context, tc *v1.TenantCluster) []string {
	var l eventsv1.EventList
	if err := e.c.List(ctx, &l, client.InNamespace(tc.Namespace)); err != nil {
		return []string{err.Error()}
	}
	var out []string
	for _, ev := range l.Items {
		if ev.Type == corev1.EventTypeWarning && ev.Regarding.Name == tc.Name {
			out = append(out, ev.Reason+": "+ev.Note)
		}
	}
	return out
}

func condition(tc *v1.TenantCluster, typ string) string {
	c := apimeta.FindStatusCondition(tc.Status.Conditions, typ)
	if c == nil {
		return "<none>"
	}
	return fmt.Sprintf("%s/%s: %s", c.Status, c.Reason, c.Message)
}

// TestOperatorCreatesChildren: a new TenantCluster gets every Cluster API
// object, owned by it, with the fields the builders set, a finalizer,
// and an honest status (nothing runs them here, so: provisioning).
func TestOperatorCreatesChildren(t *testing.T) {
	e := startOperator(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	tc := e.create(t, ctx, nil)

	got := e.wantChildren(t, ctx, tc, Uniform(tc.Spec.Version))
	cur, _ := e.get(ctx, tc)
	for name, u := range got {
		refs := u.GetOwnerReferences()
		if len(refs) != 1 || refs[0].UID != cur.UID || !ptr.Deref(refs[0].Controller, false) {
			t.Errorf("%s: owner references %+v, want the TenantCluster as controller", name, refs)
		}
		if u.GetAnnotations()[AnnotationAppliedHash] == "" {
			t.Errorf("%s: no %s annotation", name, AnnotationAppliedHash)
		}
		for _, mf := range u.GetManagedFields() {
			if mf.Operation == metav1.ManagedFieldsOperationApply && mf.Manager != FieldOwner {
				t.Errorf("%s: applied by %q", name, mf.Manager)
			}
		}
	}
	md := got["MachineDeployment/acme-md0"]
	if r, _, _ := unstructured.NestedInt64(md.Object, "spec", "replicas"); r != 3 {
		t.Errorf("MachineDeployment acme-md0: replicas %d, want 3", r)
	}
	if n, _, _ := unstructured.NestedString(md.Object, "spec", "template", "spec", "infrastructureRef", "name"); got["KubevirtMachineTemplate/"+n] == nil {
		t.Errorf("MachineDeployment acme-md0 refers to KubevirtMachineTemplate %q, which does not exist", n)
	}

	poll.Within(t, waitLimit, 100*time.Millisecond, "status", func() error {
		cur, err := e.get(ctx, tc)
		if err != nil {
			return err
		}
		if !controllerutil.ContainsFinalizer(cur, Finalizer) {
			return fmt.Errorf("no finalizer")
		}
		st := cur.Status
		if st.ObservedGeneration != cur.Generation || st.Phase != v1.PhaseProvisioning || st.Workers != "0/4" {
			return fmt.Errorf("status %+v", st)
		}
		if c := condition(cur, v1.ConditionControlPlaneReady); !strings.HasPrefix(c, "False/Provisioning") {
			return fmt.Errorf("ControlPlaneReady %s", c)
		}
		if c := condition(cur, v1.ConditionAddonsReady); !strings.HasPrefix(c, "False/"+ReasonWaitingKubeconfig) {
			return fmt.Errorf("AddonsReady %s", c)
		}
		if c := condition(cur, v1.ConditionReady); !strings.HasPrefix(c, "False/") {
			return fmt.Errorf("Ready %s", c)
		}
		return nil
	})
	assertIdle(t, ctx, e, tc)
}

// assertIdle: once converged, the operator sends nothing, and nothing
// it owns changes.
func assertIdle(t *testing.T, ctx context.Context, e *operatorEnv, tc *v1.TenantCluster) {
	t.Helper()
	before := totalWrites(t)
	kids, err := e.children(ctx, tc)
	if err != nil {
		t.Fatal(err)
	}
	cur, _ := e.get(ctx, tc)
	// Something that makes the controller reconcile without changing
	// what it wants: a label on the TenantCluster.
	patch := client.MergeFrom(cur.DeepCopy())
	cur.Labels = map[string]string{"touched": fmt.Sprint(time.Now().UnixNano())}
	if err := e.c.Patch(ctx, cur, patch); err != nil {
		t.Fatal(err)
	}
	time.Sleep(3 * time.Second)
	if after := totalWrites(t); after != before {
		t.Errorf("the operator sent %v writes after convergence", after-before)
	}
	again, err := e.children(ctx, tc)
	if err != nil {
		t.Fatal(err)
	}
	for name, u := range kids {
		if a := again[name]; a == nil || a.GetResourceVersion() != u.GetResourceVersion() {
			t.Errorf("%s changed while idle", name)
		}
	}
}

func totalWrites(t *testing.T) float64 {
	t.Helper()
	families, err := metrics.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var sum float64
	for _, f := range families {
		if f.GetName() != "cozy_operator_writes_total" {
			continue
		}
		for _, m := range f.Metric {
			sum += counterValue(m)
		}
	}
	return sum
}

func counterValue(m *dto.Metric) float64 { return m.GetCounter().GetValue() }

// TestOperatorNodeGroupChange: a changed node group gets a new machine
// template, its MachineDeployment switches to it, and the old template is
// removed once no MachineSet still refers to it. A removed group's
// objects go.
func TestOperatorNodeGroupChange(t *testing.T) {
	e := startOperator(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	tc := e.create(t, ctx, nil)
	got := e.wantChildren(t, ctx, tc, Uniform(tc.Spec.Version))
	oldMD := got["MachineDeployment/acme-md0"]
	oldTemplate, _, _ := unstructured.NestedString(oldMD.Object, "spec", "template", "spec", "infrastructureRef", "name")

	// A MachineSet of the old template, as Cluster API keeps during a
	// rollout.
	ms := &clusterv1.MachineSet{
		ObjectMeta: metav1.ObjectMeta{Name: "acme-md0-old", Namespace: tc.Namespace, Labels: map[string]string{clusterv1.ClusterNameLabel: tc.Name}},
		Spec: clusterv1.MachineSetSpec{
			ClusterName: tc.Name,
			Selector:    metav1.LabelSelector{MatchLabels: map[string]string{"set": "old"}},
			Template: clusterv1.MachineTemplateSpec{
				ObjectMeta: clusterv1.ObjectMeta{Labels: map[string]string{"set": "old"}},
				Spec: clusterv1.MachineSpec{
					ClusterName: tc.Name,
					Bootstrap: clusterv1.Bootstrap{ConfigRef: clusterv1.ContractVersionedObjectReference{
						APIGroup: "bootstrap.cluster.x-k8s.io", Kind: kindKubeadmTemplate, Name: "unrelated"}},
					InfrastructureRef: clusterv1.ContractVersionedObjectReference{APIGroup: capkGroup, Kind: kindKubevirtTemplate, Name: oldTemplate},
				},
			},
		},
	}
	if err := e.c.Create(ctx, ms); err != nil {
		t.Fatal(err)
	}

	e.modify(t, ctx, tc, func(cur *v1.TenantCluster) {
		cur.Spec.NodeGroups[0].Resources.Memory = "16Gi"
		cur.Spec.NodeGroups = slices.DeleteFunc(cur.Spec.NodeGroups, func(g v1.NodeGroup) bool { return g.Name == "small" })
	})
	// The old template stays: the MachineSet refers to it.
	got = e.wantChildren(t, ctx, tc, Uniform(tc.Spec.Version), "KubevirtMachineTemplate/"+oldTemplate)
	newTemplate, _, _ := unstructured.NestedString(got["MachineDeployment/acme-md0"].Object, "spec", "template", "spec", "infrastructureRef", "name")
	if newTemplate == oldTemplate {
		t.Fatalf("MachineDeployment still on %s after the memory change", oldTemplate)
	}
	mem, _, _ := unstructured.NestedString(got["KubevirtMachineTemplate/"+newTemplate].Object,
		"spec", "template", "spec", "virtualMachineTemplate", "spec", "template", "spec", "domain", "memory", "guest")
	if mem != "16Gi" {
		t.Errorf("new template's memory %q, want 16Gi", mem)
	}
	// Once the MachineSet is gone, so is the old template.
	if err := e.c.Delete(ctx, ms); err != nil {
		t.Fatal(err)
	}
	e.wantChildren(t, ctx, tc, Uniform(tc.Spec.Version))
}

// TestWriter: the operator's writer against the API server. A create
// gives generation 1 and a second one AlreadyExists (which apply falls
// back from); an unchanged apply keeps the generation, a changed one
// moves it; the fields are the operator's. With fieldValidation=Ignore
// an apply still refuses an unknown field, a create drops it
// (TestServerAcceptsChildren creates every child strictly).
func TestWriter(t *testing.T) {
	env, _ := startAPIServer(t)
	ctx := context.Background()
	tc := fixture(t)
	if err := env.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: tc.Namespace}}); err != nil {
		t.Fatal(err)
	}
	w, err := newWriter(env.Config, mustHTTPClient(t, env.Config), env.Client.RESTMapper())
	if err != nil {
		t.Fatal(err)
	}
	children, err := Desired(tc, tc.Spec.Version, testImages)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := children.Groups[0].MachineTemplate.DeepCopy()
	tmpl.SetOwnerReferences(nil)
	if gen, err := w.create(ctx, tmpl.DeepCopy()); err != nil || gen != 1 {
		t.Fatalf("create %s: generation %d, %v; want 1", tmpl.GetName(), gen, err)
	}
	if _, err := w.create(ctx, tmpl.DeepCopy()); !apierrors.IsAlreadyExists(err) {
		t.Fatalf("second create: %v, want AlreadyExists", err)
	}

	md := children.Groups[0].MachineDeployment.DeepCopy()
	md.SetOwnerReferences(nil)
	gen, err := w.apply(ctx, md.DeepCopy())
	if err != nil || gen != 1 {
		t.Fatalf("apply %s: generation %d, %v; want 1", md.GetName(), gen, err)
	}
	if again, err := w.apply(ctx, md.DeepCopy()); err != nil || again != gen {
		t.Errorf("unchanged apply: generation %d -> %d, %v", gen, again, err)
	}
	changed := md.DeepCopy()
	if err := unstructured.SetNestedField(changed.Object, int64(300), "spec", "template", "spec", "minReadySeconds"); err != nil {
		t.Fatal(err)
	}
	if moved, err := w.apply(ctx, changed.DeepCopy()); err != nil || moved != gen+1 {
		t.Errorf("changed apply: generation %d -> %d, %v", gen, moved, err)
	}
	got := &unstructured.Unstructured{}
	got.SetGroupVersionKind(md.GroupVersionKind())
	if err := env.Client.Get(ctx, client.ObjectKeyFromObject(md), got); err != nil {
		t.Fatal(err)
	}
	if m := managers(got); len(m) != 1 || m[0] != FieldOwner+"/Apply" {
		t.Errorf("field managers %v, want %s/Apply alone", m, FieldOwner)
	}

	// Unknown fields: server-side apply refuses them whatever the field
	// validation (it builds a typed patch from the schema); a create
	// drops them.
	if err := unstructured.SetNestedField(changed.Object, "x", "spec", "noSuchField"); err != nil {
		t.Fatal(err)
	}
	if _, err := w.apply(ctx, changed); err == nil || !strings.Contains(err.Error(), "noSuchField: field not declared in schema") {
		t.Errorf("apply with an unknown field: %v, want it refused", err)
	}
	odd := tmpl.DeepCopy()
	odd.SetName(tmpl.GetName() + "-odd")
	if err := unstructured.SetNestedField(odd.Object, "x", "spec", "noSuchField"); err != nil {
		t.Fatal(err)
	}
	if _, err := w.create(ctx, odd); err != nil {
		t.Fatalf("create with an unknown field: %v", err)
	}
	got.SetGroupVersionKind(odd.GroupVersionKind())
	if err := env.Client.Get(ctx, client.ObjectKeyFromObject(odd), got); err != nil {
		t.Fatal(err)
	}
	if _, found, _ := unstructured.NestedFieldNoCopy(got.Object, "spec", "noSuchField"); found {
		t.Error("a create stored the unknown field")
	}
}

func mustHTTPClient(t *testing.T, cfg *rest.Config) *http.Client {
	t.Helper()
	hc, err := rest.HTTPClientFor(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return hc
}

// TestFinalizerPolicy: with the chart's admission policy, the API server
// gives a new TenantCluster the finalizer itself (no operator runs
// here), and keeps the finalizers it came with.
func TestFinalizerPolicy(t *testing.T) {
	env, _ := startAPIServer(t)
	installFinalizerPolicy(t, env)
	ctx := context.Background()
	if err := env.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "tenant-acme"}}); err != nil {
		t.Fatal(err)
	}
	tc := fixture(t)
	tc.UID, tc.ResourceVersion = "", ""
	tc.Finalizers = []string{"example.com/keep"}
	if err := env.Client.Create(ctx, tc); err != nil {
		t.Fatal(err)
	}
	if want := []string{"example.com/keep", Finalizer}; !slices.Equal(tc.Finalizers, want) {
		t.Errorf("finalizers %v, want %v", tc.Finalizers, want)
	}
}

// TestOperatorFieldOwnership: every child's fields belong to the
// operator alone (server-side apply; a POST for the immutable
// templates), so a field the operator stops setting is removed, not left
// behind.
func TestOperatorFieldOwnership(t *testing.T) {
	e := startOperator(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	tc := e.create(t, ctx, nil)
	got := e.wantChildren(t, ctx, tc, Uniform(tc.Spec.Version))
	for name, u := range got {
		// Templates are created with a POST (see apply).
		want := FieldOwner + "/Apply"
		if k, _ := kindOf(u.GroupVersionKind()); k.Template {
			want = FieldOwner + "/Update"
		}
		if ops := managers(u); !slices.Equal(ops, []string{want}) {
			t.Errorf("%s: managers %v, want only %s", name, ops, want)
		}
	}
	md := got["MachineDeployment/acme-gpu"]
	if md.GetAnnotations()[annotationMaxSize] != "4" {
		t.Fatalf("autoscaled group's MachineDeployment has annotations %v", md.GetAnnotations())
	}

	// From autoscaled to a fixed size: the autoscaler's annotations go.
	e.modify(t, ctx, tc, func(cur *v1.TenantCluster) {
		g := &cur.Spec.NodeGroups[1]
		g.MinReplicas, g.MaxReplicas, g.Replicas = nil, nil, ptr.To[int32](2)
	})
	poll.Within(t, waitLimit, 100*time.Millisecond, "the gpu group at a fixed size", func() error {
		md := &unstructured.Unstructured{}
		md.SetGroupVersionKind(gvkMachineDeployment)
		if err := e.c.Get(ctx, client.ObjectKey{Namespace: tc.Namespace, Name: "acme-gpu"}, md); err != nil {
			return err
		}
		replicas, _, _ := unstructured.NestedInt64(md.Object, "spec", "replicas")
		for k := range md.GetAnnotations() {
			if k == annotationMinSize || k == annotationMaxSize || strings.HasPrefix(k, annotationCapacity) {
				return fmt.Errorf("annotation %s still set (replicas %d, managers %v)", k, replicas, managers(md))
			}
		}
		if replicas != 2 {
			return fmt.Errorf("replicas %d, want 2", replicas)
		}
		if ops := managers(md); !slices.Equal(ops, []string{FieldOwner + "/Apply"}) {
			return fmt.Errorf("managers %v, want only %s/Apply", ops, FieldOwner)
		}
		return nil
	})
}

// managers lists an object's field managers as "name/operation".
func managers(u *unstructured.Unstructured) []string {
	var out []string
	for _, m := range u.GetManagedFields() {
		out = append(out, m.Manager+"/"+string(m.Operation))
	}
	slices.Sort(out)
	return out
}

// setControlPlane stands in for Kamaji: it reports the control plane at
// a version, ready.
func (e *operatorEnv) setControlPlane(t *testing.T, ctx context.Context, tc *v1.TenantCluster, version string) {
	t.Helper()
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		cp := &unstructured.Unstructured{}
		cp.SetGroupVersionKind(gvkKamaji)
		if err := e.c.Get(ctx, client.ObjectKeyFromObject(tc), cp); err != nil {
			return err
		}
		cp.Object["status"] = map[string]any{
			"version": version, "ready": true, "replicas": int64(2), "readyReplicas": int64(2), "upToDateReplicas": int64(2),
			"initialization": map[string]any{"controlPlaneInitialized": true},
		}
		return e.c.Status().Update(ctx, cp)
	})
	if err != nil {
		t.Fatal(err)
	}
}

// setWorkers stands in for Cluster API: every MachineDeployment reports
// its machines up to date and ready, or (rolling) not yet.
func (e *operatorEnv) setWorkers(t *testing.T, ctx context.Context, tc *v1.TenantCluster, isRolling bool) {
	t.Helper()
	var mds clusterv1.MachineDeploymentList
	if err := e.c.List(ctx, &mds, client.InNamespace(tc.Namespace), client.MatchingLabels{LabelTenantCluster: tc.Name}); err != nil {
		t.Fatal(err)
	}
	for _, item := range mds.Items {
		err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
			md := &clusterv1.MachineDeployment{}
			if err := e.c.Get(ctx, client.ObjectKeyFromObject(&item), md); err != nil {
				return err
			}
			n := ptr.Deref(md.Spec.Replicas, 0)
			upToDate := n
			if isRolling {
				upToDate = 0
			}
			md.Status = clusterv1.MachineDeploymentStatus{
				ObservedGeneration: md.Generation,
				Replicas:           ptr.To(n), ReadyReplicas: ptr.To(n), AvailableReplicas: ptr.To(n), UpToDateReplicas: ptr.To(upToDate),
			}
			return e.c.Status().Update(ctx, md)
		})
		if err != nil {
			t.Fatal(err)
		}
	}
}

func (e *operatorEnv) setVersion(t *testing.T, ctx context.Context, tc *v1.TenantCluster, version string) {
	t.Helper()
	e.modify(t, ctx, tc, func(cur *v1.TenantCluster) { cur.Spec.Version = version })
}

// modify updates the TenantCluster's spec, again on a conflict with the
// operator's status writes.
func (e *operatorEnv) modify(t *testing.T, ctx context.Context, tc *v1.TenantCluster, f func(*v1.TenantCluster)) {
	t.Helper()
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		cur, err := e.get(ctx, tc)
		if err != nil {
			return err
		}
		f(cur)
		return e.c.Update(ctx, cur)
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestOperatorUpgradeOrder: a version bump moves the control plane
// first; the node groups follow only once it reports the new version
// ready; and a control plane never moves while workers still roll.
func TestOperatorUpgradeOrder(t *testing.T) {
	e := startOperator(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	tc := e.create(t, ctx, func(tc *v1.TenantCluster) { tc.Spec.Version = "v1.35.4" })
	first := e.wantChildren(t, ctx, tc, Uniform("v1.35.4"))
	e.setControlPlane(t, ctx, tc, "v1.35.4")
	e.setWorkers(t, ctx, tc, false)

	e.setVersion(t, ctx, tc, "v1.36.0")
	// The control plane moves; the workers stay.
	e.wantChildren(t, ctx, tc, Versions{ControlPlane: "v1.36.0", Groups: map[string]string{newGroupKey: "v1.35.4"}})
	poll.Within(t, waitLimit, 100*time.Millisecond, "upgrading status", func() error {
		cur, _ := e.get(ctx, tc)
		if cur.Status.Phase != v1.PhaseUpgrading || cur.Status.ObservedGeneration != cur.Generation {
			return fmt.Errorf("phase %s, %s", cur.Status.Phase, condition(cur, v1.ConditionControlPlaneReady))
		}
		return nil
	})
	// Held for a while: still the old workers, on their old VM template
	// (the default disk image follows the group's version, not the
	// TenantCluster's).
	time.Sleep(time.Second)
	held := e.wantChildren(t, ctx, tc, Versions{ControlPlane: "v1.36.0", Groups: map[string]string{newGroupKey: "v1.35.4"}})
	if a, b := infraRef(first["MachineDeployment/acme-md0"]), infraRef(held["MachineDeployment/acme-md0"]); a != b {
		t.Errorf("while the control plane upgrades, node group md0 moved from template %s to %s", a, b)
	}

	// Kamaji reports the new version: the workers follow, onto the new
	// version's image.
	e.setControlPlane(t, ctx, tc, "v1.36.0")
	moved := e.wantChildren(t, ctx, tc, Uniform("v1.36.0"))
	if a, b := infraRef(first["MachineDeployment/acme-md0"]), infraRef(moved["MachineDeployment/acme-md0"]); a == b {
		t.Errorf("node group md0 upgraded and kept template %s (and its disk image)", a)
	}

	// The workers are rolling; another bump waits for them.
	e.setWorkers(t, ctx, tc, true)
	e.setVersion(t, ctx, tc, "v1.37.1")
	time.Sleep(time.Second)
	e.wantChildren(t, ctx, tc, Uniform("v1.36.0"))
	poll.Within(t, waitLimit, 100*time.Millisecond, "held control plane status", func() error {
		cur, _ := e.get(ctx, tc)
		if c := condition(cur, v1.ConditionControlPlaneReady); !strings.Contains(c, "waits for the node groups") {
			return fmt.Errorf("ControlPlaneReady %s", c)
		}
		return nil
	})
	e.setWorkers(t, ctx, tc, false)
	e.wantChildren(t, ctx, tc, Versions{ControlPlane: "v1.37.1", Groups: map[string]string{newGroupKey: "v1.36.0"}})
	e.setControlPlane(t, ctx, tc, "v1.37.1")
	e.wantChildren(t, ctx, tc, Uniform("v1.37.1"))
	e.setWorkers(t, ctx, tc, false)
	poll.Within(t, waitLimit, 100*time.Millisecond, "workers ready", func() error {
		cur, _ := e.get(ctx, tc)
		if c := condition(cur, v1.ConditionWorkersReady); !strings.HasPrefix(c, "True/") || cur.Status.Workers != "4/4" {
			return fmt.Errorf("WorkersReady %s, workers %s", c, cur.Status.Workers)
		}
		if c := condition(cur, v1.ConditionControlPlaneReady); !strings.HasPrefix(c, "True/") {
			return fmt.Errorf("ControlPlaneReady %s", c)
		}
		return nil
	})
}

func infraRef(md *unstructured.Unstructured) string {
	name, _, _ := unstructured.NestedString(md.Object, "spec", "template", "spec", "infrastructureRef", "name")
	return name
}

// standInKamaji does what Kamaji does once a control plane is up: an
// endpoint on the Cluster and the kubeconfig Secret, labelled as Cluster
// API labels it.
func (e *operatorEnv) standInKamaji(t *testing.T, ctx context.Context, tc *v1.TenantCluster) {
	t.Helper()
	cl := &clusterv1.Cluster{}
	if err := e.c.Get(ctx, client.ObjectKeyFromObject(tc), cl); err != nil {
		t.Fatal(err)
	}
	patch := client.MergeFrom(cl.DeepCopy())
	cl.Spec.ControlPlaneEndpoint = clusterv1.APIEndpoint{Host: "api.acme.example.com", Port: 443}
	if err := e.c.Patch(ctx, cl, patch, client.FieldOwner("kamaji")); err != nil {
		t.Fatal(err)
	}
	secret := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: "acme-kubeconfig", Namespace: tc.Namespace, Labels: map[string]string{clusterv1.ClusterNameLabel: tc.Name}},
		Data:       map[string][]byte{"value": []byte("not read by the operator")},
	}
	if err := e.c.Create(ctx, secret); err != nil {
		t.Fatal(err)
	}
}

// allAddonObjects are the fixture's add-on objects, by "Kind/name".
func allAddonObjects() []string {
	var out []string
	for _, a := range []string{AddonCilium, AddonCSINode, AddonMetricsServer} {
		out = append(out, "HelmRelease/acme-"+a)
	}
	for _, a := range []string{AddonCSIController, AddonCCM, AddonClusterAutoscaler} {
		for _, k := range []string{"ServiceAccount", "Role", "RoleBinding", "Deployment"} {
			out = append(out, k+"/acme-"+a)
		}
	}
	return append(out, "ConfigMap/acme-"+AddonCCM)
}

// TestOperatorAddons: add-ons wait for the tenant's kubeconfig Secret,
// then HelmReleases target the tenant through it and the
// management-side controllers run with their own least-privilege
// identity; a disabled add-on is removed; the status follows the
// HelmReleases.
func TestOperatorAddons(t *testing.T) {
	e := startOperator(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	tc := e.create(t, ctx, nil)
	e.wantChildren(t, ctx, tc, Uniform(tc.Spec.Version))

	e.standInKamaji(t, ctx, tc)
	addonObjects := allAddonObjects()
	e.wantChildren(t, ctx, tc, Uniform(tc.Spec.Version), addonObjects...)

	hr := &helmv2.HelmRelease{}
	if err := e.c.Get(ctx, types.NamespacedName{Namespace: tc.Namespace, Name: "acme-cilium"}, hr); err != nil {
		t.Fatal(err)
	}
	if ref := hr.Spec.KubeConfig; ref == nil || ref.SecretRef == nil || ref.SecretRef.Name != "acme-kubeconfig" || ref.SecretRef.Key != "value" {
		t.Errorf("HelmRelease acme-cilium kubeConfig %+v, want secretRef acme-kubeconfig/value", ref)
	}
	if !strings.Contains(string(hr.Spec.Values.Raw), `"k8sServiceHost":"api.acme.example.com"`) {
		t.Errorf("cilium values %s lack the tenant's API host", hr.Spec.Values.Raw)
	}
	dep := &appsv1.Deployment{}
	if err := e.c.Get(ctx, types.NamespacedName{Namespace: tc.Namespace, Name: "acme-cluster-autoscaler"}, dep); err != nil {
		t.Fatal(err)
	}
	if sa := dep.Spec.Template.Spec.ServiceAccountName; sa != "acme-cluster-autoscaler" {
		t.Errorf("cluster-autoscaler runs as %q", sa)
	}
	if args := strings.Join(dep.Spec.Template.Spec.Containers[0].Args, " "); !strings.Contains(args, "clusterapi:namespace=tenant-acme,clusterName=acme") {
		t.Errorf("cluster-autoscaler args %s: discovery not limited to this cluster", args)
	}

	// Helm reports cilium failing: the status says so.
	hr.Status.Conditions = []metav1.Condition{{Type: "Ready", Status: metav1.ConditionFalse, Reason: "InstallFailed",
		Message: "install retries exhausted", LastTransitionTime: metav1.Now(), ObservedGeneration: hr.Generation}}
	if err := e.c.Status().Update(ctx, hr); err != nil {
		t.Fatal(err)
	}
	poll.Within(t, waitLimit, 100*time.Millisecond, "AddonsReady reports the failure", func() error {
		cur, _ := e.get(ctx, tc)
		if c := condition(cur, v1.ConditionAddonsReady); !strings.Contains(c, "cilium: install retries exhausted") {
			return fmt.Errorf("AddonsReady %s", c)
		}
		return nil
	})

	// Turn metrics-server off: its HelmRelease goes.
	e.modify(t, ctx, tc, func(cur *v1.TenantCluster) { cur.Spec.Addons.MetricsServer.Enabled = ptr.To(false) })
	addonObjects = slices.DeleteFunc(addonObjects, func(s string) bool { return s == "HelmRelease/acme-metrics-server" })
	e.wantChildren(t, ctx, tc, Uniform(tc.Spec.Version), addonObjects...)
}

// TestOperatorDeletesInOrder: deleting a TenantCluster removes the
// workers first, the Cluster only once they are gone, the add-ons last,
// and the TenantCluster itself only when nothing is left.
func TestOperatorDeletesInOrder(t *testing.T) {
	e := startOperator(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	tc := e.create(t, ctx, nil)
	e.wantChildren(t, ctx, tc, Uniform(tc.Spec.Version))
	e.standInKamaji(t, ctx, tc)
	e.wantChildren(t, ctx, tc, Uniform(tc.Spec.Version), allAddonObjects()...)

	// Finalizers stand in for Cluster API draining a MachineDeployment's
	// machines and for helm-controller holding a HelmRelease.
	const hold = "test.cozy.dev/hold"
	hr := &helmv2.HelmRelease{}
	if err := e.c.Get(ctx, types.NamespacedName{Namespace: tc.Namespace, Name: "acme-cilium"}, hr); err != nil {
		t.Fatal(err)
	}
	hrPatch := client.MergeFrom(hr.DeepCopy())
	hr.Finalizers = append(hr.Finalizers, hold)
	if err := e.c.Patch(ctx, hr, hrPatch); err != nil {
		t.Fatal(err)
	}
	md := &clusterv1.MachineDeployment{}
	if err := e.c.Get(ctx, types.NamespacedName{Namespace: tc.Namespace, Name: "acme-md0"}, md); err != nil {
		t.Fatal(err)
	}
	patch := client.MergeFrom(md.DeepCopy())
	md.Finalizers = append(md.Finalizers, hold)
	if err := e.c.Patch(ctx, md, patch); err != nil {
		t.Fatal(err)
	}
	cur, _ := e.get(ctx, tc)
	if err := e.c.Delete(ctx, cur); err != nil {
		t.Fatal(err)
	}
	poll.Within(t, waitLimit, 100*time.Millisecond, "other workers deleted, the Cluster waiting", func() error {
		kids, err := e.children(ctx, tc)
		if err != nil {
			return err
		}
		for name := range kids {
			if strings.HasPrefix(name, "MachineHealthCheck/") || (strings.HasPrefix(name, "MachineDeployment/") && name != "MachineDeployment/acme-md0") {
				return fmt.Errorf("%s still there", name)
			}
		}
		if kids["Cluster/acme"] == nil || !kids["Cluster/acme"].GetDeletionTimestamp().IsZero() {
			return fmt.Errorf("the Cluster was deleted while a worker is left")
		}
		cur, err := e.get(ctx, tc)
		if err != nil {
			return err
		}
		if cur.Status.Phase != v1.PhaseDeleting || !strings.Contains(condition(cur, v1.ConditionReady), "MachineDeployment acme-md0") {
			return fmt.Errorf("phase %s, Ready %s", cur.Status.Phase, condition(cur, v1.ConditionReady))
		}
		return nil
	})
	time.Sleep(time.Second)
	if kids, _ := e.children(ctx, tc); kids["Cluster/acme"] == nil {
		t.Fatal("the Cluster was deleted while a worker is left")
	}

	if err := e.c.Get(ctx, client.ObjectKeyFromObject(md), md); err != nil {
		t.Fatal(err)
	}
	patch = client.MergeFrom(md.DeepCopy())
	md.Finalizers = slices.DeleteFunc(md.Finalizers, func(f string) bool { return f == hold })
	if err := e.c.Patch(ctx, md, patch); err != nil {
		t.Fatal(err)
	}
	// The add-ons go last, their HelmReleases suspended first so that
	// helm-controller does not try to uninstall from a deleted cluster.
	poll.Within(t, waitLimit, 100*time.Millisecond, "HelmRelease suspended and deleted after the Cluster", func() error {
		if err := e.c.Get(ctx, client.ObjectKeyFromObject(hr), hr); err != nil {
			return err
		}
		if hr.DeletionTimestamp.IsZero() || !hr.Spec.Suspend {
			return fmt.Errorf("HelmRelease acme-cilium: deleting %v, suspended %v", !hr.DeletionTimestamp.IsZero(), hr.Spec.Suspend)
		}
		if kids, _ := e.children(ctx, tc); kids["Cluster/acme"] != nil || kids["KamajiControlPlane/acme"] != nil {
			return fmt.Errorf("the Cluster is still there")
		}
		return nil
	})
	hrPatch = client.MergeFrom(hr.DeepCopy())
	hr.Finalizers = nil
	if err := e.c.Patch(ctx, hr, hrPatch); err != nil {
		t.Fatal(err)
	}
	poll.Within(t, waitLimit, 100*time.Millisecond, "everything gone", func() error {
		kids, err := e.children(ctx, tc)
		if err != nil {
			return err
		}
		if len(kids) > 0 {
			var names []string
			for n := range kids {
				names = append(names, n)
			}
			return fmt.Errorf("left: %v", names)
		}
		if _, err := e.get(ctx, tc); !apierrors.IsNotFound(err) {
			return fmt.Errorf("TenantCluster still there (%v)", err)
		}
		return nil
	})
}

// TestOperatorLeaderElection: of two operators with leader election
// (as the chart runs them), only the one holding the Lease acts; when it
// stops, it releases the Lease and the other takes over.
func TestOperatorLeaderElection(t *testing.T) {
	env, scheme := startAPIServer(t)
	cfg := asOperator(t, env)
	images, _ := workerRegistry(t, testVersions...)
	e := &operatorEnv{env: env, c: env.Client, images: images}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	first := newManager(t, cfg, scheme, true, images)
	stopFirst := run(t, first)
	t.Cleanup(stopFirst)
	select {
	case <-first.Elected():
	case <-ctx.Done():
		t.Fatal("the first operator was never elected")
	}
	second := newManager(t, cfg, scheme, true, images)
	t.Cleanup(run(t, second))

	tc := e.create(t, ctx, nil)
	e.wantChildren(t, ctx, tc, Uniform(tc.Spec.Version))
	select {
	case <-second.Elected():
		t.Fatal("two operators lead at once")
	case <-time.After(2 * time.Second):
	}

	stopFirst()
	select {
	case <-second.Elected():
	case <-ctx.Done():
		t.Fatal("the second operator never took over the released Lease")
	}
	// The new leader acts: a deleted child comes back.
	hc := &metav1.PartialObjectMetadata{}
	hc.SetGroupVersionKind(gvkMachineHealth)
	hc.SetNamespace(tc.Namespace)
	hc.SetName(tc.Name + "-md0")
	if err := e.c.Delete(ctx, hc); err != nil {
		t.Fatal(err)
	}
	e.wantChildren(t, ctx, tc, Uniform(tc.Spec.Version))
}

// TestOperatorWaitsForWorkerImage: node groups whose worker image the
// registry does not hold are not created (no VM is made to fail its
// import) and WorkersReady says which image to build and push; once it is
// pushed they are. An upgrade to a version without an image keeps the
// workers where they are.
func TestOperatorWaitsForWorkerImage(t *testing.T) {
	for v, short := range map[*time.Duration]time.Duration{&imageMissingTTL: 0, &workerImageRetry: 500 * time.Millisecond} {
		old := *v
		*v = short
		t.Cleanup(func() { *v = old })
	}
	env, scheme := startAPIServer(t)
	images, _ := workerRegistry(t) // empty
	t.Cleanup(run(t, newManager(t, asOperator(t, env), scheme, false, images)))
	e := &operatorEnv{env: env, c: env.Client, images: images}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	tc := e.create(t, ctx, nil)
	poll.Within(t, waitLimit, 100*time.Millisecond, "WorkersReady names the missing image", func() error {
		cur, err := e.get(ctx, tc)
		if err != nil {
			return err
		}
		want := "False/" + ReasonWorkerImageMissing + ": node group md0 waits for its worker image " + images.Ref("v1.36.3") +
			", which is not in the registry: build it with `cozyctl tenant image build --version v1.36.3` and push it with `cozyctl images mirror`"
		if c := condition(cur, v1.ConditionWorkersReady); !strings.HasPrefix(c, want) {
			return fmt.Errorf("WorkersReady %s", c)
		}
		if c := condition(cur, v1.ConditionReady); !strings.Contains(c, "waits for its worker image") {
			return fmt.Errorf("Ready %s", c)
		}
		return nil
	})
	// gpu names its own image and is made; md0 and small wait.
	got, groups := e.groupChildren(t, ctx, tc)
	if len(got) < 7 || !slices.Equal(groups, []string{"gpu"}) {
		t.Errorf("while the image is missing: %d children, of node groups %v; want the cluster's and gpu's only", len(got), groups)
	}

	pushWorkerImage(t, images, "v1.36.3")
	e.wantChildren(t, ctx, tc, Uniform("v1.36.3"))
	e.setControlPlane(t, ctx, tc, "v1.36.3")
	e.setWorkers(t, ctx, tc, false)

	// An upgrade to a version without an image: the control plane moves,
	// the workers stay on their template and say why.
	before, err := e.children(ctx, tc)
	if err != nil {
		t.Fatal(err)
	}
	e.setVersion(t, ctx, tc, "v1.37.0")
	e.wantChildren(t, ctx, tc, Versions{ControlPlane: "v1.37.0", Groups: map[string]string{newGroupKey: "v1.36.3"}})
	e.setControlPlane(t, ctx, tc, "v1.37.0")
	// gpu (its own image) moves; md0 and small stay.
	held := Versions{ControlPlane: "v1.37.0", Groups: map[string]string{"md0": "v1.36.3", "small": "v1.36.3"}}
	poll.Within(t, waitLimit, 100*time.Millisecond, "workers held at v1.36.3", func() error {
		cur, err := e.get(ctx, tc)
		if err != nil {
			return err
		}
		if c := condition(cur, v1.ConditionWorkersReady); !strings.Contains(c, ReasonWorkerImageMissing+": node group md0 waits for its worker image "+images.Ref("v1.37.0")) {
			return fmt.Errorf("WorkersReady %s", c)
		}
		if cur.Status.Phase != v1.PhaseUpgrading {
			return fmt.Errorf("phase %s", cur.Status.Phase)
		}
		return nil
	})
	e.wantChildren(t, ctx, tc, held)
	after, err := e.children(ctx, tc)
	if err != nil {
		t.Fatal(err)
	}
	if a, b := infraRef(before["MachineDeployment/acme-md0"]), infraRef(after["MachineDeployment/acme-md0"]); a != b {
		t.Errorf("node group md0 moved from template %s to %s without its image", a, b)
	}

	pushWorkerImage(t, images, "v1.37.0")
	e.wantChildren(t, ctx, tc, Uniform("v1.37.0"))
}

// TestOperatorSaysWhatThePlatformLacks: on a platform without a
// load-balancer pool and without the fixture's GPU permitted, the
// operator makes what can run (the cluster, the control plane, the
// groups without GPUs), holds the GPU group, and says both in the
// status, as cozy-operator's flags from the platform tell it.
func TestOperatorSaysWhatThePlatformLacks(t *testing.T) {
	env, scheme := startAPIServer(t)
	images, _ := workerRegistry(t, testVersions...)
	t.Cleanup(run(t, newManager(t, asOperator(t, env), scheme, false, images, func(r *Reconciler) {
		r.PermittedGPUs = nil
		r.NoLoadBalancer = true
	})))
	e := &operatorEnv{env: env, c: env.Client, images: images}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	// The fixture is exposed through an Ingress; the default is a
	// LoadBalancer Service.
	tc := e.create(t, ctx, func(tc *v1.TenantCluster) { tc.Spec.ControlPlane.Expose = v1.Expose{Type: v1.ExposeLoadBalancer} })
	poll.Within(t, waitLimit, 100*time.Millisecond, "the status says what the platform lacks", func() error {
		cur, err := e.get(ctx, tc)
		if err != nil {
			return err
		}
		if c := condition(cur, v1.ConditionControlPlaneReady); !strings.HasPrefix(c, "False/"+ReasonNoLoadBalancer+": the API server is exposed as a LoadBalancer Service") {
			return fmt.Errorf("ControlPlaneReady %s", c)
		}
		if c := condition(cur, v1.ConditionWorkersReady); !strings.HasPrefix(c, "False/"+ReasonGPUNotPermitted+": node group gpu asks for GPU nvidia.com/GA102GL_A10") {
			return fmt.Errorf("WorkersReady %s", c)
		}
		return nil
	})
	got, groups := e.groupChildren(t, ctx, tc)
	if !slices.Equal(groups, []string{"md0", "small"}) || got["KamajiControlPlane/"+tc.Name] == nil {
		t.Errorf("children of node groups %v (and a KamajiControlPlane: %v); want md0's and small's, and the control plane", groups, got["KamajiControlPlane/"+tc.Name] != nil)
	}
}

// groupChildren lists the TenantCluster's children and, sorted, the node
// groups they belong to.
func (e *operatorEnv) groupChildren(t *testing.T, ctx context.Context, tc *v1.TenantCluster) (map[string]*unstructured.Unstructured, []string) {
	t.Helper()
	got, err := e.children(ctx, tc)
	if err != nil {
		t.Fatal(err)
	}
	var groups []string
	for _, u := range got {
		if g := u.GetLabels()[LabelNodeGroup]; g != "" && !slices.Contains(groups, g) {
			groups = append(groups, g)
		}
	}
	slices.Sort(groups)
	return got, groups
}
