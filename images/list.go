// Package images lists the container images a rack needs and copies them
// into a registry (the rack's registries.mirror), for racks that cannot
// reach the upstream registries and for the lab.
//
// The list is read from what Cozy renders, never kept by hand: the rack's
// Talos machine configs (generated in memory with throwaway secrets, since
// only image names matter), the platform layout `cozyctl platform render`
// writes, the charts Cozy ships (rendered with the values the platform and
// the operator give them) and the add-ons cozy-operator creates for a
// tenant. Images that only upstream content names (a chart fetched from a
// Helm repository, a release manifest, what the Cluster API operator
// downloads) cannot be read without fetching it; List reports each such
// source in NotListed instead of guessing.
package images

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"path"
	"slices"
	"strings"

	"github.com/siderolabs/talos/pkg/machinery/config/generate/secrets"
	"helm.sh/helm/v3/pkg/chart"
	"helm.sh/helm/v3/pkg/chartutil"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/yaml"

	"cozy.dev/cozy/bootstrap/rack"
	"cozy.dev/cozy/bootstrap/talosconfig"
	"cozy.dev/cozy/charts"
	"cozy.dev/cozy/internal/imageref"
	v1 "cozy.dev/cozy/operators/api/v1alpha1"
	"cozy.dev/cozy/operators/tenantcluster"
	"cozy.dev/cozy/platform/flux"
	"cozy.dev/cozy/platform/render"
	"cozy.dev/cozy/platform/upstream"
	"cozy.dev/cozy/tenant/workerimage"
)

// Image is one image the rack needs and what needs it.
type Image struct {
	// Ref is the canonical reference (imageref): registry host always
	// given, docker.io's library/ spelt out.
	Ref string `json:"image"`
	// NeededBy says who runs it: "talos: kubelet", "cozy-operator",
	// "tenant add-on: kubevirt-ccm (kubevirt-cloud-controller-manager)".
	NeededBy []string `json:"neededBy"`
}

// List is what a rack needs.
type List struct {
	// Images, sorted by reference, each once.
	Images []Image `json:"images"`
	// Charts are the upstream charts Cozy made to read their images
	// (only with a ChartMaker), sorted, each once: what `images mirror`
	// pushes for the rack's platform.mirror.
	Charts []Chart `json:"charts,omitempty"`
	// NotListed names upstream content whose images are not in Images:
	// "platform cert-manager: chart cert-manager 1.21.2 (HelmRepository
	// cozy-cert-manager/jetstack)".
	NotListed []string `json:"notListed,omitempty"`
}

// MirrorCharts are the charts the list made, as Mirror pushes them (the
// OCI artifact `helm push` makes of each).
func (l *List) MirrorCharts() ([]MirrorChart, error) {
	var out []MirrorChart
	for _, c := range l.Charts {
		img, err := ChartImage(c.Made.Chart.Metadata, c.Made.Archive)
		if err != nil {
			return nil, err
		}
		out = append(out, MirrorChart{Name: c.Name, Version: c.Version, Image: img})
	}
	return out, nil
}

// Refs are the images' references, in order.
func (l *List) Refs() []string {
	out := make([]string, len(l.Images))
	for i, img := range l.Images {
		out[i] = img.Ref
	}
	return out
}

// Chart is an upstream chart the rack's platform installs.
type Chart struct {
	Name     string   `json:"name"`
	Version  string   `json:"version"`
	NeededBy []string `json:"neededBy"`
	// Made is the chart as the list made it, for `images mirror` to push.
	Made *upstream.Packaged `json:"-"`
}

// ChartMaker makes the upstream charts the platform installs, so that
// their images can be read (upstream.Maker, from the Go module proxy).
type ChartMaker = upstream.ChartMaker

// ForRack lists the images rack r needs. With charts, the upstream
// charts Cozy can make are rendered too; those it cannot make, or all of
// them without charts, are named in NotListed. The control-plane images
// of tenants at tenantVersions are listed too (Kamaji runs them at each
// tenant's version, which the rack does not say); without any, NotListed
// says they are not.
func ForRack(ctx context.Context, r *rack.Rack, charts ChartMaker, tenantVersions ...string) (*List, error) {
	for _, v := range tenantVersions {
		if err := v1.CheckVersion(v); err != nil {
			return nil, fmt.Errorf("tenant %w", err)
		}
	}
	b := builder{ctx: ctx, charts: charts, needs: map[string][]string{}, tenantVersions: tenantVersions}
	if err := b.talos(r); err != nil {
		return nil, err
	}
	if err := b.platform(r); err != nil {
		return nil, err
	}
	return b.list()
}

type builder struct {
	ctx            context.Context
	charts         ChartMaker
	tenantVersions []string
	made           map[[2]string]*Chart // chart {name, version} -> the chart
	needs          map[string][]string  // canonical ref -> needed by
	notListed      []string
	err            error
}

func (b *builder) add(ref, neededBy string) {
	r, err := imageref.Parse(ref)
	if err != nil {
		if b.err == nil {
			b.err = fmt.Errorf("%s: %w", neededBy, err)
		}
		return
	}
	s := r.String()
	if !slices.Contains(b.needs[s], neededBy) {
		b.needs[s] = append(b.needs[s], neededBy)
	}
}

func (b *builder) list() (*List, error) {
	if b.err != nil {
		return nil, b.err
	}
	l := &List{}
	for _, ref := range slices.Sorted(maps.Keys(b.needs)) {
		needs := b.needs[ref]
		slices.Sort(needs)
		l.Images = append(l.Images, Image{Ref: ref, NeededBy: needs})
	}
	for _, k := range slices.SortedFunc(maps.Keys(b.made), func(a, b [2]string) int {
		return cmp.Or(cmp.Compare(a[0], b[0]), cmp.Compare(a[1], b[1]))
	}) {
		c := b.made[k]
		slices.Sort(c.NeededBy)
		l.Charts = append(l.Charts, *c)
	}
	slices.Sort(b.notListed)
	l.NotListed = slices.Compact(b.notListed)
	return l, nil
}

// talos adds what Talos starts on each machine, from its generated
// config. The secrets are made for this call and dropped: image names do
// not depend on them.
func (b *builder) talos(r *rack.Rack) error {
	contract, err := talosconfig.Contract(r)
	if err != nil {
		return err
	}
	s, err := secrets.NewBundle(secrets.NewClock(), contract)
	if err != nil {
		return fmt.Errorf("throwaway secrets: %w", err)
	}
	g := &talosconfig.Generator{Rack: r, Secrets: s}
	for i := range r.Machines {
		cfg, err := g.Config(&r.Machines[i])
		if err != nil {
			return err
		}
		for _, img := range talosconfig.Images(cfg) {
			b.add(img.Ref, "talos: "+img.Component)
		}
	}
	return nil
}

// platform adds the images of the rendered platform layout.
func (b *builder) platform(r *rack.Rack) error {
	values, err := render.Values(r)
	if err != nil {
		return err
	}
	l, err := render.RenderValues(values, r.Cluster.KubernetesVersion)
	if err != nil {
		return err
	}
	// The Git source of Cozy's charts: the rack's values over the
	// platform chart's defaults, as the layout was rendered with.
	pc, err := render.LoadChart(charts.Platform)
	if err != nil {
		return err
	}
	all, err := chartutil.CoalesceValues(pc, values)
	if err != nil {
		return err
	}
	own := ownCharts{}
	own.name, _, _ = unstructured.NestedString(all, "git", "sourceRef", "name")
	own.namespace, _, _ = unstructured.NestedString(all, "git", "sourceRef", "namespace")

	for _, p := range l.Paths() {
		if path.Base(p) != "kustomization.yaml" || !strings.HasPrefix(p, l.ClusterDir+"/") {
			continue
		}
		var k struct {
			Resources []string `json:"resources"`
			Images    []struct {
				Name, NewName, NewTag string
			} `json:"images"`
		}
		if err := yaml.Unmarshal(l.Files[p], &k); err != nil {
			return fmt.Errorf("%s: %w", p, err)
		}
		component := path.Base(path.Dir(p))
		for _, res := range k.Resources {
			if strings.HasPrefix(res, "https://") || strings.HasPrefix(res, "http://") {
				b.notListed = append(b.notListed, fmt.Sprintf("platform %s: %s", component, res))
			}
		}
		// An image the component pins by name and tag is one it runs,
		// whatever else its remote manifests name.
		for _, im := range k.Images {
			if im.NewTag != "" {
				b.add(cmp.Or(im.NewName, im.Name)+":"+im.NewTag, fmt.Sprintf("platform: %s (kustomize images)", component))
			}
		}
	}

	objs, err := l.Objects()
	if err != nil {
		return err
	}
	sources := map[string]source{} // "Kind namespace/name" -> where it reads
	for _, o := range objs {
		src := source{}
		src.url, _, _ = unstructured.NestedString(o.Object, "spec", "url")
		if src.url == "" || !strings.HasPrefix(o.GetAPIVersion(), "source.toolkit.fluxcd.io/") {
			continue
		}
		if ref, ok, _ := unstructured.NestedStringMap(o.Object, "spec", "ref"); ok {
			for _, k := range []string{"tag", "semver", "branch", "commit"} {
				if ref[k] != "" {
					src.refKind, src.ref = k, ref[k]
					break
				}
			}
		}
		sources[o.GetKind()+" "+o.GetNamespace()+"/"+o.GetName()] = src
	}
	operator := false
	for _, o := range objs {
		component := o.GetLabels()["cozy.dev/component"]
		switch {
		case o.GetKind() == "HelmRelease":
			chart, ok, err := own.chart(o.Unstructured)
			if err != nil {
				return fmt.Errorf("%s: %w", o.File, err)
			}
			if !ok {
				err := b.upstream(o.Unstructured, sources, "platform "+component, func(container string) string {
					return fmt.Sprintf("platform: %s (%s)", component, container)
				})
				if err != nil {
					return fmt.Errorf("%s: %w", o.File, err)
				}
				continue
			}
			// Images of Cozy's own charts are named after the chart:
			// "cozy-operator".
			if err := b.ownChart(chart, o.Unstructured, func(string) string { return chart }); err != nil {
				return fmt.Errorf("%s: %w", o.File, err)
			}
			operator = operator || chart == charts.CozyOperator
		case strings.HasPrefix(o.GetAPIVersion(), "operator.cluster.x-k8s.io/"):
			// The Cluster API operator downloads each provider's
			// components (and their images) when it installs it.
			version, _, _ := unstructured.NestedString(o.Object, "spec", "version")
			b.notListed = append(b.notListed, fmt.Sprintf("platform %s: %s %s %s (the Cluster API operator fetches its components)", component, o.GetKind(), o.GetName(), version))
		default:
			for _, c := range render.Containers(o.Object) {
				b.add(c.Image, fmt.Sprintf("platform: %s (%s)", component, c.Name))
			}
		}
	}
	// Flux itself, which `platform install` applies from its release.
	b.notListed = append(b.notListed, "flux: "+flux.ReleaseURL(flux.Version)+" (cozyctl platform install)")
	if operator {
		// Tenant workers run every pod in a sandbox of this image (Cozy's
		// worker image names it; their containerd pulls it through the
		// rack's mirror).
		b.add(workerimage.SandboxImage, "tenant workers: pause (pod sandbox)")
		// Konnectivity, on unless a TenantCluster turns it off: its server
		// in each tenant's control-plane pod, its agent on each worker.
		b.add(tenantcluster.KonnectivityServerImage+":"+tenantcluster.KonnectivityVersion, "tenant control planes: konnectivity-server")
		b.add(tenantcluster.KonnectivityAgentImage+":"+tenantcluster.KonnectivityVersion, "tenant workers: konnectivity-agent")
		// CoreDNS, Kamaji's add-on in each tenant, at the operator's pin.
		b.add(tenantcluster.CoreDNSImage+":"+tenantcluster.CoreDNSVersion, "tenant workers: coredns")
		b.tenantControlPlanes()
		return b.tenantAddons(own, sources)
	}
	return nil
}

// tenantControlPlanes adds the control-plane images of the tenant
// versions asked for, or says they are not listed. The workers' disk
// image of each version is Cozy's own (hack/worker-image.sh), not pulled
// from upstream: NotListed says how to get it into the mirror.
func (b *builder) tenantControlPlanes() {
	if len(b.tenantVersions) == 0 {
		b.notListed = append(b.notListed, "tenant control planes: "+strings.Join(tenantcluster.ControlPlaneComponents, ", ")+
			" at each tenant's Kubernetes version (name the versions with --tenant-version)")
	}
	for _, v := range b.tenantVersions {
		for i, ref := range tenantcluster.ControlPlaneImages(v) {
			b.add(ref, "tenant control planes "+v+": "+tenantcluster.ControlPlaneComponents[i])
		}
		b.notListed = append(b.notListed, fmt.Sprintf("tenant workers %s: %s (Cozy's own: hack/worker-image.sh %s, then images mirror --from)",
			v, workerimage.DefaultRepository+":"+v, v))
	}
}

// tenantAddons adds the images of the add-ons cozy-operator creates for
// each tenant, with the images the operator defaults to (the platform
// does not override them): rendered for a sample tenant with every
// add-on on.
func (b *builder) tenantAddons(own ownCharts, sources map[string]source) error {
	tc := &v1.TenantCluster{
		ObjectMeta: metav1.ObjectMeta{Name: "sample", Namespace: "tenant-sample"},
		Spec: v1.TenantClusterSpec{
			Version:      "v1.37.2",
			Network:      v1.Network{PodCIDR: "10.243.0.0/16", ServiceCIDR: "10.95.0.0/16"},
			StorageClass: "replicated",
			NodeGroups:   []v1.NodeGroup{{Name: "workers", MinReplicas: ptr.To[int32](1), MaxReplicas: ptr.To[int32](3)}},
		},
	}
	cfg := tenantcluster.DefaultAddonConfig()
	objs, err := tenantcluster.DesiredAddons(tc, cfg, "sample.tenant.example", 6443)
	if err != nil {
		return fmt.Errorf("tenant add-ons: %w", err)
	}
	if len(objs) == 0 {
		return fmt.Errorf("tenant add-ons: a tenant with every add-on on gets no objects")
	}
	for _, o := range objs {
		addon := o.GetLabels()[tenantcluster.LabelAddon]
		if o.GetKind() == "HelmRelease" {
			chart, ok, err := own.chart(o)
			if err != nil {
				return fmt.Errorf("tenant add-on %s: %w", addon, err)
			}
			neededBy := func(container string) string {
				return fmt.Sprintf("tenant add-on: %s (%s)", addon, container)
			}
			if !ok {
				err = b.upstream(o, sources, "tenant add-on "+addon, neededBy)
			} else {
				err = b.ownChart(chart, o, neededBy)
			}
			if err != nil {
				return fmt.Errorf("tenant add-on %s: %w", addon, err)
			}
			continue
		}
		for _, c := range render.Containers(o.Object) {
			b.add(c.Image, fmt.Sprintf("tenant add-on: %s (%s)", addon, c.Name))
		}
	}
	return nil
}

// ownCharts recognises HelmReleases of Cozy's charts: from the platform's
// own Git source, under ./charts/ (where `platform render` puts them).
type ownCharts struct{ name, namespace string }

// chart is the Cozy chart hr installs, and whether it is one.
func (c ownCharts) chart(hr *unstructured.Unstructured) (string, bool, error) {
	spec, ok, _ := unstructured.NestedMap(hr.Object, "spec", "chart", "spec")
	if !ok {
		return "", false, nil // spec.chartRef: an OCIRepository or HelmChart
	}
	kind, _, _ := unstructured.NestedString(spec, "sourceRef", "kind")
	name, _, _ := unstructured.NestedString(spec, "sourceRef", "name")
	ns, _, _ := unstructured.NestedString(spec, "sourceRef", "namespace")
	chart, _, _ := unstructured.NestedString(spec, "chart")
	if ns == "" {
		ns = hr.GetNamespace()
	}
	if kind != "GitRepository" || name != c.name || ns != c.namespace {
		return "", false, nil
	}
	dir, ok := strings.CutPrefix(path.Clean(chart), "charts/")
	if !ok || !slices.Contains(charts.InRepository, dir) {
		return "", false, fmt.Errorf("chart %s from the platform's repository is not one of Cozy's charts (%s)", chart, strings.Join(charts.InRepository, ", "))
	}
	return dir, true, nil
}

// ownChart renders Cozy's chart name with hr's values, as Flux would
// install it, and adds the images of its pods.
func (b *builder) ownChart(name string, hr *unstructured.Unstructured, neededBy func(container string) string) error {
	c, err := render.LoadChart(name)
	if err != nil {
		return err
	}
	return b.renderChart(c, hr, render.Chart, neededBy)
}

// upstream renders the upstream chart hr installs, made by b.charts, and
// adds its images; a chart that cannot be made is named in NotListed
// (what: "platform networking") with the reason.
func (b *builder) upstream(hr *unstructured.Unstructured, sources map[string]source, what string, neededBy func(container string) string) error {
	desc := what + ": " + upstreamChart(hr, sources)
	name, version := chartOf(hr, sources)
	if _, ok := upstream.Unavailable[name]; ok || b.charts == nil {
		b.notListed = append(b.notListed, desc)
		return nil
	}
	p, err := b.charts.Make(b.ctx, name, version)
	if err != nil {
		b.notListed = append(b.notListed, desc+": "+err.Error())
		return nil
	}
	if b.made == nil {
		b.made = map[[2]string]*Chart{}
	}
	k := [2]string{name, version}
	if b.made[k] == nil {
		b.made[k] = &Chart{Name: name, Version: version, Made: p}
	}
	if c := b.made[k]; !slices.Contains(c.NeededBy, what) {
		c.NeededBy = append(c.NeededBy, what)
	}
	return b.renderChart(p.Chart, hr, render.Template, neededBy)
}

// renderChart renders chart c with hr's values through renderer
// (render.Chart for Cozy's charts, render.Template for upstream ones), as
// Flux would install it, and adds the images of its pods.
func (b *builder) renderChart(c *chart.Chart, hr *unstructured.Unstructured, renderer func(*chart.Chart, map[string]any, string, string, string) (map[string]string, error), neededBy func(container string) string) error {
	release, ns, values, err := render.ReleaseInputs(hr)
	if err != nil {
		return err
	}
	files, err := renderer(c, values, release, ns, "")
	if err != nil {
		return err
	}
	objs, err := render.DecodeChart(files)
	if err != nil {
		return fmt.Errorf("chart %s, %w", c.Name(), err)
	}
	for _, o := range objs {
		for _, ct := range render.Containers(o.Object) {
			b.add(ct.Image, neededBy(ct.Name))
		}
	}
	return nil
}

// source is where a Flux source reads: its URL and the ref it follows.
type source struct{ url, refKind, ref string }

func (s source) String() string {
	if s.ref == "" {
		return s.url
	}
	return s.url + " " + s.refKind + " " + s.ref
}

// sourceOf is the source a HelmRelease's sourceRef or chartRef names.
func sourceOf(hr *unstructured.Unstructured, ref map[string]any, sources map[string]source) (source, bool) {
	kind, _ := ref["kind"].(string)
	name, _ := ref["name"].(string)
	ns, _ := ref["namespace"].(string)
	s, ok := sources[kind+" "+cmp.Or(ns, hr.GetNamespace())+"/"+name]
	return s, ok
}

// chartOf is the name and version of the upstream chart hr installs: a
// HelmRepository's chart and version; an OCIRepository's (chartRef) last
// URL element and tag; a Git chart's folder name and the tag checked out.
func chartOf(hr *unstructured.Unstructured, sources map[string]source) (name, version string) {
	if ref, ok, _ := unstructured.NestedMap(hr.Object, "spec", "chartRef"); ok {
		s, _ := sourceOf(hr, ref, sources)
		return path.Base(s.url), s.ref
	}
	chart, _, _ := unstructured.NestedString(hr.Object, "spec", "chart", "spec", "chart")
	version, _, _ = unstructured.NestedString(hr.Object, "spec", "chart", "spec", "version")
	if version == "" {
		ref, _, _ := unstructured.NestedMap(hr.Object, "spec", "chart", "spec", "sourceRef")
		s, _ := sourceOf(hr, ref, sources)
		version = s.ref
	}
	return path.Base(path.Clean(chart)), version
}

// upstreamChart describes the chart an upstream HelmRelease installs and
// where its source reads it from (sources: see platform).
func upstreamChart(hr *unstructured.Unstructured, sources map[string]source) string {
	from := func(ref map[string]any) string {
		if s, ok := sourceOf(hr, ref, sources); ok {
			return s.String()
		}
		kind, _ := ref["kind"].(string)
		name, _ := ref["name"].(string)
		return kind + " " + name
	}
	if ref, ok, _ := unstructured.NestedMap(hr.Object, "spec", "chartRef"); ok {
		return "chart " + from(ref)
	}
	chart, _, _ := unstructured.NestedString(hr.Object, "spec", "chart", "spec", "chart")
	version, _, _ := unstructured.NestedString(hr.Object, "spec", "chart", "spec", "version")
	ref, _, _ := unstructured.NestedMap(hr.Object, "spec", "chart", "spec", "sourceRef")
	s := "chart " + path.Clean(chart)
	if version != "" {
		s += " " + version
	}
	return s + " from " + from(ref)
}
