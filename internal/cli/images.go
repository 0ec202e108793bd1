package cli

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/spf13/cobra"

	"cozy.dev/cozy/bootstrap/rack"
	"cozy.dev/cozy/images"
	"cozy.dev/cozy/internal/cachedir"
	"cozy.dev/cozy/internal/output"
	"cozy.dev/cozy/platform/upstream"
)

func newImagesCommand(g *Globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "images",
		Short: "List the container images a rack needs and copy them into a registry",
		Long: `List the container images a rack needs and copy them into one registry, the
rack's registries.mirror, for racks that cannot reach the upstream registries
(and for the lab). In the registry every image keeps its upstream name under
its upstream host: registry.k8s.io/pause:3.10.1 is
REGISTRY/registry.k8s.io/pause:3.10.1 (docs/images.md).`,
	}
	cmd.AddCommand(newImagesListCommand(g), newImagesMirrorCommand(g))
	return cmd
}

const notListedHelp = `The upstream charts Cozy can make from the Go modules their projects
publish (Cilium, Kube-OVN, cert-manager, MetalLB, the Cluster API operator;
docs/images.md) are fetched from the module proxy (--module-proxy, cached in
$COZY_CACHE_DIR/modules, each module checked against the hash Cozy pins),
made and rendered with the platform's values, and their images listed.

Not listed yet: images that only other upstream content names: the charts
no module carries (Kamaji, Piraeus/LINSTOR), the KubeVirt and CDI release
manifests, the providers the Cluster API operator downloads, the tenants'
metrics-server chart, Flux's own release manifest, and any chart whose
module could not be fetched. Each is named in a warning on stderr.

A tenant's control plane runs at the tenant's Kubernetes version, which the
rack does not say: name the versions your tenants will run with
--tenant-version, and kube-apiserver, kube-controller-manager and
kube-scheduler of each are listed ("tenant control planes VERSION: ...").
Their workers' disk image is Cozy's own, not pulled from upstream: build it
with hack/worker-image.sh VERSION and push it with 'images mirror --from'
(a warning names it for each version).`

// tenantVersionHelp is the --tenant-version flag's help.
const tenantVersionHelp = "Kubernetes versions the rack's tenants will run (repeat, or comma-separated): list their control-plane images too"

// moduleProxyHelp is the --module-proxy flag's help.
const moduleProxyHelp = "Go module proxy the upstream charts' modules come from (default: $GOPROXY, else " + upstream.DefaultProxy + "); off: make no chart, list them as not listed"

// chartMaker makes upstream charts from the module proxy (flag
// --module-proxy), or none with "off".
func chartMaker(proxy string) images.ChartMaker {
	if proxy == "off" {
		return nil
	}
	if proxy == "" {
		proxy = os.Getenv("GOPROXY")
	}
	return upstream.Maker{Source: upstream.Source{
		Proxies: upstream.Proxies(proxy),
		Cache:   filepath.Join(cachedir.Dir(), "modules"),
	}}
}

// loadRackOrExample loads --rack, or without it the example rack of
// `cozyctl rack init`, saying so on stderr.
func loadRackOrExample(g *Globals, file string) (*rack.Rack, error) {
	if file != "" {
		return rack.Load(file)
	}
	data, err := rack.Example("lab")
	if err != nil {
		return nil, err
	}
	r, err := rack.Parse(data, "example rack", ".")
	if err != nil {
		return nil, err
	}
	g.Logger().Warn("no --rack: using the example rack of `cozyctl rack init`", "talos", r.Talos.Version, "kubernetes", r.Cluster.KubernetesVersion)
	return r, nil
}

func newImagesListCommand(g *Globals) *cobra.Command {
	var rackFile, moduleProxy string
	var tenantVersions []string
	cmd := &cobra.Command{
		Use:   "list",
		Short: "Print every image the rack needs, one reference per line",
		Long: `Print every container image the rack needs, read from what Cozy renders for
it, never from a hand-kept list:

  - what Talos runs, from the rack's machine configs (generated in memory,
    with throwaway secrets; nothing is written): kubelet, the pod sandbox
    (pause), the installer, and on control planes etcd, kube-apiserver,
    kube-controller-manager, kube-scheduler, CoreDNS and kube-proxy unless
    disabled, Flannel only when it is the CNI;
  - cozy-operator, from its chart as the platform installs it;
  - the add-ons cozy-operator runs for each tenant, at the images it
    defaults to (cluster-autoscaler, KubeVirt CCM, the KubeVirt CSI driver
    and its sidecars, the CSI node chart's images);
  - images the platform chart sets itself;
  - the images of the upstream charts Cozy can make (below).

References are canonical (registry host always given, docker.io/library/
spelt out), sorted, each once. The table is one reference per line, for
scripts; -o json is a list of {image, neededBy}: each image with what
needs it ("talos: kubelet", "cozy-operator", "tenant add-on: ...").

Without --rack the example rack of 'cozyctl rack init' is used (a warning
says so): its Talos and Kubernetes versions are the defaults.

` + notListedHelp,
		Example: `  cozyctl images list --rack rack.yaml
  cozyctl images list --rack rack.yaml -o json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			r, err := loadRackOrExample(g, rackFile)
			if err != nil {
				return err
			}
			l, err := images.ForRack(cmd.Context(), r, chartMaker(moduleProxy), tenantVersions...)
			if err != nil {
				return err
			}
			for _, n := range l.NotListed {
				g.Logger().Warn("images not listed", "source", n)
			}
			if g.Output == output.Table {
				_, err := fmt.Fprintln(g.stdout, strings.Join(l.Refs(), "\n"))
				return err
			}
			return g.Print(l.Images)
		},
	}
	cmd.Flags().StringVar(&rackFile, "rack", "", "the rack file (default: the example rack of `cozyctl rack init`)")
	cmd.Flags().StringVar(&moduleProxy, "module-proxy", "", moduleProxyHelp)
	cmd.Flags().StringSliceVar(&tenantVersions, "tenant-version", nil, tenantVersionHelp)
	_ = cmd.MarkFlagFilename("rack", "yaml", "yml")
	return cmd
}

// mirrorTable is what `images mirror` prints.
type mirrorTable []images.Result

func (t mirrorTable) Header() []string {
	return []string{"IMAGE OR CHART", "IN THE REGISTRY", "STATUS"}
}

func (t mirrorTable) Rows() [][]string {
	rows := make([][]string, len(t))
	for i, r := range t {
		rows[i] = []string{r.What(), dash(r.Target), r.Status}
	}
	return rows
}

var _ output.Tabular = mirrorTable{}

// mirrorPlan is what `images mirror` copies, and from where.
type mirrorPlan struct {
	src images.Source
	// from is the layout or archive of --from, to close once copied.
	from   *images.Layout
	refs   []string
	charts []images.MirrorChart
	// chartPath is the rack's platform.mirror path ("" without one).
	chartPath, chartHost string
}

// planMirror says what `images mirror` copies: with a layout or an
// archive (from) and no rack, all of it; else the images the rack (or the
// example rack) needs, from the layout or the upstream registries, and
// the upstream charts Cozy makes for its platform. Close the plan.
func planMirror(ctx context.Context, g *Globals, from, rackFile string, maker images.ChartMaker, tenantVersions []string) (*mirrorPlan, error) {
	p := &mirrorPlan{src: &images.Upstream{}}
	if from != "" {
		l, err := images.Open(from)
		if err != nil {
			return nil, err
		}
		if rackFile == "" {
			// A bundle without a rack: all of it.
			return &mirrorPlan{src: l, from: l, refs: l.Refs()}, nil
		}
		p.src, p.from = l, l
	}
	if err := p.forRack(ctx, g, rackFile, maker, tenantVersions); err != nil {
		p.close()
		return nil, err
	}
	return p, nil
}

// close removes what an archive was unpacked into.
func (p *mirrorPlan) close() {
	if p.from != nil {
		_ = p.from.Close()
	}
}

// forRack fills p with what the rack needs.
func (p *mirrorPlan) forRack(ctx context.Context, g *Globals, rackFile string, maker images.ChartMaker, tenantVersions []string) error {
	r, err := loadRackOrExample(g, rackFile)
	if err != nil {
		return err
	}
	l, err := images.ForRack(ctx, r, maker, tenantVersions...)
	if err != nil {
		return err
	}
	for _, n := range l.NotListed {
		g.Logger().Warn("images not listed, so not mirrored", "source", n)
	}
	p.refs = l.Refs()
	if r.Platform.Mirror != "" {
		m, err := rack.ParseChartMirror(r.Platform.Mirror)
		if err != nil {
			return err
		}
		p.chartPath, p.chartHost = m.Path, m.Host
	}
	p.charts, err = l.MirrorCharts()
	return err
}

// mirrorProgress logs each image's progress.
func mirrorProgress(log *slog.Logger) func(images.Result) {
	return func(r images.Result) {
		switch r.Status {
		case images.StatusCopying:
			log.Info("copying", "image", r.What(), "to", r.Target)
		case images.StatusCopied:
			log.Info("copied", "image", r.What(), "digest", r.Digest)
		case images.StatusPresent:
			log.Info("already in the registry", "image", r.What(), "digest", r.Digest)
		case images.StatusFailed:
			log.Error("failed", "image", r.What(), "error", r.Error)
		}
	}
}

func newImagesMirrorCommand(g *Globals) *cobra.Command {
	var (
		rackFile, to, from string
		moduleProxy        string
		tenantVersions     []string
		fromUpstream       bool
		insecure           bool
	)
	cmd := &cobra.Command{
		Use:   "mirror --to REGISTRY (--from PATH | --from-upstream)",
		Short: "Copy every image the rack needs into a registry",
		Long: `Copy every image 'cozyctl images list' gives for the rack into REGISTRY
(HOST[:PORT]), each under its upstream host:

  registry.k8s.io/pause:3.10.1  ->  REGISTRY/registry.k8s.io/pause:3.10.1
  docker.io/library/alpine:3    ->  REGISTRY/docker.io/library/alpine:3

which is what the rack's registries.mirror (http(s)://REGISTRY) makes every
node pull from. The images come from an OCI image layout directory or an
OCI archive, a layout in a tar file (--from: index.json names each image by
its full upstream reference in the org.opencontainers.image.ref.name or
io.containerd.image.name annotation), or from their upstream registries
(--from-upstream, over HTTPS). With --from and no --rack, every image of
the layout is copied (a bundle such as the lab's, from hack/lab-images.sh,
or cozy-operator's image, bin/cozy-operator-image.tar from make image);
--from-upstream without --rack copies what the example rack of 'cozyctl
rack init' lists.

An image the registry already has (same manifest digest under that name)
is skipped, and so are layers it has: a second run copies only what is
missing and says so. Every image is tried; a missing image or a refused
push fails the command at the end, naming each image and the registry's
answer. Progress goes to stderr, the result table to stdout.

With a rack (or the example rack), the upstream charts Cozy makes for its
platform (see 'images list') are pushed too, as Helm's OCI artifacts, to
REGISTRY/PATH/CHART:VERSION, PATH being the path of the rack's
platform.mirror (charts without one), where Flux reads them.

The registry is reached over HTTPS; --insecure allows plain HTTP (the lab's
registry, 'cozyctl registry serve').`,
		Example: `  cozyctl images mirror --rack rack.yaml --from ./images --to 10.0.0.1:5000 --insecure
  cozyctl images mirror --from bin/cozy-operator-image.tar --to 10.0.0.1:5000 --insecure
  cozyctl images mirror --rack rack.yaml --from-upstream --to registry.example.com`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			switch {
			case (from == "") == !fromUpstream:
				return errors.New("give one source: --from PATH (an OCI image layout or archive) or --from-upstream")
			case strings.Contains(to, "://"):
				return fmt.Errorf("--to %q: give the registry as HOST[:PORT]; plain HTTP is --insecure", to)
			}
			p, err := planMirror(cmd.Context(), g, from, rackFile, chartMaker(moduleProxy), tenantVersions)
			if err != nil {
				return err
			}
			defer p.close()
			log := g.Logger()
			if p.chartHost != "" && p.chartHost != to {
				log.Warn("the rack's platform.mirror names another registry: Flux will look for the charts there", "platform.mirror", p.chartHost, "to", to)
			}
			log.Info("mirroring", "images", len(p.refs), "charts", len(p.charts), "from", p.src.String(), "to", to)
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			results, err := images.Mirror(ctx, images.MirrorOptions{
				Registry:  to,
				Insecure:  insecure,
				Source:    p.src,
				Refs:      p.refs,
				Charts:    p.charts,
				ChartPath: p.chartPath,
				Progress:  mirrorProgress(log),
			})
			counts := map[string]int{}
			for _, r := range results {
				counts[r.Status]++
			}
			log.Info("mirror done", "copied", counts[images.StatusCopied], "alreadyThere", counts[images.StatusPresent], "failed", counts[images.StatusFailed], "registry", to)
			if perr := g.Print(mirrorTable(results)); perr != nil {
				return perr
			}
			return err
		},
	}
	f := cmd.Flags()
	f.StringVar(&to, "to", "", "the registry to copy into, HOST[:PORT] (required)")
	f.StringVar(&from, "from", "", "an OCI image layout directory, or an OCI archive (a layout in a tar file), holding the images")
	f.BoolVar(&fromUpstream, "from-upstream", false, "pull the images from their upstream registries")
	f.StringVar(&rackFile, "rack", "", "copy only the images this rack needs (default: with --from, every image of the layout; with --from-upstream, the example rack's)")
	f.BoolVar(&insecure, "insecure", false, "allow plain HTTP to the registry")
	f.StringVar(&moduleProxy, "module-proxy", "", moduleProxyHelp)
	f.StringSliceVar(&tenantVersions, "tenant-version", nil, tenantVersionHelp)
	_ = cmd.MarkFlagRequired("to")
	_ = cmd.MarkFlagFilename("rack", "yaml", "yml")
	return cmd
}
