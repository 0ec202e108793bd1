package tenantcluster

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	helmv2 "github.com/fluxcd/helm-controller/api/v2"
	corev1 "k8s.io/api/core/v1"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	v1 "cozy.dev/cozy/operators/api/v1alpha1"
)

// deletionStages name what each stage of the finalizer removes.
var deletionStages = []string{"workers", "the Cluster and its control plane", "templates and add-ons"}

// finalize deletes a TenantCluster's children in order, waiting for
// each stage to be gone before the next: the workers (MachineDeployments
// and their health checks), then the Cluster, then the rest. Add-on
// HelmReleases are suspended before they are deleted: their tenant is
// gone by then, and helm-controller would otherwise try to uninstall
// from it. The finalizer goes last, so nothing is left behind.
func (r *Reconciler) finalize(ctx context.Context, tc *v1.TenantCluster) (ctrl.Result, error) {
	if !controllerutil.ContainsFinalizer(tc, Finalizer) {
		return ctrl.Result{}, nil
	}
	existing, err := r.list(ctx, tc)
	if err != nil {
		return ctrl.Result{}, err
	}
	for stage := range deletionStages {
		var left []string
		for key, obj := range existing {
			k, _ := kindOf(key.GVK)
			if k.Stage != stage {
				continue
			}
			left = append(left, key.GVK.Kind+" "+key.Name)
			if !obj.GetDeletionTimestamp().IsZero() {
				continue
			}
			if hr, ok := obj.(*helmv2.HelmRelease); ok && !hr.Spec.Suspend {
				patch := client.MergeFrom(hr.DeepCopy())
				hr.Spec.Suspend = true
				if err := r.Client.Patch(ctx, hr, patch); client.IgnoreNotFound(err) != nil {
					return ctrl.Result{}, fmt.Errorf("suspend HelmRelease %s: %w", hr.Name, err)
				}
				countWrite("patch", key.GVK.Kind)
			}
			if err := r.delete(ctx, obj, key.GVK); err != nil {
				return ctrl.Result{}, err
			}
		}
		if len(left) > 0 {
			slices.Sort(left)
			msg := fmt.Sprintf("deleting %s: waiting for %s", deletionStages[stage], strings.Join(left, ", "))
			if err := r.deletingStatus(ctx, tc, msg); err != nil {
				return ctrl.Result{}, err
			}
			// Deletions show up as watch events; the requeue is a backstop
			// for children whose kind the operator does not watch.
			return ctrl.Result{RequeueAfter: 10 * time.Second}, nil
		}
	}
	patch := client.MergeFromWithOptions(tc.DeepCopy(), client.MergeFromWithOptimisticLock{})
	controllerutil.RemoveFinalizer(tc, Finalizer)
	if err := r.Client.Patch(ctx, tc, patch); client.IgnoreNotFound(err) != nil {
		return ctrl.Result{}, err
	}
	countWrite("patch", "TenantCluster")
	r.event(tc, corev1.EventTypeNormal, "Deleted", "Delete", "every child is gone")
	return ctrl.Result{}, nil
}

// deletingStatus says what the deletion waits for, once per change.
func (r *Reconciler) deletingStatus(ctx context.Context, tc *v1.TenantCluster, msg string) error {
	st := *tc.Status.DeepCopy()
	st.Phase = v1.PhaseDeleting
	apimeta.SetStatusCondition(&st.Conditions, metav1.Condition{
		Type: v1.ConditionReady, Status: metav1.ConditionFalse, Reason: ReasonDeleting, Message: msg, ObservedGeneration: tc.Generation,
	})
	if c := apimeta.FindStatusCondition(tc.Status.Conditions, v1.ConditionReady); c == nil || c.Message != msg {
		r.event(tc, corev1.EventTypeNormal, "Deleting", "Delete", "%s", msg)
	}
	return r.updateStatus(ctx, tc, st)
}
