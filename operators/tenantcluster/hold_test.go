package tenantcluster

import (
	"context"
	"strings"
	"testing"

	v1 "cozy.dev/cozy/operators/api/v1alpha1"
)

// TestGPUHold: a group whose GPUs the platform's KubeVirt does not
// permit waits, and says what to configure; the GPU hold comes before
// the image's.
func TestGPUHold(t *testing.T) {
	const a10, l4 = "nvidia.com/GA102GL_A10", "nvidia.com/AD104GL_L4"
	gpus := func(names ...string) []v1.GPU {
		var out []v1.GPU
		for _, n := range names {
			out = append(out, v1.GPU{DeviceName: n})
		}
		return out
	}
	for _, tt := range []struct {
		name      string
		permitted []string
		gpus      []v1.GPU
		want      string // Reason: part of the message; "" not held
	}{
		{name: "no GPUs"},
		{name: "permitted", permitted: []string{l4, a10}, gpus: gpus(a10, a10)},
		{name: "none permitted", gpus: gpus(a10),
			want: ReasonGPUNotPermitted + ": node group g asks for GPU nvidia.com/GA102GL_A10, which the platform's KubeVirt does not permit: list it in the platform values kubevirt.permittedHostDevices"},
		{name: "one of two permitted", permitted: []string{a10}, gpus: gpus(a10, l4, l4),
			want: ReasonGPUNotPermitted + ": node group g asks for GPU nvidia.com/AD104GL_L4, which"},
		{name: "GPU before image", gpus: gpus(l4), want: ReasonGPUNotPermitted + ": asks for GPU nvidia.com/AD104GL_L4"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			// A group with its own image: only the GPU can hold it,
			// except in the last case, where no repository would too.
			g := v1.NodeGroup{Name: "g", GPUs: tt.gpus, Image: v1.ImageSource{URL: "https://images.example.com/gpu.qcow2"}}
			if tt.name == "GPU before image" {
				g.Image = v1.ImageSource{}
			}
			tc := &v1.TenantCluster{Spec: v1.TenantClusterSpec{Version: "v1.36.3", NodeGroups: []v1.NodeGroup{g}}}
			r := &Reconciler{PermittedGPUs: tt.permitted, imageChecks: newImageChecks(WorkerImages{})}
			h, ok := r.heldGroups(context.Background(), tc, Observed{}, Uniform("v1.36.3"))["g"]
			got := h.Reason + ": " + h.Message
			reason, msg, _ := strings.Cut(tt.want, ": ")
			if ok != (tt.want != "") || ok && (h.Reason != reason || !strings.Contains(got, msg)) {
				t.Errorf("held %v %q, want %q", ok, got, tt.want)
			}
		})
	}
}
