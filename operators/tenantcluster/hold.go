package tenantcluster

import (
	"context"
	"fmt"
	"slices"
	"strings"

	v1 "cozy.dev/cozy/operators/api/v1alpha1"
)

// hold is why a node group's objects are left as they are: none is
// created, changed or pruned, so no VM is made that could not run, and
// WorkersReady says what to do.
type hold struct {
	Reason, Message string
}

// heldGroups are the node groups that must wait, each with the first
// reason that holds it: a GPU the platform's KubeVirt does not permit,
// then its worker image.
func (r *Reconciler) heldGroups(ctx context.Context, tc *v1.TenantCluster, o Observed, v Versions) map[string]hold {
	held := map[string]hold{}
	for _, g := range tc.Spec.NodeGroups {
		if h, ok := r.gpuHold(g); ok {
			held[g.Name] = h
		} else if h, ok := r.imageHold(ctx, tc, g, o, v); ok {
			held[g.Name] = h
		}
	}
	return held
}

// gpuHold holds a group whose GPUs the platform's KubeVirt does not list
// in permittedHostDevices: KubeVirt would not start its VMs
// (virt-controller refuses to render their pods).
func (r *Reconciler) gpuHold(g v1.NodeGroup) (hold, bool) {
	var missing []string
	for _, gpu := range g.GPUs {
		if !slices.Contains(r.PermittedGPUs, gpu.DeviceName) && !slices.Contains(missing, gpu.DeviceName) {
			missing = append(missing, gpu.DeviceName)
		}
	}
	if len(missing) == 0 {
		return hold{}, false
	}
	return hold{ReasonGPUNotPermitted, fmt.Sprintf("node group %s asks for GPU %s, which the platform's KubeVirt does not permit: "+
		"list it in the platform values kubevirt.permittedHostDevices (pciHostDevices or mediatedDevices, by resourceName)",
		g.Name, strings.Join(missing, ", "))}, true
}
