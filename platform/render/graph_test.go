package render_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"path"
	"regexp"
	"slices"
	"strings"
	"testing"

	helmv2 "github.com/fluxcd/helm-controller/api/v2"
	kustomizev1 "github.com/fluxcd/kustomize-controller/api/v1"
	sourcev1 "github.com/fluxcd/source-controller/api/v1"

	"cozy.dev/cozy/platform/render"
)

// strict decodes obj into the upstream Go type out, refusing fields the
// type does not have: a misspelt Flux field fails here, not in a cluster.
func strict(t *testing.T, obj render.Object, out any) {
	t.Helper()
	data, err := json.Marshal(obj.Object)
	if err != nil {
		t.Fatal(err)
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(out); err != nil {
		t.Fatalf("%s: %s %s is not a valid %T: %v", obj.File, obj.GetKind(), obj.GetName(), out, err)
	}
}

// fluxObjects is a layout's Flux objects, decoded into their upstream types.
type fluxObjects struct {
	kustomizations map[string]*kustomizev1.Kustomization // by namespace/name
	releases       map[string]*helmv2.HelmRelease
	sources        map[string]bool // kind/namespace/name
	all            []render.Object
}

func key(ns, name string) string { return ns + "/" + name }

func decodeFlux(t *testing.T, l *render.Layout) fluxObjects {
	t.Helper()
	objs, err := l.Objects()
	if err != nil {
		t.Fatal(err)
	}
	f := fluxObjects{
		kustomizations: map[string]*kustomizev1.Kustomization{},
		releases:       map[string]*helmv2.HelmRelease{},
		// `cozyctl platform install` creates the repository's own source.
		sources: map[string]bool{"GitRepository/flux-system/flux-system": true},
		all:     objs,
	}
	for _, o := range objs {
		id := key(o.GetNamespace(), o.GetName())
		switch o.GetAPIVersion() + " " + o.GetKind() {
		case "kustomize.toolkit.fluxcd.io/v1 Kustomization":
			k := &kustomizev1.Kustomization{}
			strict(t, o, k)
			f.kustomizations[id] = k
		case "helm.toolkit.fluxcd.io/v2 HelmRelease":
			r := &helmv2.HelmRelease{}
			strict(t, o, r)
			f.releases[id] = r
		case "source.toolkit.fluxcd.io/v1 HelmRepository":
			strict(t, o, &sourcev1.HelmRepository{})
			f.sources["HelmRepository/"+id] = true
		case "source.toolkit.fluxcd.io/v1 OCIRepository":
			r := &sourcev1.OCIRepository{}
			strict(t, o, r)
			if r.Spec.Reference == nil || (r.Spec.Reference.Tag == "" && r.Spec.Reference.Digest == "") {
				t.Errorf("OCIRepository %s is not pinned to a tag or digest", id)
			}
			f.sources["OCIRepository/"+id] = true
		case "source.toolkit.fluxcd.io/v1 GitRepository":
			r := &sourcev1.GitRepository{}
			strict(t, o, r)
			if r.Spec.Reference == nil || (r.Spec.Reference.Tag == "" && r.Spec.Reference.Commit == "") {
				t.Errorf("GitRepository %s is not pinned to a tag or commit", id)
			}
			f.sources["GitRepository/"+id] = true
		default:
			if strings.Contains(o.GetAPIVersion(), "fluxcd.io") {
				t.Errorf("%s: unexpected Flux kind %s %s", o.File, o.GetAPIVersion(), o.GetKind())
			}
		}
	}
	return f
}

// graph is "a must be ready before b" edges: b dependsOn a.
type graph map[string][]string

func (g graph) reaches(from, to string) bool {
	seen := map[string]bool{}
	var walk func(n string) bool
	walk = func(n string) bool {
		if n == to {
			return true
		}
		if seen[n] {
			return false
		}
		seen[n] = true
		return slices.ContainsFunc(g[n], walk)
	}
	return walk(from)
}

// cycle returns a dependency cycle, if any.
// add records that id (a kind in namespace ns) comes after each of deps
// ({namespace, name}, the namespace defaulting to ns), each of which must
// exist.
func (g graph) add(t *testing.T, kind, id, ns string, deps [][2]string, exists func(string) bool) {
	t.Helper()
	if _, ok := g[id]; !ok {
		g[id] = nil
	}
	for _, d := range deps {
		if d[0] == "" {
			d[0] = ns
		}
		dep := key(d[0], d[1])
		if !exists(dep) {
			t.Errorf("%s %s depends on %s, which the layout does not have", kind, id, dep)
		}
		g[dep] = append(g[dep], id)
	}
}

func (g graph) cycle() []string {
	const (
		unseen = iota
		active
		done
	)
	state := map[string]int{}
	var stack []string
	var found []string
	var visit func(n string)
	visit = func(n string) {
		if found != nil {
			return
		}
		state[n] = active
		stack = append(stack, n)
		for _, m := range g[n] {
			switch state[m] {
			case active:
				found = append(slices.Clone(stack[slices.Index(stack, m):]), m)
				return
			case unseen:
				visit(m)
			}
		}
		stack = stack[:len(stack)-1]
		state[n] = done
	}
	for _, n := range sortedGraphKeys(g) {
		if state[n] == unseen {
			visit(n)
		}
	}
	return found
}

func sortedGraphKeys(g graph) []string {
	keys := make([]string, 0, len(g))
	for k := range g {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// layouts are the renderings every structural test runs on: the lab's
// (no load-balancer pool, no disks) and the example rack's (both).
func layouts(t *testing.T) map[string]*render.Layout {
	return map[string]*render.Layout{
		"lab":     mustRender(t, labRack(t)),
		"example": mustRender(t, exampleRack(t, "prod")),
		// A slow machine's: every wait longer, Deployments' progress
		// deadlines through post-renderers.
		"slow": mustRender(t, exampleRack(t, "prod", platformLine,
			platformLine+"  values:\n    flux: {timeout: 45m, progressDeadlineSeconds: 2700}\n")),
	}
}

// TestDependsOnGraph checks the order components install in: acyclic,
// every reference resolves, and the orderings the platform relies on hold.
func TestDependsOnGraph(t *testing.T) {
	for name, l := range layouts(t) {
		t.Run(name, func(t *testing.T) {
			f := decodeFlux(t, l)

			// Flux Kustomizations: "component before component".
			ks := graph{}
			for id, k := range f.kustomizations {
				var deps [][2]string
				for _, d := range k.Spec.DependsOn {
					deps = append(deps, [2]string{d.Namespace, d.Name})
				}
				ks.add(t, "Kustomization", id, k.Namespace, deps, func(dep string) bool { _, ok := f.kustomizations[dep]; return ok })
			}
			if c := ks.cycle(); c != nil {
				t.Fatalf("Kustomizations depend on each other in a cycle: %s", strings.Join(c, " -> "))
			}
			hr := graph{}
			for id, r := range f.releases {
				var deps [][2]string
				for _, d := range r.Spec.DependsOn {
					deps = append(deps, [2]string{d.Namespace, d.Name})
				}
				hr.add(t, "HelmRelease", id, r.Namespace, deps, func(dep string) bool { _, ok := f.releases[dep]; return ok })
			}
			if c := hr.cycle(); c != nil {
				t.Fatalf("HelmReleases depend on each other in a cycle: %s", strings.Join(c, " -> "))
			}

			k := func(n string) string { return key("flux-system", n) }
			before := func(g graph, kind, a, b string) {
				t.Helper()
				if _, ok := g[b]; !ok {
					return // b is not rendered for this rack (metallb-pool without a pool)
				}
				if _, ok := g[a]; !ok {
					t.Errorf("%s %s is missing", kind, a)
					return
				}
				if !g.reaches(a, b) {
					t.Errorf("%s %s does not wait for %s", kind, b, a)
				}
			}
			// The CNI before everything.
			for id := range f.kustomizations {
				if id != k("networking") {
					before(ks, "Kustomization", k("networking"), id)
				}
			}
			// cert-manager before the components whose webhooks it serves.
			for _, c := range []string{"kamaji", "cluster-api", "cluster-api-providers", "cozy-operator"} {
				before(ks, "Kustomization", k("cert-manager"), k(c))
			}
			// CRD owners before their users; storage before what claims volumes.
			for _, p := range [][2]string{
				{"metallb", "metallb-pool"},
				{"cluster-api", "cluster-api-providers"},
				{"kamaji", "cluster-api-providers"},
				{"kubevirt", "cluster-api-providers"},
				{"cdi", "cluster-api-providers"},
				{"cluster-api-providers", "cozy-operator"},
				{"linstor", "kamaji"},
				{"linstor", "cdi"},
			} {
				before(ks, "Kustomization", k(p[0]), k(p[1]))
			}
			// Inside components: kube-proxy replacement before Kube-OVN
			// (it reaches the API through a Service), the Piraeus
			// operator (its CRDs) before the LINSTOR cluster.
			before(hr, "HelmRelease", key("cozy-cilium", "cilium"), key("cozy-kube-ovn", "kube-ovn"))
			before(hr, "HelmRelease", key("cozy-linstor", "piraeus-operator"), key("cozy-linstor", "linstor-cluster"))
		})
	}
}

var exactVersion = regexp.MustCompile(`^v?[0-9]+\.[0-9]+\.[0-9]+$`)

// pinnedRaw is a file of a GitHub repository at a release tag.
var pinnedRaw = regexp.MustCompile(`^https://raw\.githubusercontent\.com/[^/]+/[^/]+/v[0-9]+\.[0-9]+\.[0-9]+/`)

// TestComponentsAreComplete checks what makes Ready mean ready and keeps
// installs reproducible: every component waits for what it applied and
// has a timeout, every release has remediation and a pinned chart, every
// source a release names exists, every folder a Kustomization applies is
// in the layout, and remote manifests are pinned releases.
func TestComponentsAreComplete(t *testing.T) {
	for name, l := range layouts(t) {
		t.Run(name, func(t *testing.T) {
			f := decodeFlux(t, l)
			if len(f.kustomizations) < 10 {
				t.Fatalf("only %d Kustomizations rendered", len(f.kustomizations))
			}
			for id, k := range f.kustomizations {
				s := k.Spec
				if !s.Wait || s.Timeout == nil || !s.Prune || s.RetryInterval == nil {
					t.Errorf("Kustomization %s: want wait, prune, timeout and retryInterval set", id)
				}
				dir := strings.TrimPrefix(s.Path, "./")
				kfile := path.Join(dir, "kustomization.yaml")
				data, ok := l.Files[kfile]
				if !ok {
					t.Errorf("Kustomization %s applies %s, which has no kustomization.yaml in the layout", id, dir)
					continue
				}
				docs, err := render.Decode(data)
				if err != nil || len(docs) != 1 {
					t.Fatalf("%s: %v", kfile, err)
				}
				res, _, _ := unstructuredStrings(docs[0].Object, "resources")
				for _, r := range res {
					switch {
					case strings.HasPrefix(r, "https://"):
						if !strings.Contains(r, "/releases/download/v") && !pinnedRaw.MatchString(r) {
							t.Errorf("%s: remote resource %s is neither a pinned release asset nor a file at a release tag", kfile, r)
						}
						if !strings.Contains(string(data), "kustomize.toolkit.fluxcd.io/prune: disabled") {
							t.Errorf("%s: Flux would prune the CRDs of %s with the component", kfile, r)
						}
					default:
						if _, ok := l.Files[path.Join(dir, r)]; !ok {
							t.Errorf("%s lists %s, which the layout does not have", kfile, r)
						}
					}
				}
			}
			for id, r := range f.releases {
				s := r.Spec
				if s.Timeout == nil || s.Install == nil || s.Install.Remediation == nil || s.Install.Remediation.Retries < 1 ||
					s.Upgrade == nil || s.Upgrade.Remediation == nil || s.Upgrade.Remediation.Retries < 1 {
					t.Errorf("HelmRelease %s: want a timeout and install and upgrade remediation with retries", id)
				}
				if s.TargetNamespace != r.Namespace {
					t.Errorf("HelmRelease %s installs into %q, not its own namespace", id, s.TargetNamespace)
				}
				var src string
				switch {
				case s.Chart != nil:
					ref := s.Chart.Spec.SourceRef
					ns := ref.Namespace
					if ns == "" {
						ns = r.Namespace
					}
					src = fmt.Sprintf("%s/%s/%s", ref.Kind, ns, ref.Name)
					if ref.Kind == "HelmRepository" && !exactVersion.MatchString(s.Chart.Spec.Version) {
						t.Errorf("HelmRelease %s: chart version %q is not pinned", id, s.Chart.Spec.Version)
					}
				case s.ChartRef != nil:
					ns := s.ChartRef.Namespace
					if ns == "" {
						ns = r.Namespace
					}
					src = fmt.Sprintf("%s/%s/%s", s.ChartRef.Kind, ns, s.ChartRef.Name)
				default:
					t.Errorf("HelmRelease %s has no chart", id)
				}
				if !f.sources[src] {
					t.Errorf("HelmRelease %s reads its chart from %s, which the layout does not have", id, src)
				}
			}
		})
	}
}

// TestNamespaces checks that each component runs in its own cozy-*
// namespace. KubeVirt's and CDI's release manifests create their own
// namespaces (kubevirt, and a cluster-scoped CDI), which Cozy does not
// rewrite; their KubeVirt resource is the one allowed exception.
func TestNamespaces(t *testing.T) {
	l := mustRender(t, labRack(t))
	objs, err := l.Objects()
	if err != nil {
		t.Fatal(err)
	}
	declared := map[string]bool{"flux-system": true}
	for _, o := range objs {
		if o.GetKind() == "Namespace" {
			if !strings.HasPrefix(o.GetName(), "cozy-") {
				t.Errorf("%s: namespace %s is not a cozy-* namespace", o.File, o.GetName())
			}
			declared[o.GetName()] = true
		}
	}
	for _, o := range objs {
		ns := o.GetNamespace()
		switch {
		case ns == "" || o.GetKind() == "KubeVirt" && ns == "kubevirt":
		case ns == "flux-system" && o.GetKind() == "ConfigMap" && o.GetName() == render.ComponentsConfigMap:
		case ns == "flux-system" && o.GetKind() != "Kustomization":
			t.Errorf("%s: %s %s is in flux-system; only the component Kustomizations (and the list of components on and off) belong there", o.File, o.GetKind(), o.GetName())
		case !declared[ns]:
			t.Errorf("%s: %s %s is in namespace %s, which the layout does not create", o.File, o.GetKind(), o.GetName(), ns)
		}
	}
}

func unstructuredStrings(obj map[string]any, field string) ([]string, bool, error) {
	raw, ok := obj[field].([]any)
	if !ok {
		return nil, false, nil
	}
	out := make([]string, 0, len(raw))
	for _, r := range raw {
		s, ok := r.(string)
		if !ok {
			return nil, true, fmt.Errorf("%s: %v is not a string", field, r)
		}
		out = append(out, s)
	}
	return out, true, nil
}
