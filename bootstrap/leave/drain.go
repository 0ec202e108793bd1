package leave

import (
	"context"
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
)

func hasNode(ctx context.Context, o Options, name string) (bool, error) {
	kc, err := o.Rack.Kube()
	if err != nil {
		return false, err
	}
	_, err = kc.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
	switch {
	case err == nil:
		return true, nil
	case apierrors.IsNotFound(err):
		return false, nil
	}
	return false, fmt.Errorf("the Kubernetes API: Node %s: %w", name, err)
}

// drain cordons the Node and evicts its pods as `kubectl drain
// --ignore-daemonsets` does: through the Eviction API, so that
// PodDisruptionBudgets hold (an eviction they refuse is retried until
// the timeout), leaving DaemonSet and static pods. It waits for the
// evicted pods to be gone only while the node's kubelet is Ready: on a
// dead node nothing would end them; the pod garbage collector deletes
// them once the Node is deleted.
func drain(ctx context.Context, o Options, name string) (cordoned bool, evicted []string, err error) {
	kc, err := o.Rack.Kube()
	if err != nil {
		return false, nil, err
	}
	node, err := kc.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return false, nil, nil
	}
	if err != nil {
		return false, nil, fmt.Errorf("the Kubernetes API: Node %s: %w", name, err)
	}
	if !node.Spec.Unschedulable {
		o.Log.Info("cordoning", "node", name)
		patch := []byte(`{"spec":{"unschedulable":true}}`)
		if _, err := kc.CoreV1().Nodes().Patch(ctx, name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
			return false, nil, fmt.Errorf("cordon %s: %w", name, err)
		}
		cordoned = true
	}
	pods, err := kc.CoreV1().Pods("").List(ctx, metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("spec.nodeName", name).String()})
	if err != nil {
		return cordoned, nil, fmt.Errorf("the pods on %s: %w", name, err)
	}
	var waitFor []corev1.Pod
	for _, p := range pods.Items {
		if !evictable(p) {
			continue
		}
		if err := evict(ctx, o, kc, p); err != nil {
			return cordoned, evicted, err
		}
		evicted = append(evicted, p.Namespace+"/"+p.Name)
		waitFor = append(waitFor, p)
	}
	if len(waitFor) == 0 {
		return cordoned, evicted, nil
	}
	if !ready(node) {
		o.Log.Info("the kubelet is not Ready: not waiting for the evicted pods to end; the pod garbage collector deletes them with the Node", "node", name, "pods", len(waitFor))
		return cordoned, evicted, nil
	}
	return cordoned, evicted, waitGone(ctx, o, kc, waitFor)
}

// evictable leaves out what drain leaves running: static (mirror) pods,
// DaemonSet pods, and pods already going.
func evictable(p corev1.Pod) bool {
	if _, mirror := p.Annotations[corev1.MirrorPodAnnotationKey]; mirror {
		return false
	}
	if p.DeletionTimestamp != nil || p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
		return false
	}
	for _, ref := range p.OwnerReferences {
		if ref.Controller != nil && *ref.Controller && ref.Kind == "DaemonSet" {
			return false
		}
	}
	return true
}

// evict asks the Eviction API to evict p, retrying while a
// PodDisruptionBudget refuses (429) until the timeout.
func evict(ctx context.Context, o Options, kc kubernetes.Interface, p corev1.Pod) error {
	ctx, cancel := context.WithTimeout(ctx, o.Timeout)
	defer cancel()
	ev := &policyv1.Eviction{ObjectMeta: metav1.ObjectMeta{Name: p.Name, Namespace: p.Namespace}}
	for {
		err := kc.CoreV1().Pods(p.Namespace).EvictV1(ctx, ev)
		switch {
		case err == nil, apierrors.IsNotFound(err):
			o.Log.Info("evicted", "pod", p.Namespace+"/"+p.Name)
			return nil
		case !apierrors.IsTooManyRequests(err):
			return fmt.Errorf("evict %s/%s: %w", p.Namespace, p.Name, err)
		}
		o.Log.Info("a disruption budget holds the eviction; retrying", "pod", p.Namespace+"/"+p.Name, "err", err)
		select {
		case <-ctx.Done():
			return fmt.Errorf("evict %s/%s: %w (last: %v)", p.Namespace, p.Name, ctx.Err(), err)
		case <-time.After(5 * time.Second):
		}
	}
}

func ready(n *corev1.Node) bool {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// waitGone waits until each pod is gone (or replaced by one of the same
// name with another UID).
func waitGone(ctx context.Context, o Options, kc kubernetes.Interface, pods []corev1.Pod) error {
	ctx, cancel := context.WithTimeout(ctx, o.Timeout)
	defer cancel()
	for {
		var left []string
		for _, p := range pods {
			got, err := kc.CoreV1().Pods(p.Namespace).Get(ctx, p.Name, metav1.GetOptions{})
			if apierrors.IsNotFound(err) || (err == nil && got.UID != p.UID) {
				continue
			}
			left = append(left, p.Namespace+"/"+p.Name)
		}
		if len(left) == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("drain: pods still on the node after %s: %s", o.Timeout, strings.Join(left, ", "))
		case <-time.After(time.Second):
		}
	}
}

// DeleteNode deletes the Node object, once the machine is reset; a Node
// already gone is fine. It retries until the timeout: right after a
// control plane leaves, the API behind the cluster's VIP may not answer
// until another control plane holds the VIP.
func DeleteNode(ctx context.Context, o Options, name string) (bool, error) {
	o = o.withDefaults()
	kc, err := o.Rack.Kube()
	if err != nil {
		return false, err
	}
	ctx, cancel := context.WithTimeout(ctx, o.Timeout)
	defer cancel()
	for {
		err = kc.CoreV1().Nodes().Delete(ctx, name, metav1.DeleteOptions{})
		switch {
		case err == nil:
			o.Log.Info("Node deleted", "node", name)
			return true, nil
		case apierrors.IsNotFound(err):
			return false, nil
		case apierrors.IsForbidden(err), apierrors.IsUnauthorized(err):
			return false, fmt.Errorf("delete Node %s: %w", name, err)
		}
		o.Log.Info("the Kubernetes API does not delete the Node yet; retrying", "node", name, "err", err)
		select {
		case <-ctx.Done():
			return false, fmt.Errorf("delete Node %s: %w", name, err)
		case <-time.After(2 * time.Second):
		}
	}
}
