package tenantcluster

import (
	"context"
	"errors"
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"

	v1 "cozy.dev/cozy/operators/api/v1alpha1"
)

// ControlPlaneComponents are what Kamaji runs in each tenant's
// control-plane pod at the tenant's Kubernetes version, each from the
// image ControlPlaneImages names.
var ControlPlaneComponents = []string{"kube-apiserver", "kube-controller-manager", "kube-scheduler"}

// ControlPlaneImages are the images of ControlPlaneComponents at version,
// under the names Kamaji gives them by default
// (registry.k8s.io/NAME:VERSION), which cozy-operator keeps.
func ControlPlaneImages(version string) []string {
	out := make([]string, len(ControlPlaneComponents))
	for i, c := range ControlPlaneComponents {
		out[i] = "registry.k8s.io/" + c + ":" + version
	}
	return out
}

// ReasonControlPlaneImageMissing: the rack's registry mirror lacks an
// image of the control plane's version, so its pods cannot start.
const ReasonControlPlaneImageMissing = "ControlPlaneImageMissing"

// missingControlPlaneImages are the images of a control plane at version
// that the rack's registry mirror lacks, with the message
// ControlPlaneReady gives them. The management cluster's nodes pull
// through that mirror, and Kamaji's pods would otherwise wait in
// ImagePullBackOff with nothing on the TenantCluster saying why. Nothing
// is checked without a mirror (the nodes pull from the registries
// themselves); a check that cannot tell reports nothing missing and is
// told as a Warning event.
func (r *Reconciler) missingControlPlaneImages(ctx context.Context, tc *v1.TenantCluster, version string) string {
	var missing []string
	for _, image := range ControlPlaneImages(version) {
		ref, err := r.WorkerImages.InMirror(image)
		if ref == "" && err == nil {
			return "" // no mirror
		}
		if err == nil {
			err = r.imageChecks.check(ctx, ref)
		}
		switch {
		case errors.Is(err, errImageMissing):
			missing = append(missing, image)
		case err != nil:
			r.event(tc, corev1.EventTypeWarning, "ControlPlaneImageUnchecked", "CheckImage", "cannot tell whether the registry mirror holds %s: %v", image, err)
		}
	}
	if len(missing) == 0 {
		return ""
	}
	return fmt.Sprintf("the control plane at %s waits for %s, which the rack's registry mirror %s lacks: "+
		"copy them there with `cozyctl images mirror --tenant-version %s`", version, strings.Join(missing, ", "), r.WorkerImages.Mirror, version)
}
