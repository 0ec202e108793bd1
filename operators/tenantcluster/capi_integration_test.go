//go:build integration

package tenantcluster

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	autoscalingv1 "k8s.io/api/autoscaling/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/retry"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"cozy.dev/cozy/internal/testing/netnstest"
	"cozy.dev/cozy/internal/testing/poll"
	"cozy.dev/cozy/internal/testing/testenv"
)

// TestClusterAPIControllersAcceptChildren runs the real Cluster API core
// manager (built from its module by hack/capi-controllers.sh) against a
// real API server holding a TenantCluster's children, and checks that
// Cluster API turns each node group's MachineDeployment into a MachineSet
// and Machines whose KubevirtMachines and KubeadmConfigs are cloned from
// our templates. Nothing reconciles those further: CAPK, the kubeadm
// bootstrap provider and Kamaji do not run here.
//
// The manager runs in a network namespace with only loopback; the API
// server is forwarded into it, and its webhook server (which binds all
// interfaces) is exposed to the API server on the host's loopback only.
// Cluster API core's webhooks are registered before the children are
// applied, so its defaulting and validation see every Cluster,
// MachineDeployment and MachineHealthCheck we make. (The kubeadm
// bootstrap provider's, for KubeadmConfigTemplates, are not: its manager
// is not built here.)
func TestClusterAPIControllersAcceptChildren(t *testing.T) {
	manager := testenv.CAPIManager(t)
	netns := netnstest.New(t, "capi")
	env, _ := startAPIServer(t)
	apiURL, err := url.Parse(env.Config.Host)
	if err != nil {
		t.Fatal(err)
	}
	netns.Forward(t, apiURL.Host)
	// A generous deadline for a busy 2-core machine; the manager dying
	// ends the wait at once.
	ctx, cancel := context.WithCancelCause(context.Background())
	defer cancel(nil)
	ctx, cancelTimeout := context.WithTimeout(ctx, 2*time.Minute)
	defer cancelTimeout()
	c := env.Client

	certDir := testenv.WebhookCertDir(t)
	started := time.Now()
	testenv.StartCAPIManager(t, netns, manager, env.WriteKubeconfig(t), certDir, cancel)
	registerCAPIWebhooks(t, ctx, c, netns, certDir)

	// A real TenantCluster, so the children carry the owner references the
	// operator gives them (the garbage collector does not run here).
	tc := fixture(t)
	tc.UID, tc.ResourceVersion = "", ""
	if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: tc.Namespace}}); err != nil {
		t.Fatal(err)
	}
	if err := c.Create(ctx, tc); err != nil {
		t.Fatalf("create the TenantCluster: %v", err)
	}
	children, err := Desired(tc, tc.Spec.Version, testImages)
	if err != nil {
		t.Fatal(err)
	}
	apply := func() {
		t.Helper()
		for _, u := range children.All() {
			u = u.DeepCopy()
			if u.GetKind() == "MachineDeployment" {
				// MachineSets hold back Machines until the control plane
				// is stable; Kamaji does not run here. Test only.
				a := u.GetAnnotations()
				if a == nil {
					a = map[string]string{}
				}
				a[clusterv1.MachineSetSkipPreflightChecksAnnotation] = string(clusterv1.MachineSetPreflightCheckAll)
				u.SetAnnotations(a)
			}
			err := c.Apply(ctx, client.ApplyConfigurationFromUnstructured(u), client.FieldOwner("cozy-operator"), client.ForceOwnership)
			if err != nil {
				t.Fatalf("apply %s %s: %v", u.GetKind(), u.GetName(), err)
			}
		}
	}
	apply()

	// Fixed groups: as many Machines as replicas, from our templates.
	var fixed, autoscaled []GroupChildren
	for _, g := range children.Groups {
		if _, ok := g.MachineDeployment.Object["spec"].(map[string]any)["replicas"]; ok {
			fixed = append(fixed, g)
		} else {
			autoscaled = append(autoscaled, g)
		}
	}
	if len(fixed) == 0 || len(autoscaled) == 0 {
		t.Fatalf("the fixture should have fixed and autoscaled groups; got %d and %d", len(fixed), len(autoscaled))
	}
	for _, g := range fixed {
		replicas, _, _ := unstructured.NestedInt64(g.MachineDeployment.Object, "spec", "replicas")
		checkGroupMachines(t, ctx, c, g, int(replicas), tc.Spec.Version)
	}
	t.Logf("fixed groups' Machines created %s after the manager started", time.Since(started).Round(time.Millisecond))

	// Cluster API's validation runs too: it refuses what its CRDs allow,
	// such as moving a MachineDeployment to another cluster.
	moved := client.RawPatch(types.MergePatchType, []byte(`{"spec":{"clusterName":"other"}}`))
	err = c.Patch(ctx, fixed[0].MachineDeployment.DeepCopy(), moved)
	if err == nil || !strings.Contains(err.Error(), `admission webhook "validation.machinedeployment.cluster.x-k8s.io" denied`) {
		t.Errorf("moving %s to another cluster: %v, want Cluster API's validating webhook to refuse", fixed[0].MachineDeployment.GetName(), err)
	}

	// Autoscaled groups leave replicas to the cluster-autoscaler; Cluster
	// API's defaulting webhook starts them at the min-size annotation.
	for _, g := range autoscaled {
		md := &clusterv1.MachineDeployment{}
		if err := c.Get(ctx, client.ObjectKeyFromObject(g.MachineDeployment), md); err != nil {
			t.Fatal(err)
		}
		minSize, err := strconv.Atoi(md.Annotations[annotationMinSize])
		if err != nil {
			t.Fatalf("%s: min-size annotation: %v", md.Name, err)
		}
		if md.Spec.Replicas == nil || int(*md.Spec.Replicas) != minSize {
			t.Fatalf("%s: replicas %v, want the min size %d from Cluster API's defaulting webhook", md.Name, md.Spec.Replicas, minSize)
		}
		checkGroupMachines(t, ctx, c, g, minSize, tc.Spec.Version)

		// The webhook's replicas went in with the operator's apply, so
		// the operator owns them until the autoscaler writes; applying
		// again (without replicas) must not scale the group to nothing.
		generation := md.Generation
		apply()
		if err := c.Get(ctx, client.ObjectKeyFromObject(md), md); err != nil {
			t.Fatal(err)
		}
		if md.Spec.Replicas == nil || int(*md.Spec.Replicas) != minSize || md.Generation != generation {
			t.Errorf("%s after the operator applied again: replicas %v, generation %d -> %d; want %d, unchanged",
				md.Name, md.Spec.Replicas, generation, md.Generation, minSize)
		}

		// The autoscaler scales up through the scale subresource, racing
		// Cluster API's own writes to the MachineDeployment as it does.
		err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
			scale := &autoscalingv1.Scale{}
			if err := c.SubResource("scale").Get(ctx, md, scale); err != nil {
				return err
			}
			scale.Spec.Replicas = int32(minSize + 1)
			return c.SubResource("scale").Update(ctx, md, client.WithSubResourceBody(scale), client.FieldOwner("cluster-autoscaler"))
		})
		if err != nil {
			t.Fatalf("scale %s to %d: %v", md.Name, minSize+1, err)
		}
		checkGroupMachines(t, ctx, c, g, minSize+1, tc.Spec.Version)
	}

	// The operator applies again on every reconcile: the same children
	// must change no MachineDeployment's spec (a rollout) and must not
	// take replicas back from the autoscaler.
	generations := map[string]int64{}
	for _, g := range children.Groups {
		md := &clusterv1.MachineDeployment{}
		if err := c.Get(ctx, client.ObjectKeyFromObject(g.MachineDeployment), md); err != nil {
			t.Fatal(err)
		}
		generations[md.Name] = md.Generation
	}
	apply()
	for _, g := range children.Groups {
		md := &clusterv1.MachineDeployment{}
		if err := c.Get(ctx, client.ObjectKeyFromObject(g.MachineDeployment), md); err != nil {
			t.Fatal(err)
		}
		if md.Generation != generations[md.Name] {
			t.Errorf("%s: generation %d -> %d after applying the same children", md.Name, generations[md.Name], md.Generation)
		}
		if slices.ContainsFunc(autoscaled, func(a GroupChildren) bool { return a.Name == g.Name }) {
			minSize, _ := strconv.Atoi(md.Annotations[annotationMinSize])
			if md.Spec.Replicas == nil || int(*md.Spec.Replicas) != minSize+1 {
				t.Errorf("%s: replicas %v after the operator applied again, want the autoscaler's %d", md.Name, md.Spec.Replicas, minSize+1)
			}
		}
	}
}

// checkGroupMachines waits until g's MachineDeployment has a MachineSet with
// replicas Machines, then checks that each Machine's infrastructure and
// bootstrap objects were cloned from g's templates, with their specs.
func checkGroupMachines(t *testing.T, ctx context.Context, c client.Client, g GroupChildren, replicas int, version string) {
	t.Helper()
	md := &clusterv1.MachineDeployment{}
	var machines []clusterv1.Machine
	poll.Until(t, ctx, 250*time.Millisecond, fmt.Sprintf("%d Machines of %s", replicas, g.MachineDeployment.GetName()), func() error {
		if err := c.Get(ctx, client.ObjectKeyFromObject(g.MachineDeployment), md); err != nil {
			return err
		}
		sets, ms, err := machinesOf(ctx, c, md)
		if err != nil {
			return err
		}
		machines = ms
		if len(sets) != 1 || len(machines) != replicas {
			return fmt.Errorf("%d MachineSets, %d Machines", len(sets), len(machines))
		}
		return nil
	})

	for _, m := range machines {
		if m.Spec.ClusterName != md.Spec.ClusterName || m.Spec.Version != version {
			t.Errorf("Machine %s: cluster %q version %q, want %q %q", m.Name, m.Spec.ClusterName, m.Spec.Version, md.Spec.ClusterName, version)
		}
		for _, clone := range []struct {
			ref      clusterv1.ContractVersionedObjectReference
			version  string
			template *unstructured.Unstructured
		}{
			{m.Spec.InfrastructureRef, "v1alpha1", g.MachineTemplate},
			{m.Spec.Bootstrap.ConfigRef, "v1beta2", g.BootstrapTemplate},
		} {
			obj := &unstructured.Unstructured{}
			obj.SetAPIVersion(clone.ref.APIGroup + "/" + clone.version)
			obj.SetKind(clone.ref.Kind)
			// Polled, because the Machine can be seen before its clones.
			poll.Until(t, ctx, 250*time.Millisecond, fmt.Sprintf("Machine %s's %s %s", m.Name, clone.ref.Kind, clone.ref.Name), func() error {
				return c.Get(ctx, client.ObjectKey{Namespace: m.Namespace, Name: clone.ref.Name}, obj)
			})
			wantKind := strings.TrimSuffix(clone.template.GetKind(), "Template")
			if clone.ref.Kind != wantKind || obj.GetAPIVersion() != clone.template.GetAPIVersion() {
				t.Errorf("Machine %s refers to %s %s, want a %s", m.Name, clone.ref.APIGroup, clone.ref.Kind, wantKind)
			}
			if got := obj.GetAnnotations()[clusterv1.TemplateClonedFromNameAnnotation]; got != clone.template.GetName() {
				t.Errorf("%s %s cloned from %q, want our template %q", obj.GetKind(), obj.GetName(), got, clone.template.GetName())
			}
			want, _, _ := unstructured.NestedMap(clone.template.Object, "spec", "template", "spec")
			got, _, _ := unstructured.NestedMap(obj.Object, "spec")
			if !equality.Semantic.DeepEqual(got, want) {
				t.Errorf("%s %s spec differs from template %s's:\ngot:\n%s\nwant:\n%s", obj.GetKind(), obj.GetName(), clone.template.GetName(), yamlOf(got), yamlOf(want))
			}
		}
	}
}

// machinesOf lists the MachineSets md controls and the Machines they
// control.
func machinesOf(ctx context.Context, c client.Client, md *clusterv1.MachineDeployment) ([]clusterv1.MachineSet, []clusterv1.Machine, error) {
	var sets clusterv1.MachineSetList
	if err := c.List(ctx, &sets, client.InNamespace(md.Namespace)); err != nil {
		return nil, nil, err
	}
	var machines clusterv1.MachineList
	if err := c.List(ctx, &machines, client.InNamespace(md.Namespace)); err != nil {
		return nil, nil, err
	}
	var ours []clusterv1.MachineSet
	var theirs []clusterv1.Machine
	for _, ms := range sets.Items {
		if ref := metav1.GetControllerOf(&ms); ref == nil || ref.UID != md.UID {
			continue
		}
		ours = append(ours, ms)
		for _, m := range machines.Items {
			if ref := metav1.GetControllerOf(&m); ref != nil && ref.UID == ms.UID {
				theirs = append(theirs, m)
			}
		}
	}
	return ours, theirs, nil
}

// registerCAPIWebhooks exposes the manager's webhook server on the
// host's loopback and registers Cluster API core's webhook
// configurations there (testenv.RegisterCAPIWebhooks).
func registerCAPIWebhooks(t *testing.T, ctx context.Context, c client.Client, netns *netnstest.NS, certDir string) {
	t.Helper()
	addr := netns.Expose(t, net.JoinHostPort("127.0.0.1", strconv.Itoa(testenv.CAPIWebhookPort)))
	testenv.RegisterCAPIWebhooks(ctx, t, c, addr, certDir)
}

// fileTail is the last n lines of a file.
func fileTail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	lines := bytes.Split(bytes.TrimRight(b, "\n"), []byte("\n"))
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return string(bytes.Join(lines, []byte("\n")))
}

func yamlOf(v any) string {
	b, err := yaml.Marshal(v)
	if err != nil {
		return err.Error()
	}
	return string(b)
}
