package cli

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/signal"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/term"

	"cozy.dev/cozy/bootstrap"
	"cozy.dev/cozy/bootstrap/rack"
	"cozy.dev/cozy/bootstrap/state"
	"cozy.dev/cozy/internal/output"
	"cozy.dev/cozy/platform"
)

func newBootstrapCommand(g *Globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "bootstrap",
		Short: "Install Talos on every machine of a rack and bootstrap the cluster",
		Long: `Run the netboot server for the rack, find each machine of the rack file as it
netboots into Talos maintenance mode, check its install disk, apply its
machine config, wait for it to come back installed, bootstrap etcd once on
the first control plane, and write the kubeconfig.

Everything is recorded in the state dir (default: next to the rack file, in
a directory named after the cluster): the secrets bundle, machine configs,
talosconfig, kubeconfig and state.json. Interrupted, the same command picks
up where it stopped; it never regenerates secrets or bootstraps etcd twice.

If the rack has platform.git.url, it then installs Flux and points it at
the rack's folder of that repository, as cozyctl platform install does
(--no-platform skips this).

Progress is a per-node table on stderr; with -o json, one JSON event per
phase change on stdout (docs/bootstrap.md describes them). --dry-run
prints what each machine would get and changes nothing.`,
		Example: `  cozyctl bootstrap --rack rack.yaml --kernel vmlinuz --initrd initramfs.xz
  cozyctl bootstrap --rack rack.yaml --dry-run
  # another host runs 'cozyctl pxe serve --rack rack.yaml --state-dir /var/lib/cozy/pxe':
  cozyctl bootstrap --rack rack.yaml --no-netboot --inventory /var/lib/cozy/pxe`,
		Args: cobra.NoArgs,
	}
	bringUp(g, cmd, nil)
	return cmd
}

// bringUp gives cmd the bootstrap's flags and its run: `cozyctl
// bootstrap`, and `cozyctl node add`, whose check comes first.
func bringUp(g *Globals, cmd *cobra.Command, check func(r *rack.Rack, stateDir string) error) {
	var (
		rackFile                      string
		dryRun, noNetboot, noPlatform bool
		opts                          bootstrap.UpOptions
		platformOpts                  platform.InstallOptions
	)
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		r, err := rack.Load(rackFile)
		if err != nil {
			return err
		}
		opts.StateDir = defaultStateDir(opts.StateDir, rackFile, r)
		if check != nil {
			if err := check(r, opts.StateDir); err != nil {
				return err
			}
		}
		if dryRun {
			plan, err := bootstrap.DryRun(r, opts.StateDir)
			if err != nil {
				return err
			}
			return g.Print(plan)
		}
		switch {
		case noNetboot && opts.InventoryDir == "":
			return errors.New("--no-netboot needs --inventory: the state dir of the netboot server that boots the rack")
		case !noNetboot:
			opts.InventoryDir = "" // only --no-netboot reads another server's
		}
		if !noPlatform {
			opts.Platform = &platformOpts // logs to opts.Log
		}
		opts.Rack, opts.Log = r, g.Logger()
		opts.Events = newProgress(g).event
		ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
		defer stop()
		res, err := bootstrap.Up(ctx, opts)
		return reportUp(g, res, err, r.Metadata.Name, rackFile, opts.StateDir)
	}
	f := cmd.Flags()
	f.StringVar(&rackFile, "rack", "", "the rack file (required)")
	f.StringVar(&opts.StateDir, "state-dir", "", "where secrets, configs, kubeconfig and progress are kept (default: <rack dir>/<cluster name>)")
	f.BoolVar(&dryRun, "dry-run", false, "print what each machine would get; change nothing")
	f.StringVar(&opts.Boot.Kernel, "kernel", "", "the Talos kernel to netboot (of the rack's schematic)")
	f.StringArrayVar(&opts.Boot.Initrds, "initrd", nil, "the Talos initramfs to netboot (repeatable)")
	f.StringVar(&opts.Boot.ARM64.Kernel, "kernel-arm64", "", "the Talos kernel for arm64 machines (kernel-arm64 of the rack's schematic)")
	f.StringArrayVar(&opts.Boot.ARM64.Initrds, "initrd-arm64", nil, "the Talos initramfs for arm64 machines (initramfs-arm64.xz; repeatable)")
	f.StringVar(&opts.Boot.Cmdline, "cmdline", "", "extra kernel arguments")
	f.IntVar(&opts.Boot.HTTPPort, "http-port", 8080, "the netboot server's HTTP port")
	f.TextVar(&opts.Boot.ServerIP, "server-ip", netip.Addr{}, "this host's IPv4 address on the provisioning interface (default: its first)")
	f.BoolVar(&opts.Boot.AllowUnknown, "allow-unknown", false, "netboot machines not listed by MAC (needed for machines the rack selects by uuid)")
	f.BoolVar(&noNetboot, "no-netboot", false, "do not run a netboot server: another one boots the rack (see --inventory)")
	f.StringVar(&opts.InventoryDir, "inventory", "", "with --no-netboot: that server's --state-dir, whose inventory lists the machines")
	f.IntVar(&opts.Parallel, "parallel", 8, "machines installing at once (config applied, not yet back installed)")
	f.DurationVar(&opts.Timeout, "timeout", 30*time.Minute, "longest wait for each step (a machine to appear, to install, etcd, the API)")
	f.DurationVar(&opts.NetbootTimeout, "netboot-timeout", 10*time.Minute, "how long a machine powered on through its BMC has to netboot before it is power-cycled once more, then reported")
	f.IntVar(&opts.TalosPort, "talos-port", 50000, "the Talos API port on the nodes")
	_ = f.MarkHidden("talos-port")
	f.BoolVar(&noPlatform, "no-platform", false, "stop at the kubeconfig: do not install Flux even if the rack has platform.git")
	f.StringVar(&platformOpts.Manifests, "flux-manifests", "", fluxManifestsUsage)
	f.DurationVar(&platformOpts.Wait, "platform-wait", 5*time.Minute, "how long to wait for Flux to reconcile the cluster's folder")
	_ = cmd.MarkFlagRequired("rack")
	_ = cmd.MarkFlagFilename("rack", "yaml", "yml")
}

// reportUp prints how a bring-up ended, and what to run next.
func reportUp(g *Globals, res *bootstrap.UpResult, err error, cluster, rackFile, stateDir string) error {
	if perr := (*bootstrap.PlatformError)(nil); errors.As(err, &perr) {
		return fmt.Errorf("%w\nfix it, then run cozyctl platform install --rack %s --kubeconfig %s", err, rackFile, perr.Kubeconfig)
	}
	if err != nil {
		return fmt.Errorf("%w\nrun the same command again to continue from %s", err, stateDir)
	}
	fmt.Fprintf(g.stderr, "cluster %s is up: kubeconfig %s, talosconfig %s\n", cluster, res.Kubeconfig, res.Talosconfig)
	switch res.Platform {
	case bootstrap.PlatformSkipped:
		fmt.Fprintln(g.stderr, "--no-platform: Flux is not installed; run cozyctl platform install when ready")
	case bootstrap.PlatformNoGit:
		fmt.Fprintln(g.stderr, "the rack has no platform.git.url: Flux is not installed; run cozyctl platform install --git-url ... when the repository exists")
	case bootstrap.PlatformInstalled:
		fmt.Fprintln(g.stderr, "Flux installed; follow the platform with cozyctl platform status --kubeconfig", res.Kubeconfig)
	}
	if g.Output == output.JSON {
		return nil // the events on stdout are the result
	}
	return g.Print(nodeTable(res.Nodes))
}

// nodeTable prints the nodes of a finished bootstrap.
type nodeTable []state.Node

func (t nodeTable) Header() []string { return []string{"NODE", "ROLE", "MAC", "UUID", "IP", "PHASE"} }

func (t nodeTable) Rows() [][]string {
	rows := make([][]string, 0, len(t))
	for _, n := range t {
		ip := ""
		if n.IP.IsValid() {
			ip = n.IP.String()
		}
		rows = append(rows, []string{n.Hostname, n.Role, dash(n.MAC), dash(n.UUID), dash(ip), string(n.Phase)})
	}
	return rows
}

// progress shows bootstrap events: a live per-node table on a terminal,
// one line per change on other stderr, JSON lines on stdout with -o json.
type progress struct {
	g     *Globals
	mu    sync.Mutex
	nodes map[string]bootstrap.Event
	live  bool
	drawn int
	json  *json.Encoder
}

func newProgress(g *Globals) *progress {
	p := &progress{g: g, nodes: map[string]bootstrap.Event{}}
	if g.Output == output.JSON {
		p.json = json.NewEncoder(g.stdout)
	}
	if f, ok := g.stderr.(*os.File); ok && term.IsTerminal(int(f.Fd())) {
		p.live = true
	}
	return p
}

func (p *progress) event(e bootstrap.Event) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.json != nil {
		_ = p.json.Encode(e)
	}
	if e.Node == "" {
		if e.Message != "" {
			fmt.Fprintf(p.g.stderr, "%8s  %s\n", e.Elapsed.Round(100*time.Millisecond), e.Message)
			p.drawn = 0
		}
		return
	}
	if old, ok := p.nodes[e.Node]; ok && old.Phase == e.Phase && old.IP == e.IP && old.Message == e.Message {
		return
	}
	p.nodes[e.Node] = e
	if p.live {
		p.redraw()
		return
	}
	line := fmt.Sprintf("%8s  %-16s %-13s %-15s %s", e.Elapsed.Round(100*time.Millisecond), e.Node, e.Role, dash(e.IP), e.Phase)
	if e.Message != "" {
		line += ": " + e.Message
	}
	fmt.Fprintln(p.g.stderr, line)
}

// redraw rewrites the table in place (a terminal only).
func (p *progress) redraw() {
	names := make([]string, 0, len(p.nodes))
	for n := range p.nodes {
		names = append(names, n)
	}
	sort.Strings(names)
	var b strings.Builder
	if p.drawn > 0 {
		fmt.Fprintf(&b, "\x1b[%dA\x1b[J", p.drawn)
	}
	fmt.Fprintf(&b, "%-16s %-13s %-15s %-12s %s\n", "NODE", "ROLE", "IP", "PHASE", "SINCE START")
	for _, n := range names {
		e := p.nodes[n]
		fmt.Fprintf(&b, "%-16s %-13s %-15s %-12s %s\n", e.Node, e.Role, dash(e.IP), e.Phase, e.Elapsed.Round(100*time.Millisecond))
	}
	p.drawn = len(names) + 1
	_, _ = io.WriteString(p.g.stderr, b.String())
}
