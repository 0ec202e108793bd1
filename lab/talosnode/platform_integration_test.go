//go:build integration

package talosnode_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"cozy.dev/cozy/bootstrap/rack"
	"cozy.dev/cozy/images"
	"cozy.dev/cozy/internal/testing/clustertest"
	"cozy.dev/cozy/internal/testing/poll"
	"cozy.dev/cozy/internal/testing/prereq"
	"cozy.dev/cozy/internal/testing/testenv"
	"cozy.dev/cozy/platform/flux"
	"cozy.dev/cozy/platform/gitserver"
	"cozy.dev/cozy/platform/render"
	"cozy.dev/cozy/platform/status"
	"cozy.dev/cozy/platform/upstream"
)

const (
	gitAddr = clusterSubnet + ".1:3000" // the platform's Git server, beside the mirror
	lbFirst = clusterSubnet + ".200"    // the platform's load-balancer pool
)

// TestPlatformRunsOnNodes: the platform, as Flux deploys it, runs as pods
// on real nodes. Flux's controllers run as pods from images built here;
// they clone the rendered platform from a Git server on the cluster's
// network and install MetalLB from the registry mirror (its chart made
// from its Go module, its images built from it); MetalLB's controller
// gives a LoadBalancer Service an address of the rack's pool, and its
// speaker answers ARP for it on the nodes' LAN, where a client reaches a
// pod through it. The components nothing here can build images for are
// switched off, and networking with them: the cluster keeps Talos's
// flannel.
func TestPlatformRunsOnNodes(t *testing.T) {
	platformImages := testenv.BuiltDir(t, "COZY_PLATFORM_IMAGES", "hack/platform-images.sh", "index.json")
	if _, err := exec.LookPath("git"); err != nil {
		prereq.Missing(t, "git is not installed (Debian git; hack/install-deps.sh)")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 25*time.Minute)
	defer cancel()
	c := startCluster(t, ctx, "controlplane", "worker")

	// The mirror gets the platform's images and MetalLB's chart, as
	// `cozyctl images mirror` pushes them.
	chart, err := upstream.Find("metallb", "0.15.2")
	if err != nil {
		t.Fatal(err)
	}
	proxy, err := testenv.ModuleProxy(ctx, chart.Module)
	if err != nil {
		t.Fatal(err)
	}
	made, err := upstream.Maker{Source: upstream.Source{Proxies: []string{proxy}, Cache: t.TempDir()}}.Make(ctx, "metallb", "0.15.2")
	if err != nil {
		t.Fatal(err)
	}
	chartImage, err := images.ChartImage(made.Chart.Metadata, made.Archive)
	if err != nil {
		t.Fatal(err)
	}
	mirrorLayout(t, ctx, c.sw, mirrorAddr, platformImages, []images.MirrorChart{{Name: "metallb", Version: "0.15.2", Image: chartImage}})

	// The platform for this rack: charts from the mirror, the pool on the
	// nodes' LAN, MetalLB and its pool on, the rest off.
	r := *c.rack
	r.Platform.Mirror = "http://" + mirrorAddr + "/charts"
	r.Platform.LoadBalancerPool = []string{lbFirst + "-" + clusterSubnet + ".209"}
	r.Platform.Components = map[string]rack.Component{}
	off := false
	for _, name := range []string{"networking", "cert-manager", "linstor", "kubevirt", "cdi", "snapshot-controller", "kamaji", "cluster-api",
		"cluster-api-providers", "cozy-operator", "tenant-addons"} {
		r.Platform.Components[name] = rack.Component{Enabled: &off}
	}
	layout, err := render.Render(&r)
	if err != nil {
		t.Fatal(err)
	}
	tree := t.TempDir()
	if err := layout.Write(tree); err != nil {
		t.Fatal(err)
	}
	repos := t.TempDir()
	if _, err := gitserver.Publish(ctx, repos, "platform", "main", tree, "cozyctl platform render"); err != nil {
		t.Fatal(err)
	}
	serveGit(t, c, repos)

	// Flux, from manifests made from its controllers' modules (the
	// release's install.yaml cannot be downloaded here), pointed at the
	// repository; its pods pull the images the mirror holds.
	manifests := filepath.Join(t.TempDir(), "install.yaml")
	if err := testenv.FluxInstallManifests(ctx, manifests); err != nil {
		t.Fatal(err)
	}
	objs, err := flux.Load(ctx, manifests)
	if err != nil {
		t.Fatal(err)
	}
	cl := clusterClient(t, c)
	git := flux.Git{URL: "http://" + gitAddr + "/platform.git", Branch: "main", Path: layout.ClusterDir, Interval: 10 * time.Second}
	if err := flux.Install(ctx, cl, flux.Options{Manifests: objs, Git: git, ClusterDomain: c.domain, Poll: time.Second, Progress: func(m string) { t.Log(m) }}); err != nil {
		t.Fatalf("install Flux: %v", err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			for _, args := range [][]string{{"-n", "flux-system", "logs", "deploy/source-controller", "--tail=30"},
				{"-n", "flux-system", "logs", "deploy/helm-controller", "--tail=30"},
				{"-n", "flux-system", "get", "kustomizations,helmrepositories,helmreleases,gitrepositories", "-A"}} {
				out, err := c.kubectl(args...)
				t.Logf("kubectl %s:\n%s%v", strings.Join(args, " "), out, err)
			}
		}
	})

	// Every component on becomes Ready, and the rest show as off.
	start := time.Now()
	var rep *status.Report
	poll.Until(t, ctx, 2*time.Second, "the platform to be Ready", func() error {
		rep, err = status.Collect(ctx, cl, flux.Namespace)
		if err != nil {
			return err
		}
		if !rep.Ready {
			var waiting []string
			for _, comp := range rep.Components {
				if !comp.Ready && !comp.Off {
					waiting = append(waiting, comp.Name+": "+comp.Message)
				}
			}
			return errors.New(strings.Join(waiting, "; "))
		}
		return nil
	})
	t.Logf("the platform was Ready %s after Flux's install", time.Since(start).Round(time.Second))
	for _, name := range []string{"metallb", "metallb-pool"} {
		if comp := component(rep, name); comp == nil || !comp.Ready || comp.Off {
			t.Errorf("%s: %+v, want it on and Ready", name, comp)
		}
	}
	if comp := component(rep, "networking"); comp == nil || !comp.Off {
		t.Errorf("networking: %+v, want it off", comp)
	}
	// Flux and MetalLB ran from the mirror's images, on the nodes.
	out, err := c.kubectl("get", "pods", "-A", "-o", `jsonpath={range .items[*]}{.metadata.namespace} {.spec.nodeName} {.status.phase} {range .spec.containers[*]}{.image} {end}{"\n"}{end}`)
	if err != nil {
		t.Fatal(err)
	}
	for _, image := range []string{"ghcr.io/fluxcd/source-controller:", "ghcr.io/fluxcd/kustomize-controller:", "ghcr.io/fluxcd/helm-controller:",
		"quay.io/metallb/controller:v0.15.2", "quay.io/metallb/speaker:v0.15.2"} {
		if !strings.Contains(out, image) {
			t.Errorf("no pod runs %s:\n%s", image, out)
		}
	}
	t.Logf("pods:\n%s", out)

	// A LoadBalancer Service in front of the probe pods: MetalLB gives it
	// the pool's first address, and a client on the nodes' LAN reaches a
	// probe through it. The client's ARP request for the address gets
	// one node's MAC: the speaker's answer (nothing else holds it).
	clustertest.RunProbes(t, c.kubectl, []string{"cp1", "w1"}, 5*time.Minute)
	svc := filepath.Join(t.TempDir(), "svc.yaml")
	if err := os.WriteFile(svc, []byte(`apiVersion: v1
kind: Service
metadata: {name: probe-lb, namespace: default}
spec:
  type: LoadBalancer
  selector: {app: probe}
  ports: [{port: 80, targetPort: 8080}]
`), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := c.kubectl("apply", "-f", svc); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	var ip string
	poll.Within(t, 2*time.Minute, time.Second, "the Service's load-balancer address", func() error {
		ip, err = c.kubectl("get", "service", "probe-lb", "-o", "jsonpath={.status.loadBalancer.ingress[0].ip}")
		if err == nil && ip == "" {
			err = errors.New("no address yet")
		}
		return err
	})
	if ip != lbFirst {
		t.Errorf("the Service got %s, want %s, the pool's first address", ip, lbFirst)
	}
	var body string
	poll.Within(t, 2*time.Minute, time.Second, "a probe through "+ip, func() error {
		body, err = httpGet(ctx, c, "http://"+net.JoinHostPort(ip, "80")+"/")
		return err
	})
	if !strings.HasPrefix(body, "probe on ") {
		t.Errorf("through %s: %q, want a probe's page", ip, body)
	}
	neigh, err := c.sw.Command(ctx, "ip", "neigh", "show", ip, "dev", "br0").CombinedOutput()
	if err != nil {
		t.Fatalf("ip neigh: %v: %s", err, neigh)
	}
	var by string
	for _, n := range c.nodes {
		if strings.Contains(string(neigh), "lladdr "+n.mac+" ") {
			by = n.name
		}
	}
	if by == "" {
		t.Errorf("the LAN's neighbour entry for %s is %q: no node's MAC answered its ARP", ip, neigh)
	}
	t.Logf("%s answered by %s (%s): %q", ip, by, strings.TrimSpace(string(neigh)), body)
}

// serveGit serves the repositories under root to the cluster, on the
// bridge's address beside the mirror.
func serveGit(t *testing.T, c *procCluster, root string) {
	t.Helper()
	var ln net.Listener
	if err := c.sw.Do(func() (err error) {
		ln, err = net.Listen("tcp", gitAddr)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- gitserver.Serve(ctx, ln, root) }()
	t.Cleanup(func() {
		stop()
		if err := <-done; err != nil {
			t.Errorf("git server: %v", err)
		}
	})
}

// restConfig reaches the cluster's API through its first control plane's
// address on host loopback, as its admin.
func restConfig(t *testing.T, c *procCluster) *rest.Config {
	t.Helper()
	rc, err := clientcmd.BuildConfigFromFlags("https://"+c.nodes[0].kubeAPI, c.kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	return rc
}

// clusterClient is a client of the cluster's API (restConfig).
func clusterClient(t *testing.T, c *procCluster) client.Client {
	t.Helper()
	cl, err := client.New(restConfig(t, c), client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	return cl
}

// httpGet fetches url from the bridge's namespace: a client on the nodes' LAN.
func httpGet(ctx context.Context, c *procCluster, url string) (string, error) {
	hc := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DialContext: c.sw.DialContext}}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return "", err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("%s: %s", url, resp.Status)
	}
	return string(b), err
}

func component(rep *status.Report, name string) *status.Component {
	for i := range rep.Components {
		if rep.Components[i].Name == name {
			return &rep.Components[i]
		}
	}
	return nil
}
