// Package status reports what Flux says about the platform, one row per
// component: its Kustomization, the sources (Git, Helm and OCI
// repositories) and HelmReleases that Kustomization applied, whether each
// is Ready, and the first reason it is not. It reads only: the objects'
// Ready conditions, which Flux's controllers write.
package status

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// Labels kustomize-controller puts on everything a Kustomization applies.
const (
	labelKustomizationName      = "kustomize.toolkit.fluxcd.io/name"
	labelKustomizationNamespace = "kustomize.toolkit.fluxcd.io/namespace"
	// componentLabel is what the platform chart labels each component's
	// Kustomization with.
	componentLabel = "cozy.dev/component"
)

var (
	kustomizationGVK = schema.GroupVersionKind{Group: "kustomize.toolkit.fluxcd.io", Version: "v1", Kind: "Kustomization"}
	helmReleaseGVK   = schema.GroupVersionKind{Group: "helm.toolkit.fluxcd.io", Version: "v2", Kind: "HelmRelease"}
	sourceGVKs       = []schema.GroupVersionKind{
		{Group: "source.toolkit.fluxcd.io", Version: "v1", Kind: "GitRepository"},
		{Group: "source.toolkit.fluxcd.io", Version: "v1", Kind: "HelmRepository"},
		{Group: "source.toolkit.fluxcd.io", Version: "v1", Kind: "OCIRepository"},
	}
)

// Object is one Flux object and what its Ready condition says.
type Object struct {
	Kind      string `json:"kind"`
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	Ready     bool   `json:"ready"`
	// Reason and Message are the Ready condition's, or say why there is
	// none to trust (not reconciled yet, suspended, a newer generation).
	Reason  string `json:"reason,omitempty"`
	Message string `json:"message,omitempty"`
}

func (o Object) String() string { return o.Kind + " " + o.Namespace + "/" + o.Name }

// Component is one Kustomization of the platform and what it applied.
type Component struct {
	Name          string   `json:"name"`
	Kustomization Object   `json:"kustomization"`
	DependsOn     []string `json:"dependsOn,omitempty"`
	Sources       []Object `json:"sources"`
	Releases      []Object `json:"releases"`
	Ready         bool     `json:"ready"`
	// Off is a component the platform's rendering switched off
	// (platform.components.<name>.enabled: false): it has no
	// Kustomization, and does not count against Ready.
	Off bool `json:"off,omitempty"`
	// Message is the first reason the component is not ready: a failing
	// source first (nothing after it can work), then a failing release,
	// then the Kustomization's own message.
	Message string `json:"message,omitempty"`

	root bool // applies the other Kustomizations
}

// Report is the platform's status.
type Report struct {
	Components []Component `json:"components"`
	Ready      bool        `json:"ready"`
}

// Collect reads every Kustomization in namespace (the root one that
// `cozyctl platform install` made and one per component) and the sources
// and HelmReleases each applied, in any namespace.
func Collect(ctx context.Context, c client.Reader, namespace string) (*Report, error) {
	ks, err := list(ctx, c, kustomizationGVK, client.InNamespace(namespace))
	if err != nil {
		return nil, err
	}
	if len(ks) == 0 {
		return nil, fmt.Errorf("no Flux Kustomization in namespace %s: run cozyctl platform install first", namespace)
	}
	var sources, releases []unstructured.Unstructured
	for _, gvk := range sourceGVKs {
		l, err := list(ctx, c, gvk)
		if err != nil {
			return nil, err
		}
		sources = append(sources, l...)
	}
	if releases, err = list(ctx, c, helmReleaseGVK); err != nil {
		return nil, err
	}
	rep := build(ks, sources, releases)
	cm := &corev1.ConfigMap{}
	switch err := c.Get(ctx, client.ObjectKey{Namespace: namespace, Name: ComponentsConfigMap}, cm); {
	case apierrors.IsNotFound(err):
		// Rendered before components could be switched off: all are on.
	case err != nil:
		return nil, fmt.Errorf("read ConfigMap %s/%s: %w", namespace, ComponentsConfigMap, err)
	default:
		addOff(rep, cm.Data)
	}
	return rep, nil
}

// ComponentsConfigMap is the ConfigMap the platform's rendering puts
// beside the component Kustomizations, saying which components are "on"
// and "off" (platform/render.ComponentsConfigMap).
const ComponentsConfigMap = "cozy-platform-components"

// addOff adds a row for each component switched off that has no
// Kustomization (one that has, Flux has not pruned yet: its own row says
// how it is doing).
func addOff(rep *Report, onOff map[string]string) {
	have := map[string]bool{}
	for _, c := range rep.Components {
		have[c.Name] = true
	}
	for _, name := range slices.Sorted(maps.Keys(onOff)) {
		if onOff[name] != "off" || have[name] {
			continue
		}
		rep.Components = append(rep.Components, Component{
			Name: name, Off: true, Ready: true,
			Kustomization: Object{Kind: "Kustomization", Name: name},
			Sources:       []Object{}, Releases: []Object{},
			Message: "switched off (platform.components." + name + ".enabled: false)",
		})
	}
}

func list(ctx context.Context, c client.Reader, gvk schema.GroupVersionKind, opts ...client.ListOption) ([]unstructured.Unstructured, error) {
	l := &unstructured.UnstructuredList{}
	l.SetGroupVersionKind(gvk.GroupVersion().WithKind(gvk.Kind + "List"))
	if err := c.List(ctx, l, opts...); err != nil {
		return nil, fmt.Errorf("list %s: %w", gvk.Kind, err)
	}
	return l.Items, nil
}

// build is the pure part of Collect.
func build(ks, sources, releases []unstructured.Unstructured) *Report {
	appliedBy := func(u unstructured.Unstructured, k unstructured.Unstructured) bool {
		l := u.GetLabels()
		return l[labelKustomizationName] == k.GetName() && l[labelKustomizationNamespace] == k.GetNamespace()
	}
	rootRefs := map[ref]bool{}
	for _, k := range ks {
		if _, root := componentName(k); root {
			if r, ok := sourceRef(k); ok {
				rootRefs[r] = true
			}
		}
	}
	rep := &Report{Ready: true}
	for _, k := range ks {
		name, root := componentName(k)
		comp := Component{
			Name:          name,
			root:          root,
			Kustomization: judge(k),
			DependsOn:     dependsOn(k),
			Sources:       []Object{},
			Releases:      []Object{},
		}
		// The source the Kustomization reads, if nothing else reports it:
		// the root reports the platform repository every component reads,
		// and a source some Kustomization applied is reported by that one.
		if ref, ok := sourceRef(k); ok && (root || !rootRefs[ref]) {
			for _, s := range sources {
				if s.GetKind() == ref.Kind && s.GetNamespace() == ref.Namespace && s.GetName() == ref.Name &&
					s.GetLabels()[labelKustomizationName] == "" {
					comp.Sources = append(comp.Sources, judge(s))
				}
			}
		}
		for _, s := range sources {
			if appliedBy(s, k) {
				comp.Sources = append(comp.Sources, judge(s))
			}
		}
		for _, r := range releases {
			if appliedBy(r, k) {
				comp.Releases = append(comp.Releases, judge(r))
			}
		}
		comp.Ready, comp.Message = verdict(comp)
		rep.Ready = rep.Ready && comp.Ready
		rep.Components = append(rep.Components, comp)
	}
	sortByDependencies(rep.Components)
	return rep
}

func verdict(c Component) (bool, string) {
	for _, s := range c.Sources {
		if !s.Ready {
			return false, s.String() + ": " + s.Message
		}
	}
	for _, r := range c.Releases {
		if !r.Ready {
			return false, r.String() + ": " + r.Message
		}
	}
	if !c.Kustomization.Ready {
		return false, c.Kustomization.Message
	}
	return true, ""
}

// componentName is the platform's cozy.dev/component label, else the
// Kustomization's name (the root one has none).
func componentName(k unstructured.Unstructured) (name string, root bool) {
	if n := k.GetLabels()[componentLabel]; n != "" {
		return n, false
	}
	return k.GetName(), true
}

func dependsOn(k unstructured.Unstructured) []string {
	deps, _, _ := unstructured.NestedSlice(k.Object, "spec", "dependsOn")
	var out []string
	for _, d := range deps {
		if m, ok := d.(map[string]any); ok {
			if n, ok := m["name"].(string); ok {
				out = append(out, n)
			}
		}
	}
	return out
}

type ref struct{ Kind, Namespace, Name string }

func sourceRef(k unstructured.Unstructured) (ref, bool) {
	m, ok, _ := unstructured.NestedStringMap(k.Object, "spec", "sourceRef")
	if !ok || m["name"] == "" {
		return ref{}, false
	}
	r := ref{Kind: m["kind"], Namespace: cmp.Or(m["namespace"], k.GetNamespace()), Name: m["name"]}
	return r, true
}

// judge reads an object's Ready condition the way `flux get` does, but
// distrusts a success reported for an older generation.
func judge(u unstructured.Unstructured) Object {
	o := Object{Kind: u.GetKind(), Namespace: u.GetNamespace(), Name: u.GetName()}
	if suspended, _, _ := unstructured.NestedBool(u.Object, "spec", "suspend"); suspended {
		o.Reason, o.Message = "Suspended", "suspended: Flux does not reconcile it (flux resume)"
		return o
	}
	// OCI HelmRepositories are not reconciled: Flux gives them no status.
	if t, _, _ := unstructured.NestedString(u.Object, "spec", "type"); u.GetKind() == "HelmRepository" && t == "oci" {
		o.Ready, o.Reason = true, "Static"
		return o
	}
	conds, _, _ := unstructured.NestedSlice(u.Object, "status", "conditions")
	var ready map[string]any
	for _, c := range conds {
		if m, ok := c.(map[string]any); ok && m["type"] == "Ready" {
			ready = m
		}
	}
	if ready == nil {
		o.Reason, o.Message = "NotReconciled", "Flux has not reconciled it yet"
		return o
	}
	o.Reason, _ = ready["reason"].(string)
	o.Message, _ = ready["message"].(string)
	o.Message = strings.TrimSpace(o.Message)
	o.Ready = ready["status"] == "True"
	// Flux moves observedGeneration only when a reconcile succeeds, so a
	// failure is always the latest word, but a success may be the
	// previous generation's.
	observed, _, _ := unstructured.NestedInt64(u.Object, "status", "observedGeneration")
	if o.Ready && observed < u.GetGeneration() {
		o.Ready, o.Reason = false, "Progressing"
		o.Message = "Flux has not reconciled the latest change yet"
		return o
	}
	if !o.Ready && o.Message == "" {
		o.Message = o.Reason
	}
	return o
}

// sortByDependencies puts the root Kustomization (the one with no
// cozy.dev/component label, which applies the others) first, then each
// component after those it depends on, then by name, so the table reads
// in install order.
func sortByDependencies(cs []Component) {
	byName := map[string]*Component{}
	for i := range cs {
		byName[cs[i].Kustomization.Name] = &cs[i]
	}
	depth := map[string]int{}
	var visit func(name string, path int) int
	visit = func(name string, path int) int {
		c, ok := byName[name]
		if !ok || path > len(cs) {
			return 0 // missing or cyclic: Flux itself reports it
		}
		if d, ok := depth[name]; ok {
			return d
		}
		d := 1
		if c.root {
			d = 0
		}
		for _, dep := range c.DependsOn {
			d = max(d, visit(dep, path+1)+1)
		}
		depth[name] = d
		return d
	}
	for _, c := range cs {
		visit(c.Kustomization.Name, 0)
	}
	slices.SortStableFunc(cs, func(a, b Component) int {
		return cmp.Or(cmp.Compare(depth[a.Kustomization.Name], depth[b.Kustomization.Name]), cmp.Compare(a.Name, b.Name))
	})
}

// RootReady reports whether Flux has reconciled the root Kustomization
// name in namespace, and its source, and why not: what
// `cozyctl platform install` waits for.
func RootReady(ctx context.Context, c client.Reader, namespace, name string) (bool, string, error) {
	rep, err := Collect(ctx, c, namespace)
	if err != nil {
		return false, "", err
	}
	for _, comp := range rep.Components {
		if comp.Kustomization.Name == name {
			return comp.Ready, comp.Message, nil
		}
	}
	return false, fmt.Sprintf("no Kustomization %s/%s", namespace, name), nil
}
