package talosnode

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/siderolabs/talos/pkg/machinery/config/config"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
)

// Talos puts the machine config's node labels, annotations and taints on
// the Node through the API (not kubelet flags), and records which keys
// it owns so it changes or removes only those: a label someone else set
// stays.
const (
	ownedLabels      = "talos.dev/owned-labels"
	ownedAnnotations = "talos.dev/owned-annotations"
	ownedTaints      = "talos.dev/owned-taints"
)

// nodeSpec is what the config says the Node should carry.
type nodeSpec struct {
	labels, annotations map[string]string
	taints              []corev1.Taint
}

func desiredNode(mc config.Config) nodeSpec {
	s := nodeSpec{
		labels:      maps.Clone(mc.Machine().NodeLabels()),
		annotations: maps.Clone(mc.Machine().NodeAnnotations()),
	}
	if s.labels == nil {
		s.labels = map[string]string{}
	}
	if s.annotations == nil {
		s.annotations = map[string]string{}
	}
	cp := mc.Machine().Type().IsControlPlane()
	if cp {
		s.labels[controlPlaneTaint] = ""
	}
	if cp && !mc.Cluster().ScheduleOnControlPlanes() {
		s.taints = append(s.taints, corev1.Taint{Key: controlPlaneTaint, Effect: corev1.TaintEffectNoSchedule})
	}
	keys := slices.Sorted(maps.Keys(mc.Machine().NodeTaints()))
	for _, k := range keys {
		v := mc.Machine().NodeTaints()[k]
		t := corev1.Taint{Key: k}
		if value, effect, ok := strings.Cut(v, ":"); ok {
			t.Value, t.Effect = value, corev1.TaintEffect(effect)
		} else {
			t.Effect = corev1.TaintEffect(v)
		}
		s.taints = append(s.taints, t)
	}
	return s
}

// applyTo changes node to carry s, and reports whether anything changed.
func (s nodeSpec) applyTo(node *corev1.Node) bool {
	if node.Labels == nil {
		node.Labels = map[string]string{}
	}
	if node.Annotations == nil {
		node.Annotations = map[string]string{}
	}
	before := node.DeepCopy()
	ownedL := ownedKeys(node.Annotations[ownedLabels])
	ownedA := ownedKeys(node.Annotations[ownedAnnotations])
	ownedT := ownedKeys(node.Annotations[ownedTaints])

	ownedL = applyMap(node.Labels, s.labels, ownedL)
	ownedA = applyMap(node.Annotations, s.annotations, ownedA)

	var taints []corev1.Taint
	var nowOwned []string
	for _, t := range node.Spec.Taints {
		if i := slices.IndexFunc(s.taints, func(d corev1.Taint) bool { return d.Key == t.Key }); i >= 0 {
			if slices.Contains(ownedT, t.Key) || (t.Value == s.taints[i].Value && t.Effect == s.taints[i].Effect) {
				continue // replaced below
			}
			taints = append(taints, t) // someone else's
			continue
		}
		if slices.Contains(ownedT, t.Key) {
			continue // no longer wanted
		}
		taints = append(taints, t)
	}
	for _, d := range s.taints {
		if slices.ContainsFunc(taints, func(t corev1.Taint) bool { return t.Key == d.Key }) {
			continue
		}
		taints = append(taints, d)
		nowOwned = append(nowOwned, d.Key)
	}
	node.Spec.Taints = taints

	setOwned(node.Annotations, ownedLabels, ownedL)
	setOwned(node.Annotations, ownedAnnotations, ownedA)
	setOwned(node.Annotations, ownedTaints, nowOwned)
	return !equalNode(before, node)
}

// applyMap sets want's keys in have where absent, equal or owned, deletes
// owned keys no longer wanted, and returns the keys now owned.
func applyMap(have, want map[string]string, owned []string) []string {
	var now []string
	for _, k := range owned {
		if _, ok := want[k]; !ok {
			delete(have, k)
		}
	}
	for k, v := range want {
		cur, ok := have[k]
		if !ok || cur == v || slices.Contains(owned, k) {
			have[k] = v
			now = append(now, k)
		}
	}
	return now
}

func ownedKeys(s string) []string {
	var keys []string
	_ = json.Unmarshal([]byte(s), &keys)
	return keys
}

func setOwned(annotations map[string]string, key string, owned []string) {
	if len(owned) == 0 {
		delete(annotations, key)
		return
	}
	slices.Sort(owned)
	b, _ := json.Marshal(owned)
	annotations[key] = string(b)
}

func equalNode(a, b *corev1.Node) bool {
	return maps.Equal(a.Labels, b.Labels) && maps.Equal(a.Annotations, b.Annotations) &&
		slices.EqualFunc(a.Spec.Taints, b.Spec.Taints, func(x, y corev1.Taint) bool { return x.MatchTaint(&y) && x.Value == y.Value })
}

var nodesResource = schema.GroupVersionResource{Version: "v1", Resource: "nodes"}

// applyNode updates the Node named name to carry the config's labels,
// annotations and taints; it fails while the Node is not registered.
func applyNode(ctx context.Context, cfg *rest.Config, name string, spec nodeSpec) error {
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return err
	}
	for {
		u, err := dyn.Resource(nodesResource).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return fmt.Errorf("get node %s: %w", name, err)
		}
		var node corev1.Node
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &node); err != nil {
			return err
		}
		if !spec.applyTo(&node) {
			return nil
		}
		obj, err := runtime.DefaultUnstructuredConverter.ToUnstructured(&node)
		if err != nil {
			return err
		}
		u.Object = obj
		_, err = dyn.Resource(nodesResource).Update(ctx, u, metav1.UpdateOptions{FieldManager: "talos"})
		if apierrors.IsConflict(err) {
			continue
		}
		if err != nil {
			return fmt.Errorf("update node %s: %w", name, err)
		}
		return nil
	}
}
