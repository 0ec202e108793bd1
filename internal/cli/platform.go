package cli

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"cozy.dev/cozy/bootstrap/rack"
	"cozy.dev/cozy/internal/output"
	"cozy.dev/cozy/platform"
	"cozy.dev/cozy/platform/flux"
	"cozy.dev/cozy/platform/gitserver"
	"cozy.dev/cozy/platform/render"
	"cozy.dev/cozy/platform/status"
)

func newPlatformCommand(g *Globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "platform",
		Short: "Render, install and follow the Flux-reconciled platform layer",
	}
	cmd.AddCommand(newPlatformRenderCommand(g), newPlatformInstallCommand(g), newPlatformStatusCommand(g), newPlatformServeGitCommand(g))
	return cmd
}

// renderTable lists the files `platform render` wrote.
type renderTable struct {
	Dir   string   `json:"dir"`
	Files []string `json:"files"`
}

func (t renderTable) Header() []string { return []string{"FILE"} }

func (t renderTable) Rows() [][]string {
	rows := make([][]string, 0, len(t.Files))
	for _, f := range t.Files {
		rows = append(rows, []string{f})
	}
	return rows
}

var _ output.Tabular = renderTable{}

func newPlatformRenderCommand(g *Globals) *cobra.Command {
	var rackFile, out, moduleProxy string
	var check bool
	cmd := &cobra.Command{
		Use:   "render",
		Short: "Write the Git layout Flux reconciles for the rack's cluster",
		Long: `Render the platform for the rack's cluster into OUT: the Flux objects of
every component in OUT/<platform.git.path> (clusters/<name> by default),
with the values derived from the rack in its values.yaml, and Cozy's own
charts the layout installs in OUT/charts/. Commit OUT to the repository
Flux reads. The output depends only on the rack and this cozyctl: render
again after changing the rack, and review the diff.

With --check nothing is written: the command fails if OUT does not hold
exactly what it would write.

Values the rack gives a component's HelmRelease
(platform.components.<name>.values) are checked first against the
upstream chart, made from its Go module at the pinned version (fetched
from --module-proxy, cached in $COZY_CACHE_DIR/modules): a value its
schema refuses, a key it does not define, or a render error fails the
command before anything is written. With --module-proxy off they are not
checked, and a warning says so.`,
		Example: `  cozyctl platform render --rack rack.yaml --out ~/src/platform-repo
  cozyctl platform render --rack rack.yaml --out . --check`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			r, err := rack.Load(rackFile)
			if err != nil {
				return err
			}
			layout, err := render.Render(r)
			if err != nil {
				return fmt.Errorf("render the platform for %s: %w", rackFile, err)
			}
			if releases := layout.Overridden; len(releases) > 0 {
				maker := chartMaker(moduleProxy)
				if maker == nil {
					g.Logger().Warn("the rack's component values are not checked against their charts (--module-proxy off)", "releases", releases)
				} else if _, err := render.CheckCharts(cmd.Context(), layout, maker, r.Cluster.KubernetesVersion, releases); err != nil {
					return fmt.Errorf("render the platform for %s: %w", rackFile, err)
				}
			}
			if check {
				diff, err := layout.Diff(out)
				if err != nil {
					return err
				}
				if len(diff) > 0 {
					for _, d := range diff {
						fmt.Fprintln(g.stderr, d)
					}
					return fmt.Errorf("%s is not what the rack renders (%d file(s)); run cozyctl platform render without --check", out, len(diff))
				}
				g.Logger().Info("layout is up to date", "dir", out)
				return nil
			}
			if fi, err := os.Stat(out); err == nil && !fi.IsDir() {
				return fmt.Errorf("--out %s is a file, not a folder", out)
			} else if err != nil && !errors.Is(err, os.ErrNotExist) {
				return err
			}
			if err := layout.Write(out); err != nil {
				return err
			}
			return g.Print(renderTable{Dir: out, Files: layout.Paths()})
		},
	}
	cmd.Flags().StringVar(&rackFile, "rack", "", "the rack file")
	cmd.Flags().StringVar(&out, "out", "", "root of the Git repository to write into")
	cmd.Flags().BoolVar(&check, "check", false, "write nothing; fail if --out differs from the rendering")
	cmd.Flags().StringVar(&moduleProxy, "module-proxy", "", moduleProxyHelp)
	_ = cmd.MarkFlagRequired("rack")
	_ = cmd.MarkFlagRequired("out")
	_ = cmd.MarkFlagFilename("rack", "yaml", "yml")
	_ = cmd.MarkFlagDirname("out")
	return cmd
}

func newPlatformInstallCommand(g *Globals) *cobra.Command {
	var p platform.InstallOptions
	var rackFile string
	cmd := &cobra.Command{
		Use:   "install",
		Short: "Install Flux and point it at the cluster's folder in the platform repository",
		Long: `Install Flux the way ` + "`flux install`" + ` does, from its release manifests
(or a local copy with --flux-manifests), then a GitRepository and a root
Kustomization flux-system/flux-system for the cluster's folder, the layout
` + "`cozyctl platform render`" + ` writes. Everything is server-side applied, so
running it again updates in place (a new Flux, another branch).

It waits (--wait) until Flux has fetched the repository and applied the
folder; the components themselves install in the background, in
dependency order: follow them with ` + "`cozyctl platform status`" + `.

Git settings come from the flags, else from the rack's platform.git.`,
		Example: `  cozyctl platform install --kubeconfig kubeconfig --git-url https://git.example.com/platform.git --path clusters/rack1
  cozyctl platform install --rack rack.yaml --flux-manifests ./flux-v2.9.5/install.yaml`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if rackFile != "" {
				r, err := rack.Load(rackFile)
				if err != nil {
					return err
				}
				fromRack := platform.GitFromRack(r)
				f := cmd.Flags()
				if !f.Changed("git-url") {
					p.Git.URL = fromRack.URL
				}
				if !f.Changed("git-branch") {
					p.Git.Branch = fromRack.Branch
				}
				if !f.Changed("path") {
					p.Git.Path = fromRack.Path
				}
				if !f.Changed("cluster-domain") {
					p.ClusterDomain = r.Cluster.DNSDomain
				}
			}
			cfg, err := g.RESTConfig()
			if err != nil {
				return err
			}
			p.Log = g.Logger()
			if err := platform.Install(cmd.Context(), cfg, p); err != nil {
				return err
			}
			g.Logger().Info("Flux installed; follow the platform with cozyctl platform status", "path", p.Git.Path)
			return nil
		},
	}
	cmd.Flags().StringVar(&p.Manifests, "flux-manifests", "", fluxManifestsUsage)
	cmd.Flags().DurationVar(&p.Wait, "wait", 5*time.Minute, "how long to wait for Flux to reconcile the cluster's folder (0: do not wait)")
	cmd.Flags().StringVar(&rackFile, "rack", "", "take the Git settings from the rack's platform.git, and the cluster domain from its cluster.dnsDomain")
	cmd.Flags().StringVar(&p.ClusterDomain, "cluster-domain", rack.DefaultDNSDomain, "the cluster's DNS domain (a rack's cluster.dnsDomain, "+rack.DefaultDNSDomain+" by default), which Flux's controllers reach each other in (as flux install --cluster-domain)")
	cmd.Flags().StringVar(&p.Git.URL, "git-url", "", "the platform repository (https://, http:// or ssh://)")
	cmd.Flags().StringVar(&p.Git.Branch, "git-branch", "main", "the branch Flux follows")
	cmd.Flags().StringVar(&p.Git.Path, "path", "", "the cluster's folder in the repository, e.g. clusters/<name>")
	cmd.Flags().StringVar(&p.Git.SecretRef, "git-secret", "", "a Secret in flux-system with the repository's credentials (see Flux's GitRepository docs)")
	cmd.Flags().DurationVar(&p.Git.Interval, "git-interval", time.Minute, "how often Flux looks for new commits")
	_ = cmd.MarkFlagFilename("rack", "yaml", "yml")
	return cmd
}

// fluxManifestsUsage is --flux-manifests' help, in platform install and
// bootstrap.
const fluxManifestsUsage = "Flux's install manifests: a file, a folder (kustomized if it has a kustomization.yaml) or a URL; default the " + flux.Version + " release's install.yaml (air-gapped sites pass a local copy)"

// statusTable prints one row per component.
type statusTable struct{ *status.Report }

func (t statusTable) Header() []string {
	return []string{"COMPONENT", "READY", "SOURCES", "RELEASES", "MESSAGE"}
}

func (t statusTable) Rows() [][]string {
	count := func(objs []status.Object) string {
		if len(objs) == 0 {
			return "-"
		}
		n := 0
		for _, o := range objs {
			if o.Ready {
				n++
			}
		}
		return fmt.Sprintf("%d/%d", n, len(objs))
	}
	var rows [][]string
	for _, c := range t.Components {
		ready := "False"
		switch {
		case c.Off:
			ready = "off"
		case c.Ready:
			ready = "True"
		}
		rows = append(rows, []string{c.Name, ready, count(c.Sources), count(c.Releases), oneLine(c.Message, 200)})
	}
	return rows
}

// oneLine keeps a table row on one line: Flux messages can hold newlines
// and whole error chains. A long one loses its middle: the start says
// what failed, the end of a Go error chain the root cause.
func oneLine(s string, max int) string {
	s = strings.Join(strings.Fields(s), " ")
	if r := []rune(s); len(r) > max {
		head := max / 3
		s = string(r[:head]) + " … " + string(r[len(r)-(max-head-3):])
	}
	return s
}

var _ output.Tabular = statusTable{}

func newPlatformStatusCommand(g *Globals) *cobra.Command {
	var wait time.Duration
	cmd := &cobra.Command{
		Use:   "status",
		Short: "Show every platform component: sources, releases, Ready, and the first failing reason",
		Long: `Show what Flux reports for every component of the platform, in install
order: the component's Kustomization, the sources and HelmReleases it
applied, whether each is Ready, and the first reason it is not (a failing
source first, then a failing release, then the Kustomization's message,
e.g. the dependency it waits for).

With --wait it polls until every component is Ready and fails if the time
runs out; the last status is printed either way.`,
		Example: `  cozyctl platform status --kubeconfig kubeconfig
  cozyctl platform status -o json | jq '.components[] | select(.ready | not)'
  cozyctl platform status --wait 30m`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := g.Client(nil)
			if err != nil {
				return err
			}
			ctx := cmd.Context()
			deadline := time.Now().Add(wait)
			for {
				rep, err := status.Collect(ctx, c, flux.Namespace)
				if err != nil {
					return err
				}
				if rep.Ready || wait == 0 || time.Now().After(deadline) {
					if err := g.Print(statusTable{rep}); err != nil {
						return err
					}
					if !rep.Ready && wait > 0 {
						return fmt.Errorf("the platform is not ready after %s", wait)
					}
					return nil
				}
				select {
				case <-ctx.Done():
					return ctx.Err()
				case <-time.After(5 * time.Second):
				}
			}
		},
	}
	cmd.Flags().DurationVar(&wait, "wait", 0, "poll until every component is Ready, failing after this long")
	return cmd
}

func newPlatformServeGitCommand(g *Globals) *cobra.Command {
	var listen, dir string
	cmd := &cobra.Command{
		Use:   "serve-git --listen ADDR --dir DIR",
		Short: "Serve the platform's Git repositories to Flux, read-only, over HTTP",
		Long: `Serve every bare repository under DIR (DIR/NAME.git at http://ADDR/NAME.git)
over Git's smart HTTP protocol, through git http-backend (Debian's git), for
a rack or lab without a Git server of its own: point the rack's
platform.git.url at it. Clones and fetches only: pushes are refused.

It speaks plain HTTP without authentication, for a private network:
listen on that network's address. SIGTERM or SIGINT stops it after the
requests in flight (at most 10s). cozyctl lab up --platform runs it on the
lab's bridge.`,
		Example: `  cozyctl platform serve-git --listen 10.0.0.1:3000 --dir /var/lib/cozy/git`,
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if fi, err := os.Stat(dir); err != nil || !fi.IsDir() {
				return fmt.Errorf("--dir %s: not a directory of repositories (%v)", dir, err)
			}
			ln, err := net.Listen("tcp", listen)
			if err != nil {
				return err
			}
			g.Logger().Info("serving the platform's repositories", "dir", dir, "listen", ln.Addr().String())
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			return gitserver.Serve(ctx, ln, dir)
		},
	}
	cmd.Flags().StringVar(&listen, "listen", "", "address to listen on, HOST:PORT (required)")
	cmd.Flags().StringVar(&dir, "dir", "", "directory of the bare repositories (required)")
	_ = cmd.MarkFlagRequired("listen")
	_ = cmd.MarkFlagRequired("dir")
	_ = cmd.MarkFlagDirname("dir")
	return cmd
}
