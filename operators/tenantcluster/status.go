package tenantcluster

import (
	"fmt"
	"slices"
	"strings"

	helmv2 "github.com/fluxcd/helm-controller/api/v2"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/utils/ptr"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	v1 "cozy.dev/cozy/operators/api/v1alpha1"
)

// platformFacts is what the status reads besides the children: what the
// operator held back, and what the platform cannot give.
type platformFacts struct {
	Held map[string]hold
	// NoLoadBalancer: Services of type LoadBalancer get no address in
	// this cluster (the platform has no load-balancer pool).
	NoLoadBalancer bool
	// ControlPlaneImagesMissing says which images of the control plane's
	// version the rack's registry mirror lacks; "" when none (or
	// unknown).
	ControlPlaneImagesMissing string
}

// Observed is what the controller read of a TenantCluster's children.
type Observed struct {
	Cluster      *clusterv1.Cluster
	ControlPlane *unstructured.Unstructured
	// MachineDeployments by node group.
	MachineDeployments map[string]*clusterv1.MachineDeployment
	// Kubeconfig is the name of the tenant's kubeconfig Secret, empty
	// until Cluster API has written it.
	Kubeconfig string
	// HelmReleases and Deployments of the add-ons, by add-on name.
	HelmReleases map[string]*helmv2.HelmRelease
	Deployments  map[string]*appsv1.Deployment
}

// Condition reasons.
const (
	ReasonAvailable          = "Available"
	ReasonProvisioning       = "Provisioning"
	ReasonUpgrading          = "Upgrading"
	ReasonUnavailable        = "Unavailable"
	ReasonScaling            = "Scaling"
	ReasonNoNodeGroups       = "NoNodeGroups"
	ReasonWaitingKubeconfig  = "WaitingForKubeconfig"
	ReasonInstalling         = "Installing"
	ReasonAddonFailed        = "AddonFailed"
	ReasonNoAddons           = "NoAddons"
	ReasonNotReady           = "NotReady"
	ReasonDeleting           = "Deleting"
	ReasonWorkerImageMissing = "WorkerImageMissing"
	ReasonGPUNotPermitted    = "GPUNotPermitted"
	ReasonNoLoadBalancer     = "NoLoadBalancer"
	ReasonProviderError      = "ProviderError"
)

// computeStatus derives a TenantCluster's status from its children: the
// Kamaji control plane and the Cluster's conditions, the
// MachineDeployments' replica counts, the add-ons' HelmReleases and
// Deployments. It starts from the current status so that unchanged
// conditions keep their transition times, and changes nothing the
// children do not say.
func computeStatus(tc *v1.TenantCluster, o Observed, v Versions, addons []string, p platformFacts) v1.TenantClusterStatus {
	st := *tc.Status.DeepCopy()
	st.ObservedGeneration = tc.Generation
	gen := tc.Generation
	set := func(c metav1.Condition) {
		c.ObservedGeneration = gen
		apimeta.SetStatusCondition(&st.Conditions, c)
	}

	cp := readControlPlane(o.ControlPlane)
	st.Version = cp.Status
	if o.Cluster != nil && o.Cluster.Spec.ControlPlaneEndpoint.IsValid() {
		ep := o.Cluster.Spec.ControlPlaneEndpoint
		st.Endpoint = fmt.Sprintf("https://%s:%d", ep.Host, ep.Port)
	}
	if o.Kubeconfig != "" {
		st.KubeconfigSecretRef = &corev1.LocalObjectReference{Name: o.Kubeconfig}
	} else {
		st.KubeconfigSecretRef = nil
	}

	set(controlPlaneCondition(tc, o, v, cp, p))
	workers := observeWorkers(tc, o, p.Held)
	st.ReadyWorkers, st.DesiredWorkers = workers.ready, workers.desired
	st.Workers = fmt.Sprintf("%d/%d", workers.ready, workers.desired)
	set(workers.condition(tc))
	setAddonsCondition(set, o, addons)
	ready := readyCondition(st.Conditions)
	set(ready)
	st.Phase = phase(tc, st.Phase, ready.Status == metav1.ConditionTrue, workers.upgrading, cp)
	return st
}

// controlPlaneCondition is ControlPlaneReady: the Kamaji control plane
// ready at the TenantCluster's version, upgrading to it, or why not.
func controlPlaneCondition(tc *v1.TenantCluster, o Observed, v Versions, cp controlPlaneState, p platformFacts) metav1.Condition {
	switch {
	case cp.Ready && cp.Status == tc.Spec.Version:
		return metav1.Condition{Type: v1.ConditionControlPlaneReady, Status: metav1.ConditionTrue, Reason: ReasonAvailable,
			Message: "the control plane runs " + cp.Status}
	case cp.NotCreated != "":
		// The provider cannot write the TenantControlPlane: most often
		// Kamaji's webhook refuses it (a DataStore that does not exist, a
		// version Kamaji does not serve), and waiting changes nothing, so
		// say why rather than "waiting".
		return metav1.Condition{Type: v1.ConditionControlPlaneReady, Status: metav1.ConditionFalse, Reason: ReasonProviderError,
			Message: "the Kamaji control-plane provider reports TenantControlPlaneCreated False: " + firstLine(cp.NotCreated)}
	case p.ControlPlaneImagesMissing != "":
		// Kamaji's pods would wait in ImagePullBackOff, also during an
		// upgrade, which would otherwise say "upgrading" for ever.
		return metav1.Condition{Type: v1.ConditionControlPlaneReady, Status: metav1.ConditionFalse, Reason: ReasonControlPlaneImageMissing,
			Message: p.ControlPlaneImagesMissing}
	case cp.Status != "" && cp.Status != tc.Spec.Version:
		return metav1.Condition{Type: v1.ConditionControlPlaneReady, Status: metav1.ConditionFalse, Reason: ReasonUpgrading,
			Message: upgradeMessage(cp, v, tc.Spec.Version)}
	case p.NoLoadBalancer && tc.Spec.ControlPlane.Expose.Type == v1.ExposeLoadBalancer && !cp.Initialized:
		// Kamaji would wait for the Service's address for ever.
		return metav1.Condition{Type: v1.ConditionControlPlaneReady, Status: metav1.ConditionFalse, Reason: ReasonNoLoadBalancer,
			Message: "the API server is exposed as a LoadBalancer Service (the default), and the platform has no load-balancer pool " +
				"(the rack's platform.loadBalancerPool), so it gets no address: add a pool, or set controlPlane.expose.type " +
				"to ClusterIP (reachable from the management cluster and its VMs only) or Ingress"}
	}
	reason, msg := ReasonProvisioning, "waiting for the Kamaji control plane to become ready"
	if cp.Initialized {
		reason, msg = ReasonUnavailable, "the Kamaji control plane is not ready"
	}
	if c := clusterCondition(o.Cluster, clusterv1.ClusterControlPlaneAvailableCondition); c != nil && c.Status != metav1.ConditionTrue && c.Message != "" {
		msg += ": " + firstLine(c.Message)
	}
	return metav1.Condition{Type: v1.ConditionControlPlaneReady, Status: metav1.ConditionFalse, Reason: reason, Message: msg}
}

// workers is what the MachineDeployments say about the node groups.
type workers struct {
	ready, desired int32
	// behind are the groups not ready at the TenantCluster's version,
	// each with why; upgrading is true when one is at another version.
	behind    []string
	upgrading bool
	// held are the groups left as they are, and why.
	held []hold
}

func observeWorkers(tc *v1.TenantCluster, o Observed, held map[string]hold) workers {
	var w workers
	for _, g := range tc.Spec.NodeGroups {
		md := o.MachineDeployments[g.Name]
		want := groupDesired(g, md)
		w.desired += want
		if h, ok := held[g.Name]; ok {
			w.held = append(w.held, h)
			if md != nil {
				w.ready += min(ptr.Deref(md.Status.ReadyReplicas, 0), want)
				w.upgrading = w.upgrading || md.Spec.Template.Spec.Version != tc.Spec.Version
			}
			continue
		}
		if md == nil {
			w.behind = append(w.behind, g.Name+" (not created)")
			continue
		}
		r := ptr.Deref(md.Status.ReadyReplicas, 0)
		w.ready += min(r, want)
		if md.Spec.Template.Spec.Version != tc.Spec.Version {
			w.upgrading = true
			w.behind = append(w.behind, fmt.Sprintf("%s (at %s)", g.Name, md.Spec.Template.Spec.Version))
		} else if r < want || rolling(md) {
			w.behind = append(w.behind, fmt.Sprintf("%s (%d/%d ready)", g.Name, r, want))
		}
	}
	return w
}

// condition is WorkersReady.
func (w workers) condition(tc *v1.TenantCluster) metav1.Condition {
	switch {
	case len(tc.Spec.NodeGroups) == 0:
		return metav1.Condition{Type: v1.ConditionWorkersReady, Status: metav1.ConditionTrue, Reason: ReasonNoNodeGroups, Message: "the cluster has no node groups"}
	case len(w.held) > 0:
		// The first held group (in spec order) gives the reason; the
		// message says why of each.
		var msgs []string
		for _, h := range w.held {
			msgs = append(msgs, h.Message)
		}
		return metav1.Condition{Type: v1.ConditionWorkersReady, Status: metav1.ConditionFalse, Reason: w.held[0].Reason,
			Message: strings.Join(append(msgs, w.behind...), "; ")}
	case len(w.behind) == 0:
		return metav1.Condition{Type: v1.ConditionWorkersReady, Status: metav1.ConditionTrue, Reason: ReasonAvailable,
			Message: fmt.Sprintf("%d/%d workers ready", w.ready, w.desired)}
	case w.upgrading:
		return metav1.Condition{Type: v1.ConditionWorkersReady, Status: metav1.ConditionFalse, Reason: ReasonUpgrading,
			Message: "node groups not yet at " + tc.Spec.Version + ": " + strings.Join(w.behind, ", ")}
	}
	return metav1.Condition{Type: v1.ConditionWorkersReady, Status: metav1.ConditionFalse, Reason: ReasonScaling,
		Message: fmt.Sprintf("%d/%d workers ready; waiting for %s", w.ready, w.desired, strings.Join(w.behind, ", "))}
}

// readyCondition is Ready: true when the control plane, the workers and
// the add-ons are, else what each of those that is not says.
func readyCondition(conds []metav1.Condition) metav1.Condition {
	all, not := true, []string{}
	for _, t := range []string{v1.ConditionControlPlaneReady, v1.ConditionWorkersReady, v1.ConditionAddonsReady} {
		c := apimeta.FindStatusCondition(conds, t)
		if c == nil || c.Status != metav1.ConditionTrue {
			all = false
		}
		if c != nil && c.Status != metav1.ConditionTrue {
			not = append(not, t+": "+c.Message)
		}
	}
	if all {
		return metav1.Condition{Type: v1.ConditionReady, Status: metav1.ConditionTrue, Reason: ReasonAvailable, Message: "the cluster is ready"}
	}
	return metav1.Condition{Type: v1.ConditionReady, Status: metav1.ConditionFalse, Reason: ReasonNotReady, Message: strings.Join(not, "; ")}
}

// phase is the one-word summary, from the phase before.
func phase(tc *v1.TenantCluster, before v1.Phase, ready, workersUpgrading bool, cp controlPlaneState) v1.Phase {
	switch {
	case !tc.DeletionTimestamp.IsZero():
		return v1.PhaseDeleting
	case ready:
		return v1.PhaseReady
	case workersUpgrading || (cp.Status != "" && cp.Status != tc.Spec.Version):
		return v1.PhaseUpgrading
	case !cp.Initialized || before == "" || before == v1.PhaseProvisioning:
		// Until it has once been ready, a cluster is still being made.
		return v1.PhaseProvisioning
	}
	return v1.PhaseDegraded
}

func upgradeMessage(cp controlPlaneState, v Versions, want string) string {
	if v.ControlPlane != want {
		return fmt.Sprintf("the control plane runs %s and waits for the node groups to finish rolling before it moves to %s", cp.Status, want)
	}
	return fmt.Sprintf("the control plane is upgrading from %s to %s; node groups follow once it is done", cp.Status, want)
}

// groupDesired is how many workers a group should have: its replicas,
// or for an autoscaled group what the autoscaler set (at least min).
func groupDesired(g v1.NodeGroup, md *clusterv1.MachineDeployment) int32 {
	if g.MinReplicas == nil {
		return ptr.Deref(g.Replicas, 1)
	}
	if md != nil && md.Spec.Replicas != nil {
		return max(*md.Spec.Replicas, *g.MinReplicas)
	}
	return *g.MinReplicas
}

func setAddonsCondition(set func(metav1.Condition), o Observed, addons []string) {
	if len(addons) == 0 {
		set(metav1.Condition{Type: v1.ConditionAddonsReady, Status: metav1.ConditionTrue, Reason: ReasonNoAddons, Message: "no add-ons are enabled"})
		return
	}
	if o.Kubeconfig == "" {
		set(metav1.Condition{Type: v1.ConditionAddonsReady, Status: metav1.ConditionFalse, Reason: ReasonWaitingKubeconfig,
			Message: "add-ons are installed once Cluster API has written the tenant's kubeconfig Secret"})
		return
	}
	var failed, pending []string
	for _, name := range addons {
		if hr, ok := o.HelmReleases[name]; ok {
			c := apimeta.FindStatusCondition(hr.Status.Conditions, "Ready")
			switch {
			case c == nil || c.ObservedGeneration < hr.Generation && c.Status == metav1.ConditionTrue:
				pending = append(pending, name)
			case c.Status == metav1.ConditionTrue:
			case c.Status == metav1.ConditionFalse && c.Reason != "Progressing":
				failed = append(failed, name+": "+firstLine(c.Message))
			default:
				pending = append(pending, name)
			}
			continue
		}
		if d, ok := o.Deployments[name]; ok {
			if !deploymentAvailable(d) {
				pending = append(pending, name)
			}
			continue
		}
		pending = append(pending, name+" (not created)")
	}
	switch {
	case len(failed) > 0:
		set(metav1.Condition{Type: v1.ConditionAddonsReady, Status: metav1.ConditionFalse, Reason: ReasonAddonFailed, Message: strings.Join(failed, "; ")})
	case len(pending) > 0:
		set(metav1.Condition{Type: v1.ConditionAddonsReady, Status: metav1.ConditionFalse, Reason: ReasonInstalling, Message: "waiting for " + strings.Join(pending, ", ")})
	default:
		set(metav1.Condition{Type: v1.ConditionAddonsReady, Status: metav1.ConditionTrue, Reason: ReasonAvailable,
			Message: "add-ons ready: " + strings.Join(slices.Sorted(slices.Values(addons)), ", ")})
	}
}

func deploymentAvailable(d *appsv1.Deployment) bool {
	if d.Status.ObservedGeneration < d.Generation {
		return false
	}
	for _, c := range d.Status.Conditions {
		if c.Type == appsv1.DeploymentAvailable {
			return c.Status == corev1.ConditionTrue && d.Status.UpdatedReplicas == ptr.Deref(d.Spec.Replicas, 1)
		}
	}
	return false
}

func clusterCondition(cl *clusterv1.Cluster, t string) *metav1.Condition {
	if cl == nil {
		return nil
	}
	return apimeta.FindStatusCondition(cl.Status.Conditions, t)
}

func firstLine(s string) string {
	s, _, _ = strings.Cut(s, "\n")
	return s
}
