package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/term"
	"k8s.io/client-go/tools/clientcmd"

	"cozy.dev/cozy/bootstrap"
	"cozy.dev/cozy/bootstrap/netboot"
	"cozy.dev/cozy/bootstrap/rack"
	"cozy.dev/cozy/bootstrap/state"
	"cozy.dev/cozy/internal/output"
	"cozy.dev/cozy/pxe"
	"cozy.dev/cozy/pxe/inventory"
)

func newBootstrapCommand(g *Globals) *cobra.Command {
	var (
		rackFile, stateDir, inventoryDir string
		dryRun, noNetboot, allowUnknown  bool
		noPlatform                       bool
		platform                         platformInstall
		pcfg                             pxe.Config
		serverIP                         string
		opts                             bootstrap.Options
	)
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
phase change on stdout. --dry-run prints what each machine would get and
changes nothing.`,
		Example: `  cozyctl bootstrap --rack rack.yaml --kernel vmlinuz --initrd initramfs.xz
  cozyctl bootstrap --rack rack.yaml --dry-run
  # another host runs 'cozyctl pxe serve --rack rack.yaml --state-dir /var/lib/cozy/pxe':
  cozyctl bootstrap --rack rack.yaml --no-netboot --inventory /var/lib/cozy/pxe`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			r, err := rack.Load(rackFile)
			if err != nil {
				return err
			}
			if stateDir == "" {
				stateDir = filepath.Join(filepath.Dir(rackFile), r.Metadata.Name)
			}
			if dryRun {
				plan, err := bootstrap.DryRun(r, stateDir)
				if err != nil {
					return err
				}
				return g.Print(plan)
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			ctx, cancel := context.WithCancelCause(ctx)
			defer cancel(nil)

			pxeDir := filepath.Join(stateDir, "pxe")
			var served sync.WaitGroup
			if noNetboot {
				if inventoryDir == "" {
					return errors.New("--no-netboot needs --inventory: the state dir of the netboot server that boots the rack")
				}
				pxeDir = inventoryDir
			} else {
				cfg, err := netbootConfig(r, pcfg, serverIP, allowUnknown)
				if err != nil {
					return err
				}
				cfg.StateDir, cfg.Log = pxeDir, g.Logger().With("component", "pxe")
				served.Go(func() {
					if err := pxe.Serve(ctx, cfg); err != nil {
						cancel(fmt.Errorf("netboot server: %w", err))
					}
				})
			}
			opts.Rack, opts.StateDir, opts.Log = r, stateDir, g.Logger()
			opts.Inventory = func() ([]inventory.Machine, error) {
				list, err := inventory.Load(pxeDir)
				if errors.Is(err, os.ErrNotExist) {
					return nil, nil
				}
				return list, err
			}
			prog := newProgress(g)
			opts.Events = prog.event
			res, err := bootstrap.Run(ctx, opts)
			cancel(nil)
			served.Wait()
			if cause := context.Cause(ctx); err != nil && cause != nil && !errors.Is(cause, context.Canceled) {
				err = cause
			}
			if err != nil {
				return fmt.Errorf("%w\nrun the same command again to continue from %s", err, stateDir)
			}
			fmt.Fprintf(g.stderr, "cluster %s is up: kubeconfig %s, talosconfig %s\n", r.Metadata.Name, res.Kubeconfig, res.Talosconfig)
			switch {
			case noPlatform:
				fmt.Fprintln(g.stderr, "--no-platform: Flux is not installed; run cozyctl platform install when ready")
			case r.Platform.Git.URL == "":
				fmt.Fprintln(g.stderr, "the rack has no platform.git.url: Flux is not installed; run cozyctl platform install --git-url ... when the repository exists")
			default:
				cfg, err := clientcmd.BuildConfigFromFlags("", res.Kubeconfig)
				if err != nil {
					return err
				}
				platform.Git = gitFromRack(r)
				if err := platform.run(cmd.Context(), g, cfg); err != nil {
					return fmt.Errorf("the cluster is up, but installing the platform failed: %w\nfix it, then run cozyctl platform install --rack %s --kubeconfig %s", err, rackFile, res.Kubeconfig)
				}
				fmt.Fprintln(g.stderr, "Flux installed; follow the platform with cozyctl platform status --kubeconfig", res.Kubeconfig)
			}
			if g.Output == output.JSON {
				return nil // the events on stdout are the result
			}
			return g.Print(nodeTable(res.Nodes))
		},
	}
	f := cmd.Flags()
	f.StringVar(&rackFile, "rack", "", "the rack file (required)")
	f.StringVar(&stateDir, "state-dir", "", "where secrets, configs, kubeconfig and progress are kept (default: <rack dir>/<cluster name>)")
	f.BoolVar(&dryRun, "dry-run", false, "print what each machine would get; change nothing")
	f.StringVar(&pcfg.Kernel, "kernel", "", "the Talos kernel to netboot (of the rack's schematic)")
	f.StringArrayVar(&pcfg.Initrds, "initrd", nil, "the Talos initramfs to netboot (repeatable)")
	f.StringVar(&pcfg.ARM64.Kernel, "kernel-arm64", "", "the Talos kernel for arm64 machines (kernel-arm64 of the rack's schematic)")
	f.StringArrayVar(&pcfg.ARM64.Initrds, "initrd-arm64", nil, "the Talos initramfs for arm64 machines (initramfs-arm64.xz; repeatable)")
	f.StringVar(&pcfg.Cmdline, "cmdline", "", "extra kernel arguments")
	f.IntVar(&pcfg.HTTPPort, "http-port", 8080, "the netboot server's HTTP port")
	f.StringVar(&serverIP, "server-ip", "", "this host's IPv4 address on the provisioning interface (default: its first)")
	f.BoolVar(&allowUnknown, "allow-unknown", false, "netboot machines not listed by MAC (needed for machines the rack selects by uuid)")
	f.BoolVar(&noNetboot, "no-netboot", false, "do not run a netboot server: another one boots the rack (see --inventory)")
	f.StringVar(&inventoryDir, "inventory", "", "with --no-netboot: that server's --state-dir, whose inventory lists the machines")
	f.IntVar(&opts.Parallel, "parallel", 8, "machines installing at once (config applied, not yet back installed)")
	f.DurationVar(&opts.Timeout, "timeout", 30*time.Minute, "longest wait for each step (a machine to appear, to install, etcd, the API)")
	f.DurationVar(&opts.NetbootTimeout, "netboot-timeout", 10*time.Minute, "how long a machine powered on through its BMC has to netboot before it is power-cycled once more, then reported")
	f.IntVar(&opts.TalosPort, "talos-port", 50000, "the Talos API port on the nodes")
	_ = f.MarkHidden("talos-port")
	f.BoolVar(&noPlatform, "no-platform", false, "stop at the kubeconfig: do not install Flux even if the rack has platform.git")
	f.StringVar(&platform.Manifests, "flux-manifests", "", "as for cozyctl platform install")
	f.DurationVar(&platform.Wait, "platform-wait", 5*time.Minute, "how long to wait for Flux to reconcile the cluster's folder")
	_ = cmd.MarkFlagRequired("rack")
	_ = cmd.MarkFlagFilename("rack", "yaml", "yml")
	return cmd
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

// netbootConfig is the rack's netboot server with the boot files given.
func netbootConfig(r *rack.Rack, boot pxe.Config, serverIP string, allowUnknown bool) (pxe.Config, error) {
	cfg, err := netboot.Config(r)
	if err != nil {
		return cfg, err
	}
	cfg.Kernel, cfg.Initrds, cfg.Cmdline, cfg.HTTPPort = boot.Kernel, boot.Initrds, boot.Cmdline, boot.HTTPPort
	cfg.ARM64 = boot.ARM64 // its command line defaults to Cmdline
	cfg.AllowUnknown = allowUnknown
	if err := netboot.CheckBoot(r, cfg); err != nil {
		return cfg, err
	}
	if serverIP != "" {
		if cfg.ServerIP, err = parseIPv4("--server-ip", serverIP); err != nil {
			return cfg, err
		}
	}
	return cfg, nil
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
