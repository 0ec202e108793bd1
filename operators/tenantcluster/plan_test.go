package tenantcluster

import (
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/utils/ptr"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
)

func kcp(spec, status string, ready bool) *unstructured.Unstructured {
	u := &unstructured.Unstructured{Object: map[string]any{"spec": map[string]any{"version": spec}}}
	if status != "" {
		u.Object["status"] = map[string]any{"version": status, "ready": ready, "replicas": int64(2), "readyReplicas": int64(2), "upToDateReplicas": int64(2)}
	}
	return u
}

// md is a MachineDeployment at version; settled or rolling as Cluster
// API reports it, or never reconciled (observedGeneration 0).
func md(version, state string) *clusterv1.MachineDeployment {
	m := &clusterv1.MachineDeployment{ObjectMeta: metav1.ObjectMeta{Generation: 2}}
	m.Spec.Replicas = ptr.To[int32](3)
	m.Spec.Template.Spec.Version = version
	switch state {
	case "settled":
		m.Status = clusterv1.MachineDeploymentStatus{ObservedGeneration: 2, Replicas: ptr.To[int32](3), UpToDateReplicas: ptr.To[int32](3)}
	case "rolling":
		m.Status = clusterv1.MachineDeploymentStatus{ObservedGeneration: 2, Replicas: ptr.To[int32](4), UpToDateReplicas: ptr.To[int32](1)}
	case "stale":
		m.Status = clusterv1.MachineDeploymentStatus{ObservedGeneration: 1, Replicas: ptr.To[int32](3), UpToDateReplicas: ptr.To[int32](3)}
	}
	return m
}

func TestPlan(t *testing.T) {
	for _, tt := range []struct {
		name      string
		want      string
		cp        *unstructured.Unstructured
		groups    map[string]*clusterv1.MachineDeployment
		wantCP    string
		wantGroup map[string]string // group → version; "new" for a group not yet made
	}{
		{name: "create", want: "v1.36.1", wantCP: "v1.36.1", wantGroup: map[string]string{"new": "v1.36.1"}},
		{name: "created, control plane not reported yet", want: "v1.36.1", cp: kcp("v1.36.1", "", false),
			groups: map[string]*clusterv1.MachineDeployment{"a": md("v1.36.1", "")}, wantCP: "v1.36.1", wantGroup: map[string]string{"a": "v1.36.1", "new": "v1.36.1"}},
		{name: "steady", want: "v1.36.1", cp: kcp("v1.36.1", "v1.36.1", true),
			groups: map[string]*clusterv1.MachineDeployment{"a": md("v1.36.1", "settled")}, wantCP: "v1.36.1", wantGroup: map[string]string{"a": "v1.36.1", "new": "v1.36.1"}},
		{name: "bump: control plane first", want: "v1.37.0", cp: kcp("v1.36.1", "v1.36.1", true),
			groups: map[string]*clusterv1.MachineDeployment{"a": md("v1.36.1", "settled")}, wantCP: "v1.37.0", wantGroup: map[string]string{"a": "v1.36.1", "new": "v1.36.1"}},
		{name: "control plane upgrading", want: "v1.37.0", cp: kcp("v1.37.0", "v1.36.1", true),
			groups: map[string]*clusterv1.MachineDeployment{"a": md("v1.36.1", "settled")}, wantCP: "v1.37.0", wantGroup: map[string]string{"a": "v1.36.1", "new": "v1.36.1"}},
		{name: "control plane at the version but not ready", want: "v1.37.0", cp: kcp("v1.37.0", "v1.37.0", false),
			groups: map[string]*clusterv1.MachineDeployment{"a": md("v1.36.1", "settled")}, wantCP: "v1.37.0", wantGroup: map[string]string{"a": "v1.36.1", "new": "v1.37.0"}},
		{name: "control plane done: workers follow", want: "v1.37.0", cp: kcp("v1.37.0", "v1.37.0", true),
			groups: map[string]*clusterv1.MachineDeployment{"a": md("v1.36.1", "settled"), "b": md("v1.36.1", "")}, wantCP: "v1.37.0", wantGroup: map[string]string{"a": "v1.37.0", "b": "v1.37.0", "new": "v1.37.0"}},
		{name: "bump while workers roll: control plane holds", want: "v1.37.0", cp: kcp("v1.36.1", "v1.36.1", true),
			groups: map[string]*clusterv1.MachineDeployment{"a": md("v1.36.1", "rolling")}, wantCP: "v1.36.1", wantGroup: map[string]string{"a": "v1.36.1", "new": "v1.36.1"}},
		{name: "bump while Cluster API has not seen a change: holds", want: "v1.37.0", cp: kcp("v1.36.1", "v1.36.1", true),
			groups: map[string]*clusterv1.MachineDeployment{"a": md("v1.36.1", "stale")}, wantCP: "v1.36.1", wantGroup: map[string]string{"a": "v1.36.1", "new": "v1.36.1"}},
		{name: "rolling with no version change is no reason to hold", want: "v1.36.1", cp: kcp("v1.36.1", "v1.36.1", true),
			groups: map[string]*clusterv1.MachineDeployment{"a": md("v1.36.1", "rolling")}, wantCP: "v1.36.1", wantGroup: map[string]string{"a": "v1.36.1"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			v := plan(tt.want, readControlPlane(tt.cp), tt.groups)
			if v.ControlPlane != tt.wantCP {
				t.Errorf("control plane %s, want %s", v.ControlPlane, tt.wantCP)
			}
			for g, want := range tt.wantGroup {
				name := g
				if g == "new" {
					name = "not-made-yet"
				}
				if got := v.Group(name); got != want {
					t.Errorf("group %s: %s, want %s", g, got, want)
				}
			}
		})
	}
}
