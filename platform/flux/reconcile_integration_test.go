//go:build integration

package flux_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fluxcd/pkg/gittestserver"
	"go.uber.org/zap/zapcore"
	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	storagev1 "k8s.io/api/storage/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/yaml"

	"cozy.dev/cozy/bootstrap/rack"
	"cozy.dev/cozy/images"
	"cozy.dev/cozy/images/registry"
	"cozy.dev/cozy/internal/cli"
	"cozy.dev/cozy/internal/testing/netnstest"
	"cozy.dev/cozy/internal/testing/poll"
	"cozy.dev/cozy/internal/testing/prereq"
	"cozy.dev/cozy/internal/testing/testenv"
	"cozy.dev/cozy/lab"
	"cozy.dev/cozy/operators/tenantcluster"
	"cozy.dev/cozy/platform/flux"
	"cozy.dev/cozy/platform/render"
	"cozy.dev/cozy/platform/status"
	"cozy.dev/cozy/platform/upstream"
)

// TestFluxReconcilesPlatform is the platform's end-to-end check without
// nodes: real Flux controllers (built from their modules by
// hack/flux-controllers.sh) run against a real kube-apiserver, and a local
// Git server serves the lab rack's rendered platform.
//
// The controllers run in a network namespace with only loopback; the API
// server, the Git server and a registry mirroring cert-manager's chart
// (the rack's platform.mirror) are forwarded into it. So charts that live
// on the internet or are missing from the mirror cannot be fetched, and
// must say so in the status, and no test traffic leaves the machine.
//
// Phases:
//  1. platform install (Flux manifests kustomized from the controllers'
//     modules, as the air-gapped path reads them), controllers started,
//     install run again with a wait: the root Kustomization becomes Ready.
//  2. platform status shows the networking component failing on Cilium's
//     chart, which the mirror lacks (the row names chart, version and
//     registry), and the components after it waiting for it.
//  3. With the root suspended and cozy-operator's dependencies lifted (its
//     chart is in the same repository), Flux installs our own chart: its
//     objects and the TenantCluster CRD exist, and once a stand-in for the kubelet reports its
//     Deployment available, the HelmRelease and the Kustomization are
//     Ready.
//  4. The operator, run with the Deployment's arguments as the chart's
//     ServiceAccount, makes a TenantCluster's add-ons; helm-controller
//     installs Cozy's CSI node chart from the repository into a second
//     API server standing in for the tenant, and metrics-server's
//     unreachable chart is reported on the TenantCluster (tenantAddons).
//  5. With its dependency lifted, Flux pulls cert-manager's chart (made
//     from its module), pinned at v1.21.1, from the mirror and installs
//     it; with a stand-in kubelet for its Deployments and post-install
//     Job, the component is Ready.
//  6. The pin moves to v1.21.2 in a new commit: Flux upgrades
//     cert-manager from the mirror, and cozy-operator's release and
//     Deployment do not change.
func TestFluxReconcilesPlatform(t *testing.T) {
	bin := fluxBinaries(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()

	ns := netnstest.New(t, "flux")
	env := testenv.Start(t, testenv.Options{CRDs: []testenv.CRDSource{}})
	apiURL, err := url.Parse(env.Config.Host)
	if err != nil {
		t.Fatal(err)
	}
	ns.Forward(t, apiURL.Host)

	// The chart mirror: a registry holding cert-manager's chart alone, at
	// two versions, made from its module as `images mirror --rack` makes it.
	reg := chartMirror(t, ctx, "cert-manager", "v1.21.1", "v1.21.2")
	ns.Forward(t, reg)

	// The platform repository: the lab rack's rendering, reading the
	// charts Cozy makes from the mirror, with cert-manager pinned one
	// patch back (phase 6 upgrades it).
	repoDir := t.TempDir()
	r := labRack(t)
	r.Platform.Mirror = "http://" + reg + "/charts"
	r.Platform.Values = map[string]any{"versions": map[string]any{"certManager": "v1.21.1"}}
	layout, err := render.Render(r)
	if err != nil {
		t.Fatal(err)
	}
	if err := layout.Write(repoDir); err != nil {
		t.Fatal(err)
	}
	gs, err := gittestserver.NewTempGitServer()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(gs.Root()) })
	if err := gs.InitRepo(repoDir, "main", "platform.git"); err != nil {
		t.Fatalf("push the rendered platform: %v", err)
	}
	if err := gs.StartHTTP(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(gs.StopHTTP)
	gitURL, err := url.Parse(gs.HTTPAddress())
	if err != nil {
		t.Fatal(err)
	}
	ns.Forward(t, gitURL.Host)

	// Phase 1: install, start the controllers, install again and wait.
	manifests := filepath.Join(t.TempDir(), "install.yaml")
	if err := testenv.FluxInstallManifests(ctx, manifests); err != nil {
		t.Fatal(err)
	}
	objs, err := flux.Load(ctx, manifests)
	if err != nil {
		t.Fatal(err)
	}
	git := flux.Git{URL: gs.HTTPAddress() + "/platform.git", Branch: "main", Path: "clusters/lab", Interval: 10 * time.Second}
	opts := flux.Options{Manifests: objs, Git: git, Poll: 500 * time.Millisecond, Progress: func(m string) { t.Log(m) }}
	if err := flux.Install(ctx, env.Client, opts); err != nil {
		t.Fatalf("install: %v", err)
	}
	kubeconfig := env.WriteKubeconfig(t)
	startControllers(t, ns, bin, kubeconfig)

	// Again, as a user would: the CLI, waiting for the root to be Ready.
	cozyctl(t, "platform", "install", "--kubeconfig", kubeconfig, "--flux-manifests", manifests,
		"--git-url", git.URL, "--path", git.Path, "--git-interval", "10s", "--wait", "3m")
	if ok, why, err := status.RootReady(ctx, env.Client, flux.Namespace, flux.SyncName); !ok || err != nil {
		t.Fatalf("platform install returned, but the root Kustomization is not Ready: %s %v", why, err)
	}

	// Phase 2: the components are there, and honest about what fails:
	// the mirror lacks Cilium's chart, and the row says which.
	var rep *status.Report
	poll.Until(t, ctx, time.Second, "networking to report the chart missing from the mirror", seen(func() (bool, string) {
		rep = platformStatus(t, kubeconfig)
		c := component(rep, "networking")
		return c != nil && !c.Ready && strings.Contains(c.Message, "cilium") && strings.Contains(c.Message, "1.20.2") &&
			strings.Contains(c.Message, reg), fmt.Sprintf("%+v", c)
	}))
	t.Logf("cozyctl platform status:\n%s", cozyctl(t, "platform", "status", "--kubeconfig", kubeconfig))
	if rep.Ready {
		t.Error("the platform reports Ready, but its charts cannot be fetched here")
	}
	if root := component(rep, flux.SyncName); root == nil || !root.Ready {
		t.Errorf("root Kustomization: %+v, want Ready", root)
	}
	for _, name := range []string{"cert-manager", "kubevirt", "cozy-operator"} {
		c := component(rep, name)
		if c == nil {
			t.Errorf("status has no component %s", name)
			continue
		}
		if c.Ready || !strings.Contains(c.Message, "dependency") {
			t.Errorf("%s: ready=%v %q, want it waiting for a dependency", name, c.Ready, c.Message)
		}
	}
	if rep.Components[0].Name != flux.SyncName || rep.Components[1].Name != "networking" {
		t.Errorf("status order starts %s, %s; want the root, then networking (install order)", rep.Components[0].Name, rep.Components[1].Name)
	}

	// Phase 3: our own chart, installed by Flux from the repository.
	patch := func(obj client.Object, p string) {
		t.Helper()
		if err := env.Client.Patch(ctx, obj, client.RawPatch(types.MergePatchType, []byte(p))); err != nil {
			t.Fatalf("patch %s: %v", obj.GetName(), err)
		}
	}
	kustomization := func(name string) *unstructured.Unstructured {
		u := &unstructured.Unstructured{}
		u.SetAPIVersion("kustomize.toolkit.fluxcd.io/v1")
		u.SetKind("Kustomization")
		u.SetNamespace(flux.Namespace)
		u.SetName(name)
		return u
	}
	patch(kustomization(flux.SyncName), `{"spec":{"suspend":true}}`)
	patch(kustomization("cozy-operator"), `{"spec":{"dependsOn":null}}`)
	go standInKubelet(ctx, env.Client, "cozy-system")

	poll.Until(t, ctx, time.Second, "the cozy-operator chart's objects to exist", seen(func() (bool, string) {
		var d appsv1.Deployment
		err := env.Client.Get(ctx, client.ObjectKey{Namespace: "cozy-system", Name: "cozy-operator"}, &d)
		return err == nil, fmt.Sprint(err)
	}))
	var sa corev1.ServiceAccount
	if err := env.Client.Get(ctx, client.ObjectKey{Namespace: "cozy-system", Name: "cozy-operator"}, &sa); err != nil {
		t.Errorf("the chart's ServiceAccount: %v", err)
	}
	// The chart's crds/ folder: helm-controller installs it (CreateReplace).
	var crd apiextensionsv1.CustomResourceDefinition
	if err := env.Client.Get(ctx, client.ObjectKey{Name: "tenantclusters.tenancy.cozy.dev"}, &crd); err != nil {
		t.Errorf("the chart's TenantCluster CRD: %v", err)
	}
	var roles rbacv1.ClusterRoleList
	if err := env.Client.List(ctx, &roles, client.MatchingLabels{"helm.toolkit.fluxcd.io/name": "cozy-operator"}); err != nil || len(roles.Items) == 0 {
		t.Errorf("the chart's ClusterRoles (labelled by helm-controller): %d, %v", len(roles.Items), err)
	}
	poll.Until(t, ctx, time.Second, "cozy-operator to be Ready", seen(func() (bool, string) {
		rep = platformStatus(t, kubeconfig)
		c := component(rep, "cozy-operator")
		return c != nil && c.Ready && len(c.Releases) == 1 && c.Releases[0].Ready, fmt.Sprintf("%+v", c)
	}))

	// Phase 4: a tenant's add-ons, installed by Flux into the tenant.
	patch(kustomization("tenant-addons"), `{"spec":{"dependsOn":null}}`)
	tenantAddons(t, ctx, env, ns, kubeconfig)

	// Phase 5: an upstream component from the mirror. With its dependency
	// lifted, Flux pulls cert-manager's chart from the local registry and
	// installs it: its CRDs and Deployments exist, and once a stand-in
	// for the kubelet runs its Deployments and its post-install check Job,
	// the component is Ready.
	patch(kustomization("cert-manager"), `{"spec":{"dependsOn":null}}`)
	go standInKubelet(ctx, env.Client, "cozy-cert-manager")
	certManagerAt := func(version string) {
		t.Helper()
		poll.Until(t, ctx, time.Second, "cert-manager "+version+", from the mirror, to be Ready", seen(func() (bool, string) {
			rep = platformStatus(t, kubeconfig)
			c := component(rep, "cert-manager")
			var d appsv1.Deployment
			err := env.Client.Get(ctx, client.ObjectKey{Namespace: "cozy-cert-manager", Name: "cert-manager"}, &d)
			at := err == nil && strings.HasSuffix(d.Spec.Template.Spec.Containers[0].Image, ":"+version)
			return at && c != nil && c.Ready && len(c.Releases) == 1 && c.Releases[0].Ready, fmt.Sprintf("%+v, deployment %v", c, err)
		}))
	}
	certManagerAt("v1.21.1")
	if err := env.Client.Get(ctx, client.ObjectKey{Name: "certificates.cert-manager.io"}, &crd); err != nil {
		t.Errorf("cert-manager's Certificate CRD, from the mirrored chart: %v", err)
	}

	// Phase 6: the pin moves one patch up (the rack's default, v1.21.2),
	// the rendering is committed, and Flux upgrades cert-manager from the
	// mirror, and nothing else: cozy-operator's chart, read from the same
	// repository by its version (+ the digest of its files), keeps its
	// release and its Deployment.
	operatorDeployment := func() int64 {
		var d appsv1.Deployment
		if err := env.Client.Get(ctx, client.ObjectKey{Namespace: "cozy-system", Name: "cozy-operator"}, &d); err != nil {
			t.Fatal(err)
		}
		return d.Generation
	}
	operatorBefore, operatorHistory := operatorDeployment(), releaseHistory(t, ctx, env.Client, "cozy-system", "cozy-operator")
	r.Platform.Values = nil
	next, err := render.Render(r)
	if err != nil {
		t.Fatal(err)
	}
	changed := pushLayout(t, git.URL, git.Branch, next)
	if want := []string{"clusters/lab/components/cert-manager/cert-manager.yaml", "clusters/lab/values.yaml"}; !slices.Equal(changed, want) {
		t.Errorf("the pin's upgrade changed %v in the repository, want %v", changed, want)
	}
	certManagerAt("v1.21.2")
	if after := operatorDeployment(); after != operatorBefore {
		t.Errorf("cozy-operator's Deployment went from generation %d to %d, but only cert-manager's pin moved", operatorBefore, after)
	}
	if after := releaseHistory(t, ctx, env.Client, "cozy-system", "cozy-operator"); after != operatorHistory {
		t.Errorf("cozy-operator's release went from %s to %s, but only cert-manager's pin moved", operatorHistory, after)
	}
	t.Logf("cozyctl platform status:\n%s", cozyctl(t, "platform", "status", "--kubeconfig", kubeconfig))
}

// releaseHistory is a HelmRelease's history as helm-controller records
// it: each release's version and chart, newest first.
func releaseHistory(t *testing.T, ctx context.Context, c client.Client, namespace, name string) string {
	t.Helper()
	u := &unstructured.Unstructured{}
	u.SetAPIVersion("helm.toolkit.fluxcd.io/v2")
	u.SetKind("HelmRelease")
	if err := c.Get(ctx, client.ObjectKey{Namespace: namespace, Name: name}, u); err != nil {
		t.Fatal(err)
	}
	history, _, _ := unstructured.NestedSlice(u.Object, "status", "history")
	var out []string
	for _, h := range history {
		m, _ := h.(map[string]any)
		out = append(out, fmt.Sprintf("v%v %v %v", m["version"], m["chartName"], m["chartVersion"]))
	}
	return strings.Join(out, ", ")
}

// pushLayout commits layout over branch of the repository at gitURL, as
// a user does after `platform render`, and returns the files the commit
// changed.
func pushLayout(t *testing.T, gitURL, branch string, layout *render.Layout) []string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "clone")
	git := func(args ...string) string {
		t.Helper()
		cmd := exec.Command("git", append([]string{"-C", dir, "-c", "user.name=cozy", "-c", "user.email=cozy@example.invalid"}, args...)...)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("git %v: %v\n%s", args, err, out)
		}
		return string(out)
	}
	if out, err := exec.Command("git", "clone", "--quiet", "--branch", branch, gitURL, dir).CombinedOutput(); err != nil {
		t.Fatalf("git clone: %v\n%s", err, out)
	}
	if err := layout.Write(dir); err != nil {
		t.Fatal(err)
	}
	git("add", "-A")
	git("commit", "--quiet", "-m", "platform: render")
	git("push", "--quiet", "origin", "HEAD:"+branch)
	return strings.Fields(git("diff", "--name-only", "HEAD~1", "HEAD"))
}

// chartMirror serves a registry on loopback holding the named upstream
// chart at each version, made from its module (through the go command's
// download cache) and pushed under charts/ as `images mirror` pushes it.
// It returns the registry's host:port.
func chartMirror(t *testing.T, ctx context.Context, name string, versions ...string) string {
	t.Helper()
	var charts []images.MirrorChart
	cache := t.TempDir()
	for _, version := range versions {
		c, err := upstream.Find(name, version)
		if err != nil {
			t.Fatal(err)
		}
		proxy, err := testenv.ModuleProxy(ctx, c.Module)
		if err != nil {
			t.Fatal(err)
		}
		made, err := upstream.Maker{Source: upstream.Source{Proxies: []string{proxy}, Cache: cache}}.Make(ctx, name, version)
		if err != nil {
			t.Fatal(err)
		}
		img, err := images.ChartImage(made.Chart.Metadata, made.Archive)
		if err != nil {
			t.Fatal(err)
		}
		charts = append(charts, images.MirrorChart{Name: name, Version: version, Image: img})
	}
	srv, err := registry.Listen("127.0.0.1:0", t.TempDir(), slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	sctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(sctx) }()
	t.Cleanup(func() {
		stop()
		if err := <-done; err != nil {
			t.Errorf("registry: %v", err)
		}
	})
	addr := srv.Addr().String()
	if _, err := images.Mirror(ctx, images.MirrorOptions{
		Registry: addr, Insecure: true, Source: &images.Upstream{}, Charts: charts,
	}); err != nil {
		t.Fatal(err)
	}
	return addr
}

// tenantAddons is phase 4 of TestFluxReconcilesPlatform: the operator
// runs with the arguments and RBAC that Flux installed from the platform
// repository; a TenantCluster's add-on HelmReleases then make
// helm-controller install Cozy's CSI node chart, from the same
// repository, into a second API server that stands in for the tenant
// (forwarded into the controllers' namespace like the first), through
// the tenant's kubeconfig Secret. metrics-server's chart is on the
// internet: its HelmRelease, and the TenantCluster, say so.
func tenantAddons(t *testing.T, ctx context.Context, env *testenv.Env, ns *netnstest.NS, kubeconfig string) {
	// What the operator needs besides its own CRD: Cluster API's,
	// Kamaji's and KubeVirt's (Flux's are installed).
	var sources []testenv.CRDSource
	for _, s := range testenv.UpstreamCRDs() {
		if !strings.HasPrefix(s.Module, "github.com/fluxcd/") {
			sources = append(sources, s)
		}
	}
	crds, err := testenv.LoadCRDs(ctx, sources)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := envtest.InstallCRDs(env.Config, envtest.CRDInstallOptions{CRDs: crds}); err != nil {
		t.Fatalf("install Cluster API CRDs: %v", err)
	}

	// The operator as the chart runs it: its add-on charts from the
	// Deployment's arguments, its identity the chart's ServiceAccount.
	var dep appsv1.Deployment
	if err := env.Client.Get(ctx, client.ObjectKey{Namespace: "cozy-system", Name: "cozy-operator"}, &dep); err != nil {
		t.Fatal(err)
	}
	addons := tenantcluster.DefaultAddonConfig()
	for _, arg := range dep.Spec.Template.Spec.Containers[0].Args {
		if v, ok := strings.CutPrefix(arg, "--addon-chart="); ok {
			addon, ref, err := tenantcluster.ParseChartRef(v)
			if err != nil {
				t.Fatalf("the chart's %s: %v", arg, err)
			}
			addons.Charts[addon] = ref
		}
	}
	if src := addons.Charts[tenantcluster.AddonCSINode].Source; src.Kind != "GitRepository" || src.Namespace != flux.Namespace || src.Name != flux.SyncName {
		t.Fatalf("the platform points the CSI node chart at %+v, not its own repository", src)
	}
	startOperator(t, env, addons)

	// The tenant's API server and its kubeconfig Secret, as Kamaji and
	// Cluster API would write them.
	tenant := testenv.Start(t, testenv.Options{CRDs: []testenv.CRDSource{}})
	tenantURL, err := url.Parse(tenant.Config.Host)
	if err != nil {
		t.Fatal(err)
	}
	ns.Forward(t, tenantURL.Host)
	tenantKubeconfig, err := os.ReadFile(tenant.WriteKubeconfig(t))
	if err != nil {
		t.Fatal(err)
	}
	go standInNodes(ctx, tenant.Client)

	const tenantNS = "tenant-acme"
	tc := &unstructured.Unstructured{}
	if err := yaml.Unmarshal([]byte(`
apiVersion: tenancy.cozy.dev/v1alpha1
kind: TenantCluster
metadata: {name: acme, namespace: tenant-acme}
spec:
  version: v1.36.3
  storageClass: replicated
  nodeGroups: [{name: md0, replicas: 1, resources: {cpu: 2, memory: 4Gi}, diskSize: 20Gi}]
  addons:
    cni: {enabled: false}
    cloudControllerManager: {enabled: false}
`), &tc.Object); err != nil {
		t.Fatal(err)
	}
	for _, obj := range []client.Object{&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: tenantNS}}, tc} {
		if err := env.Client.Create(ctx, obj); err != nil {
			t.Fatal(err)
		}
	}
	cluster := &unstructured.Unstructured{}
	cluster.SetAPIVersion("cluster.x-k8s.io/v1beta2")
	cluster.SetKind("Cluster")
	poll.Until(t, ctx, time.Second, "the operator to create the Cluster", seen(func() (bool, string) {
		err := env.Client.Get(ctx, client.ObjectKey{Namespace: tenantNS, Name: "acme"}, cluster)
		return err == nil, fmt.Sprint(err)
	}))
	port, err := strconv.Atoi(tenantURL.Port())
	if err != nil {
		t.Fatal(err)
	}
	endpoint := fmt.Sprintf(`{"spec":{"controlPlaneEndpoint":{"host":%q,"port":%d}}}`, tenantURL.Hostname(), port)
	if err := env.Client.Patch(ctx, cluster, client.RawPatch(types.MergePatchType, []byte(endpoint))); err != nil {
		t.Fatal(err)
	}
	secret := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: "acme-kubeconfig", Namespace: tenantNS, Labels: map[string]string{"cluster.x-k8s.io/cluster-name": "acme"}},
		Data:       map[string][]byte{"value": tenantKubeconfig},
	}
	if err := env.Client.Create(ctx, secret); err != nil {
		t.Fatal(err)
	}

	// The CSI node chart, from the platform repository, in the tenant.
	ready := func(name string) (bool, string) {
		hr := &unstructured.Unstructured{}
		hr.SetAPIVersion("helm.toolkit.fluxcd.io/v2")
		hr.SetKind("HelmRelease")
		if err := env.Client.Get(ctx, client.ObjectKey{Namespace: tenantNS, Name: name}, hr); err != nil {
			return false, err.Error()
		}
		conds, _, _ := unstructured.NestedSlice(hr.Object, "status", "conditions")
		for _, c := range conds {
			if m, _ := c.(map[string]any); m["type"] == "Ready" {
				return m["status"] == "True", fmt.Sprintf("%v: %v", m["reason"], m["message"])
			}
		}
		return false, "no Ready condition"
	}
	poll.Until(t, ctx, time.Second, "helm-controller to install kubevirt-csi-node into the tenant", seen(func() (bool, string) {
		return ready("acme-kubevirt-csi-node")
	}))
	var sc storagev1.StorageClass
	if err := tenant.Client.Get(ctx, client.ObjectKey{Name: "kubevirt"}, &sc); err != nil {
		t.Fatalf("the tenant's StorageClass: %v", err)
	}
	if sc.Provisioner != "csi.kubevirt.io" || sc.Parameters["infraStorageClassName"] != "replicated" || sc.Annotations["storageclass.kubernetes.io/is-default-class"] != "true" {
		t.Errorf("tenant StorageClass %s: provisioner %s, parameters %v, annotations %v", sc.Name, sc.Provisioner, sc.Parameters, sc.Annotations)
	}
	var driver storagev1.CSIDriver
	if err := tenant.Client.Get(ctx, client.ObjectKey{Name: "csi.kubevirt.io"}, &driver); err != nil {
		t.Errorf("the tenant's CSIDriver: %v", err)
	}
	var ds appsv1.DaemonSet
	if err := tenant.Client.Get(ctx, client.ObjectKey{Namespace: "kube-system", Name: "kubevirt-csi-node"}, &ds); err != nil {
		t.Errorf("the tenant's node plugin: %v", err)
	} else if img := ds.Spec.Template.Spec.Containers[0].Image; img != addons.CSIDriverImage {
		t.Errorf("node plugin image %s, want the operator's %s", img, addons.CSIDriverImage)
	}

	// metrics-server's repository is out of reach: said, not hidden.
	poll.Until(t, ctx, time.Second, "the TenantCluster to report metrics-server's chart unreachable", seen(func() (bool, string) {
		if ok, msg := ready("acme-metrics-server"); ok {
			return false, "metrics-server Ready: " + msg
		}
		if err := env.Client.Get(ctx, client.ObjectKeyFromObject(tc), tc); err != nil {
			return false, err.Error()
		}
		conds, _, _ := unstructured.NestedSlice(tc.Object, "status", "conditions")
		for _, c := range conds {
			if m, _ := c.(map[string]any); m["type"] == "AddonsReady" {
				msg := fmt.Sprint(m["message"])
				return m["status"] == "False" && strings.Contains(msg, "metrics-server") && !strings.Contains(msg, "kubevirt-csi-node"), msg
			}
		}
		return false, "no AddonsReady condition"
	}))
	rep := platformStatus(t, kubeconfig)
	if c := component(rep, "tenant-addons"); c == nil || c.Ready || !failedFetch(c.Message) {
		t.Errorf("tenant-addons component %+v, want it failing on its Helm repositories", c)
	}
}

// startOperator runs cozy-operator in the test, as the ServiceAccount
// the chart made, with the RBAC Flux installed: what the chart does not
// grant fails.
func startOperator(t *testing.T, env *testenv.Env, addons tenantcluster.AddonConfig) {
	opts, err := tenantcluster.ManagerOptions()
	if err != nil {
		t.Fatal(err)
	}
	opts.Metrics, opts.HealthProbeBindAddress = metricsserver.Options{BindAddress: "0"}, "0"
	ctrl.SetLogger(zap.New(zap.WriteTo(os.Stderr), zap.Level(zapcore.ErrorLevel)))
	cfg := rest.CopyConfig(env.Config)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: "system:serviceaccount:cozy-system:cozy-operator"}
	mgr, err := ctrl.NewManager(cfg, opts)
	if err != nil {
		t.Fatal(err)
	}
	r := &tenantcluster.Reconciler{Recorder: mgr.GetEventRecorder("cozy-operator"), Addons: addons}
	if err := r.SetupWithManager(mgr, 2); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("operator: %v", err)
		}
	})
}

// standInNodes reports every DaemonSet in the tenant as rolled out on
// its one node, as the kube-controller-manager would once a kubelet ran
// the pods: the tenant's test API server has neither. It stops with ctx.
func standInNodes(ctx context.Context, c client.Client) {
	for ctx.Err() == nil {
		var ds appsv1.DaemonSetList
		if err := c.List(ctx, &ds); err == nil {
			for i := range ds.Items {
				d := &ds.Items[i]
				if d.Status.ObservedGeneration == d.Generation && d.Status.NumberReady == 1 {
					continue
				}
				d.Status = appsv1.DaemonSetStatus{
					ObservedGeneration:     d.Generation,
					DesiredNumberScheduled: 1, CurrentNumberScheduled: 1, UpdatedNumberScheduled: 1,
					NumberReady: 1, NumberAvailable: 1,
				}
				_ = c.Status().Update(ctx, d)
			}
		}
		select {
		case <-ctx.Done():
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// fluxBinaries is the directory hack/flux-controllers.sh built.
func fluxBinaries(t *testing.T) string {
	dir := os.Getenv("COZY_FLUX_BIN")
	if dir == "" {
		prereq.Missing(t, "COZY_FLUX_BIN is not set; run `make test`, or export COZY_FLUX_BIN=$(hack/flux-controllers.sh)")
	}
	for _, c := range testenv.FluxControllers() {
		if _, err := os.Stat(filepath.Join(dir, c.Name)); err != nil {
			prereq.Missing(t, "COZY_FLUX_BIN=%s has no %s; rebuild with hack/flux-controllers.sh", dir, c.Name)
		}
	}
	return dir
}

func labRack(t *testing.T) *rack.Rack {
	c := lab.Config{Name: "lab", Dir: "/var/lib/cozy/labs/lab"}
	c, err := c.WithDefaults()
	if err != nil {
		t.Fatal(err)
	}
	r, err := rack.Parse(c.Rack(), "lab-rack.yaml", t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// startControllers runs Flux's three controllers inside ns, logging to
// files that are kept as test artefacts.
func startControllers(t *testing.T, ns *netnstest.NS, bin, kubeconfig string) {
	logs := os.Getenv("COZY_TEST_ARTIFACTS")
	if logs == "" {
		logs = t.TempDir()
	} else if err := os.MkdirAll(logs, 0o755); err != nil {
		t.Fatal(err)
	}
	storage := t.TempDir()
	// Each binds its metrics and health ports to all interfaces by
	// default; 0 turns them off. The artifact server is on loopback.
	common := []string{"--metrics-addr=0", "--health-addr=0", "--log-level=debug", "--log-encoding=console"}
	args := map[string][]string{
		"source-controller": append([]string{
			"--storage-path=" + storage, "--storage-addr=127.0.0.1:9790", "--storage-adv-addr=127.0.0.1:9790",
		}, common...),
		"kustomize-controller": common,
		"helm-controller":      common,
	}
	for _, c := range testenv.FluxControllers() {
		ctx, cancel := context.WithCancel(context.Background())
		cmd := ns.Command(ctx, filepath.Join(bin, c.Name), args[c.Name]...)
		cmd.Env = append(os.Environ(), "KUBECONFIG="+kubeconfig, "RUNTIME_NAMESPACE="+flux.Namespace)
		logFile, err := os.Create(filepath.Join(logs, "flux-"+c.Name+".log"))
		if err != nil {
			t.Fatal(err)
		}
		cmd.Stdout, cmd.Stderr = logFile, logFile
		if err := cmd.Start(); err != nil {
			t.Fatalf("start %s: %v", c.Name, err)
		}
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		t.Cleanup(func() {
			cancel()
			<-done
			logFile.Close()
			if t.Failed() {
				t.Logf("%s log: %s", c.Name, logFile.Name())
			}
		})
	}
}

// cozyctl runs the CLI in-process and returns its stdout.
func cozyctl(t *testing.T, args ...string) []byte {
	t.Helper()
	var stdout, stderr bytes.Buffer
	cmd := cli.NewRootCommand(&stdout, &stderr)
	cmd.SetArgs(args)
	if err := cmd.Execute(); err != nil {
		t.Fatalf("cozyctl %s: %v: %s", strings.Join(args, " "), err, stderr.String())
	}
	return stdout.Bytes()
}

// platformStatus runs `cozyctl platform status -o json`.
func platformStatus(t *testing.T, kubeconfig string) *status.Report {
	out := cozyctl(t, "platform", "status", "--kubeconfig", kubeconfig, "-o", "json")
	var rep status.Report
	if err := json.Unmarshal(out, &rep); err != nil {
		t.Fatalf("platform status -o json: %v: %s", err, out)
	}
	return &rep
}

func component(rep *status.Report, name string) *status.Component {
	for i := range rep.Components {
		if rep.Components[i].Name == name {
			return &rep.Components[i]
		}
	}
	return nil
}

// failedFetch says whether a message is a source's failure to reach the
// internet (DNS or connect, as seen from a namespace with no route out).
func failedFetch(msg string) bool {
	for _, s := range []string{"failed to fetch", "failed to get", "dial tcp", "no such host", "network is unreachable", "failed to determine artifact digest"} {
		if strings.Contains(msg, s) {
			return true
		}
	}
	return false
}

// standInKubelet reports every Deployment in namespace as rolled out and
// available, and every Job as complete, as the kube-controller-manager
// would once a kubelet ran their pods: the test API server has neither.
// It stops with ctx.
func standInKubelet(ctx context.Context, c client.Client, namespace string) {
	for ctx.Err() == nil {
		var jobs batchv1.JobList
		if err := c.List(ctx, &jobs, client.InNamespace(namespace)); err == nil {
			for i := range jobs.Items {
				j := &jobs.Items[i]
				if j.Status.CompletionTime != nil {
					continue
				}
				now := metav1.Now()
				j.Status = batchv1.JobStatus{
					StartTime: &now, CompletionTime: &now, Succeeded: 1,
					Conditions: []batchv1.JobCondition{
						{Type: batchv1.JobSuccessCriteriaMet, Status: corev1.ConditionTrue, LastProbeTime: now, LastTransitionTime: now},
						{Type: batchv1.JobComplete, Status: corev1.ConditionTrue, LastProbeTime: now, LastTransitionTime: now},
					},
				}
				_ = c.Status().Update(ctx, j)
			}
		}
		var ds appsv1.DeploymentList
		if err := c.List(ctx, &ds, client.InNamespace(namespace)); err == nil {
			for i := range ds.Items {
				d := &ds.Items[i]
				replicas := int32(1)
				if d.Spec.Replicas != nil {
					replicas = *d.Spec.Replicas
				}
				if d.Status.ObservedGeneration == d.Generation && d.Status.AvailableReplicas == replicas {
					continue
				}
				now := metav1.Now()
				d.Status = appsv1.DeploymentStatus{
					ObservedGeneration: d.Generation,
					Replicas:           replicas, UpdatedReplicas: replicas, ReadyReplicas: replicas, AvailableReplicas: replicas,
					Conditions: []appsv1.DeploymentCondition{
						{Type: appsv1.DeploymentAvailable, Status: corev1.ConditionTrue, Reason: "MinimumReplicasAvailable", LastUpdateTime: now, LastTransitionTime: now},
						{Type: appsv1.DeploymentProgressing, Status: corev1.ConditionTrue, Reason: "NewReplicaSetAvailable", LastUpdateTime: now, LastTransitionTime: now},
					},
				}
				_ = c.Status().Update(ctx, d)
			}
		}
		select {
		case <-ctx.Done():
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// seen turns a check that says what it saw into one for poll.Until.
func seen(check func() (ok bool, last string)) func() error {
	return func() error {
		if ok, last := check(); !ok {
			return errors.New("last: " + last)
		}
		return nil
	}
}
