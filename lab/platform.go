package lab

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"cozy.dev/cozy/bootstrap/rack"
	"cozy.dev/cozy/images"
	"cozy.dev/cozy/internal/netns"
	"cozy.dev/cozy/platform/flux"
	"cozy.dev/cozy/platform/gitserver"
	"cozy.dev/cozy/platform/render"
	"cozy.dev/cozy/platform/status"
)

// GitPort is where `cozyctl platform serve-git` serves the lab's platform
// repository, on ServerIP beside the registry (the netboot server has 8080).
const GitPort = 3000

// PlatformComponents are the components a lab with --platform runs: those
// whose images Cozy builds (hack/platform-images.sh). The others are
// switched off, networking with them: flannel stays the lab's network.
var PlatformComponents = []string{"metallb", "metallb-pool"}

// Load-balancer addresses of a lab with --platform: on the bridge, past
// the DHCP range.
const (
	PoolFrom = "192.168.77.200"
	PoolTo   = "192.168.77.219"
)

// FluxTimeout is how long each component of a lab's platform has to
// become Ready (the rack's platform.values.flux.timeout): the third
// --platform try saw helm-controller give up MetalLB's install after its
// 10 minutes, with pulls and container starts under TCG taking minutes.
// lab up waits for the platform at least as long.
const FluxTimeout = 40 * time.Minute

// gitURL is the lab's platform repository, as Flux clones it.
func gitURL() string {
	return "http://" + net.JoinHostPort(ServerIP.String(), strconv.Itoa(GitPort)) + "/platform.git"
}

// platformSection is the rack's platform section for a lab with
// --platform.
func (c *Config) platformSection() string {
	var b strings.Builder
	fmt.Fprintf(&b, `platform:                        # --platform: Flux installs what Cozy builds images for
  git:
    url: %s   # cozyctl platform serve-git on the lab's bridge
  mirror: %s/charts   # the charts Cozy makes, in the lab's registry
  loadBalancerPool: [%s-%s]
  values:
    flux:
      timeout: %s                 # each chart's own 5 to 10 minutes are too short under TCG
      progressDeadlineSeconds: %d # else Helm's wait fails a Deployment 10 minutes in
  components:                      # the rest has no image built here yet (docs/images.md)
`, gitURL(), RegistryURL(), PoolFrom, PoolTo, strings.TrimSuffix(FluxTimeout.String(), "0s"), int(FluxTimeout.Seconds()))
	// Without KVM MetalLB's controller takes minutes before it serves the
	// port its probes ask (measured: killed by its liveness probe, 10 s +
	// 3 x 10 s, again and again; then, with 300 s, still unserved 5 and a
	// half minutes after its container started); the lab gives it and the
	// speaker 15 minutes and six misses, as it gives Talos's control plane
	// longer leases.
	b.WriteString(`    metallb:
      values:
        metallb:                     # its HelmRelease
          controller:
            livenessProbe: {initialDelaySeconds: 900, timeoutSeconds: 10, failureThreshold: 6}
            readinessProbe: {timeoutSeconds: 10}   # its webhook's endpoints
          speaker:
            livenessProbe: {initialDelaySeconds: 900, timeoutSeconds: 10, failureThreshold: 6}
            readinessProbe: {timeoutSeconds: 10}
`)
	if c.Nodes == c.ControlPlanes {
		// No workers: the control planes announce the pool. Talos labels
		// them node.kubernetes.io/exclude-from-external-load-balancers,
		// which MetalLB's speaker honours unless told otherwise (the
		// first one-VM try got its address but no ARP answer).
		b.WriteString(`            ignoreExcludeLB: true    # no workers: the control planes announce
`)
	} else {
		// The workers announce the pool; the control-plane VMs, which the
		// API server and etcd keep busy enough, run no speaker. (Not
		// tolerateMaster: the lab's control planes take pods, untainted.)
		b.WriteString(`            affinity:                # spare the control-plane VMs
              nodeAffinity:
                requiredDuringSchedulingIgnoredDuringExecution:
                  nodeSelectorTerms:
                    - matchExpressions:
                        - {key: node-role.kubernetes.io/control-plane, operator: DoesNotExist}
`)
	}
	names, err := render.Components()
	if err != nil {
		panic(err) // the embedded chart: a broken build, not input
	}
	for _, name := range names {
		if !slices.Contains(PlatformComponents, name) {
			fmt.Fprintf(&b, "    %s: {enabled: false}\n", name)
		}
	}
	return b.String()
}

// fluxPatch gives Flux's controllers, as the lab installs them, five
// minutes before their liveness probes count: without KVM they took more
// than the 30 s the release allows to serve them, and were killed again
// and again (measured on 2 cores). Later, answering in more than the 1 s
// their probes allow, they were killed again, and source-controller left
// unready, without endpoints for helm-controller to fetch charts from
// (the fifth try in docs/lab.md): their probes get 10 s and six misses.
// Their leader election gets the long leases the lab gives Talos's
// control plane (slowControlPlanePatch): with the 35 s default, the
// controllers lost their leases about 19 minutes into a --platform run
// and exited halfway through installing a chart.
const fluxPatch = `apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources: [install.yaml]
patches:
  - target: {kind: Deployment, namespace: flux-system}
    patch: |
      - op: add
        path: /spec/template/spec/containers/0/livenessProbe/initialDelaySeconds
        value: 300
      - op: add
        path: /spec/template/spec/containers/0/livenessProbe/timeoutSeconds
        value: 10
      - op: add
        path: /spec/template/spec/containers/0/livenessProbe/failureThreshold
        value: 6
      - op: add
        path: /spec/template/spec/containers/0/readinessProbe/timeoutSeconds
        value: 10
      - op: add
        path: /spec/template/spec/containers/0/args/-
        value: --leader-election-lease-duration=120s
      - op: add
        path: /spec/template/spec/containers/0/args/-
        value: --leader-election-renew-deadline=90s
      - op: add
        path: /spec/template/spec/containers/0/args/-
        value: --leader-election-retry-period=20s
`

// fluxManifests writes the folder the lab's bootstrap installs Flux from
// (--flux-manifests): the install manifests at src, kustomized with
// fluxPatch.
func (c *Config) fluxManifests(src string) (string, error) {
	data, err := os.ReadFile(src)
	if err != nil {
		return "", err
	}
	dir := filepath.Join(c.Dir, "flux")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	if err := os.WriteFile(filepath.Join(dir, "install.yaml"), data, 0o644); err != nil {
		return "", err
	}
	return dir, os.WriteFile(filepath.Join(dir, "kustomization.yaml"), []byte(fluxPatch), 0o644)
}

// preparePlatform fills the lab's registry with the platform's images and
// charts, publishes the platform rendered for the lab's rack as a commit
// of the lab's repository, and serves it on the bridge.
func (c *Config) preparePlatform(ctx context.Context, o UpOptions) error {
	if o.PlatformImages == nil || o.Charts == nil {
		return errors.New("--platform needs the platform's images (hack/platform-images.sh) and a chart maker")
	}
	layout, err := o.PlatformImages(ctx)
	if err != nil {
		return err
	}
	if err := c.mirrorImages(ctx, o.Cozyctl, layout, o.Stderr); err != nil {
		return err
	}
	r, err := rack.Parse(c.Rack(), filepath.Join(c.Dir, RackFile), c.Dir)
	if err != nil {
		return fmt.Errorf("the lab's rack: %w", err)
	}
	list, err := images.ForRack(ctx, r, o.Charts)
	if err != nil {
		return err
	}
	charts, err := list.MirrorCharts()
	if err != nil {
		return err
	}
	if _, err := images.Mirror(ctx, images.MirrorOptions{
		Registry: net.JoinHostPort(ServerIP.String(), strconv.Itoa(RegistryPort)), Insecure: true,
		Source: &images.Upstream{}, Charts: charts,
		Transport: &http.Transport{DialContext: netns.Dialer(Namespace(c.Name))},
	}); err != nil {
		return fmt.Errorf("mirror the platform's charts: %w", err)
	}

	layoutDir, err := os.MkdirTemp("", "lab-platform-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(layoutDir)
	l, err := render.Render(r)
	if err != nil {
		return err
	}
	if err := l.Write(layoutDir); err != nil {
		return err
	}
	repos := filepath.Join(c.Dir, "git")
	commit, err := gitserver.Publish(ctx, repos, "platform", r.Platform.Git.Branch, layoutDir, "cozyctl lab up: the platform rendered for rack "+c.Name)
	if err != nil {
		return err
	}
	o.Log.Info("lab: platform repository", "commit", commit, "url", gitURL())
	return c.startGitServer(ctx, o.Cozyctl, repos)
}

// startGitServer runs `cozyctl platform serve-git` in the lab's namespace
// and waits until it serves the repository.
func (c *Config) startGitServer(ctx context.Context, cozyctl, repos string) error {
	addr := net.JoinHostPort(ServerIP.String(), strconv.Itoa(GitPort))
	hc := &http.Client{Transport: &http.Transport{DialContext: netns.Dialer(Namespace(c.Name))}, Timeout: 2 * time.Second}
	ready := func(context.Context) error {
		resp, err := hc.Get(gitURL() + "/info/refs?service=git-upload-pack")
		if err != nil {
			return err
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("%s answered %s", gitURL(), resp.Status)
		}
		return nil
	}
	return c.startDaemon(ctx, "the Git server on "+addr, cozyctl, "git.log", 0o644, ready,
		"platform", "serve-git", "--listen", addr, "--dir", repos)
}

// waitPlatform polls the platform's status, from inside the lab's
// namespace, until every component on is Ready.
func (c *Config) waitPlatform(ctx context.Context, kubeconfig string, timeout time.Duration) error {
	rc, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return err
	}
	rc.Dial = netns.Dialer(Namespace(c.Name))
	rc.Timeout = 15 * time.Second
	cl, err := client.New(rc, client.Options{})
	if err != nil {
		return err
	}
	if timeout <= 0 {
		timeout = 20 * time.Minute
	}
	deadline := time.Now().Add(timeout)
	for {
		rep, err := status.Collect(ctx, cl, flux.Namespace)
		why := fmt.Sprint(err)
		if err == nil {
			if rep.Ready {
				return nil
			}
			var waiting []string
			for _, comp := range rep.Components {
				if !comp.Ready && !comp.Off {
					waiting = append(waiting, comp.Name+": "+comp.Message)
				}
			}
			why = strings.Join(waiting, "; ")
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("after %s the platform is not Ready: %s (cozyctl lab kubectl --name %s -- get kustomizations,helmreleases -A)", timeout, why, c.Name)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(5 * time.Second):
		}
	}
}
