package tenantcluster

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/utils/ptr"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
)

// Versions are the Kubernetes versions the controller asks the control
// plane and each node group to run. They differ from the TenantCluster's
// version only during an upgrade.
type Versions struct {
	ControlPlane string
	// Groups maps a node group to its version; a group not listed runs
	// the control plane's.
	Groups map[string]string
}

// Uniform is every part at one version.
func Uniform(version string) Versions { return Versions{ControlPlane: version} }

// Group is the version of one node group: its own if it has one, else
// the one for new groups, else the control plane's.
func (v Versions) Group(name string) string {
	if g, ok := v.Groups[name]; ok && name != newGroupKey {
		return g
	}
	if g, ok := v.Groups[newGroupKey]; ok {
		return g
	}
	return v.ControlPlane
}

// controlPlaneState is what the Kamaji control plane reports.
type controlPlaneState struct {
	// Spec is the version the operator last asked for, Status the one it
	// runs; Status is empty until the provider has reconciled it.
	Spec, Status string
	Ready        bool
	Initialized  bool
	// NotCreated is why the Kamaji provider could not create or update
	// the TenantControlPlane for the KamajiControlPlane's current spec
	// (its TenantControlPlaneCreated condition False at its generation),
	// empty otherwise.
	NotCreated string
}

func readControlPlane(u *unstructured.Unstructured) controlPlaneState {
	if u == nil {
		return controlPlaneState{}
	}
	var s controlPlaneState
	s.Spec, _, _ = unstructured.NestedString(u.Object, "spec", "version")
	s.Status, _, _ = unstructured.NestedString(u.Object, "status", "version")
	s.Ready, _, _ = unstructured.NestedBool(u.Object, "status", "ready")
	replicas, _, _ := unstructured.NestedInt64(u.Object, "status", "replicas")
	ready, _, _ := unstructured.NestedInt64(u.Object, "status", "readyReplicas")
	upToDate, found, _ := unstructured.NestedInt64(u.Object, "status", "upToDateReplicas")
	if found && (upToDate < replicas || ready < replicas) {
		// Kamaji reports ready while a rolling update is still going.
		s.Ready = false
	}
	cpInit, _, _ := unstructured.NestedBool(u.Object, "status", "initialization", "controlPlaneInitialized")
	s.Initialized = cpInit || s.Status != ""
	conds, _, _ := unstructured.NestedSlice(u.Object, "status", "conditions")
	for _, c := range conds {
		c, _ := c.(map[string]any)
		gen, _, _ := unstructured.NestedInt64(c, "observedGeneration")
		if c["type"] != "TenantControlPlaneCreated" || c["status"] != string(metav1.ConditionFalse) || gen != u.GetGeneration() {
			continue
		}
		if s.NotCreated, _ = c["message"].(string); s.NotCreated == "" {
			s.NotCreated, _ = c["reason"].(string)
		}
	}
	return s
}

// rolling says a MachineDeployment's machines are not all at its current
// template yet. A MachineDeployment Cluster API has never reconciled
// (observedGeneration 0) is not rolling: there is nothing to wait for.
func rolling(md *clusterv1.MachineDeployment) bool {
	st := md.Status
	if st.ObservedGeneration == 0 {
		return false
	}
	if st.ObservedGeneration < md.Generation {
		return true
	}
	want := ptr.Deref(md.Spec.Replicas, 0)
	return ptr.Deref(st.UpToDateReplicas, 0) < want || ptr.Deref(st.Replicas, 0) != want
}

// plan decides the versions for a TenantCluster at version want, given
// its control plane and MachineDeployments (by node group) as they are.
// The control plane moves first; the node groups follow once it runs the
// new version and is ready. A control plane already upgraded waits for
// workers that are still rolling before it moves again, so the control
// plane and the workers never roll at the same time.
func plan(want string, cp controlPlaneState, groups map[string]*clusterv1.MachineDeployment) Versions {
	v := Versions{ControlPlane: want, Groups: map[string]string{}}
	if cp.Spec != "" && cp.Spec != want {
		for _, md := range groups {
			if rolling(md) {
				v.ControlPlane = cp.Spec
				break
			}
		}
	}
	cpDone := cp.Spec == v.ControlPlane && cp.Status == v.ControlPlane && cp.Ready
	for name, md := range groups {
		current := md.Spec.Template.Spec.Version
		switch {
		case cpDone, current == "":
			v.Groups[name] = v.ControlPlane
		default:
			v.Groups[name] = current
		}
	}
	// A group that does not exist yet joins at the version the control
	// plane runs now (at creation, the one it is being created with).
	if !cpDone && cp.Status != "" && cp.Status != v.ControlPlane {
		v.Groups[newGroupKey] = cp.Status
	}
	return v
}

// newGroupKey holds, in Versions.Groups, the version for node groups
// that have no MachineDeployment yet.
const newGroupKey = ""
