package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"cozy.dev/cozy/bootstrap"
	"cozy.dev/cozy/internal/cachedir"
	"cozy.dev/cozy/internal/kernelimage"
	"cozy.dev/cozy/lab"
	"cozy.dev/cozy/lab/nodeimage"
)

func newLabCommand(g *Globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "lab",
		Short: "A rack of QEMU VMs that netboot and bootstrap on this machine",
		Long: `A lab is a rack of QEMU virtual machines in a private network namespace: a
bridge, one tap per VM, Cozy's netboot server in full DHCP mode, and
'cozyctl bootstrap' taking the VMs from their first PXE boot to a cluster.
Nothing leaves the namespace unless --internet says so. Needs root,
qemu-system-x86, ovmf and ipxe.`,
	}
	var name, dir string
	cmd.PersistentFlags().StringVar(&name, "name", lab.DefaultName, "the lab's name")
	cmd.PersistentFlags().StringVar(&dir, "dir", "", "the lab's directory (default: ~/.local/state/cozy/labs/<name>)")
	load := func() (*lab.Config, error) {
		if dir == "" {
			dir = lab.DefaultDir(name)
		}
		return lab.Load(dir)
	}
	cmd.AddCommand(newLabUpCommand(g, &name, &dir), newLabDownCommand(g, load), newLabStatusCommand(g, load), newLabConsoleCommand(g, load),
		newLabKubectlCommand(g, load), newLabBMCCommand(g, load))
	return cmd
}

func newLabUpCommand(g *Globals, name, dir *string) *cobra.Command {
	var (
		c           lab.Config
		timeout     time.Duration
		noBootstrap bool
		moduleProxy string
	)
	cmd := &cobra.Command{
		Use:   "up",
		Short: "Build the lab's VMs and network, netboot them and bootstrap the cluster",
		Example: `  cozyctl lab up                              # 3 VMs, BIOS and UEFI mixed
  cozyctl lab up --nodes 6 --controlplanes 3 --firmware uefi
  cozyctl lab up --image talos --internet            # real Talos (an online machine)`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c.Name, c.Dir = *name, *dir
			filled, err := c.WithDefaults()
			if err != nil {
				return err
			}
			c = filled
			self, err := os.Executable()
			if err != nil {
				return err
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			o := lab.UpOptions{
				Cozyctl: self, Stderr: g.stderr, Timeout: timeout, Log: g.Logger(), NoBootstrap: noBootstrap, CacheDir: cachedir.Dir(),
				Image: func(ctx context.Context) (kernelimage.Image, error) { return labImage(ctx, &c, g.stderr) },
			}
			if c.Image != "talos" {
				o.Images = func(ctx context.Context) (string, error) { return runBuildScript(ctx, scriptImages, g.stderr) }
			}
			if c.Platform {
				o.PlatformImages = func(ctx context.Context) (string, error) { return runBuildScript(ctx, scriptPlatform, g.stderr) }
				o.FluxManifests = func(ctx context.Context) (string, error) {
					dir, err := runBuildScript(ctx, scriptFlux, g.stderr)
					return filepath.Join(dir, "install.yaml"), err
				}
				o.Charts = chartMaker(moduleProxy)
			}
			res, err := lab.Up(ctx, &c, o)
			if res != nil {
				printPhases(g.stderr, res)
			}
			if err != nil {
				return fmt.Errorf("%w\nthe lab is left as it is: cozyctl lab status --name %[2]s; cozyctl lab down --name %[2]s removes it", err, c.Name)
			}
			if noBootstrap {
				ns := lab.Namespace(c.Name)
				fmt.Fprintf(g.stderr, "lab %[1]s stands powered off, its BMCs answering (docs/power.md):\n  ip netns exec %[2]s %[3]s machine power status --all --rack %[4]s\nbootstrap it:\n  ip netns exec %[2]s %[5]s\n",
					c.Name, ns, self, filepath.Join(c.Dir, lab.RackFile), strings.Join(res.Bootstrap, " "))
				return g.Print(labResult{res})
			}
			fmt.Fprintf(g.stderr, "lab %s is up (%s): kubeconfig %s\nuse it: cozyctl lab kubectl --name %s -- get nodes\n",
				c.Name, res.Accel, res.Kubeconfig, c.Name)
			if c.Image != "talos" && !res.NodeServices {
				fmt.Fprintf(g.stderr, "its nodes run the Talos API, etcd and kube-apiserver only (--node-services %s under %s): no kubelet, no pods\n", c.NodeServices, res.Accel)
			}
			return g.Print(labResult{res})
		},
	}
	f := cmd.Flags()
	f.IntVar(&c.Nodes, "nodes", lab.DefaultNodes, "VMs in the rack")
	f.IntVar(&c.ControlPlanes, "controlplanes", 1, "control planes among them: 1 or 3")
	f.StringVar(&c.Firmware, "firmware", lab.FirmwareMixed, "bios, uefi, or mixed (alternating)")
	f.StringVar(&c.Image, "image", "emulated", "node image: emulated (the emulated Talos node) or talos (real Talos from the Image Factory; needs --internet)")
	f.StringVar(&c.Factory, "factory", "", "the Talos Image Factory of --image talos (default the rack's, https://factory.talos.dev)")
	f.BoolVar(&c.Internet, "internet", false, "let the VMs out of the lab's namespace, NATed through this machine (turns on its IPv4 forwarding); off by default")
	f.IntVar(&c.MemoryMiB, "memory", lab.DefaultMemoryMiB, "MiB of memory per VM")
	f.StringVar(&c.Accel, "accel", "auto", "auto (KVM if it really boots, else TCG), kvm or tcg")
	f.StringVar(&c.NodeServices, "node-services", lab.NodeServicesAuto, "emulated nodes run kubelet, containerd, the controllers and pods: on, off (the Talos API, etcd and kube-apiserver only), or auto (on under KVM, off under TCG)")
	f.DurationVar(&timeout, "timeout", 20*time.Minute, "longest wait for each bootstrap step")
	f.BoolVar(&c.Platform, "platform", false, "after the bootstrap, install the platform's components whose images Cozy builds ("+strings.Join(lab.PlatformComponents, ", ")+") with Flux, from the lab's registry and a Git server on its bridge, and wait until they are Ready (each component has "+strings.TrimSuffix(lab.FluxTimeout.String(), "0s")+", the wait at least as long; needs --node-services on; under TCG on 2 cores it has not reached Ready yet: docs/lab.md)")
	f.StringVar(&moduleProxy, "module-proxy", "", moduleProxyHelp+" (with --platform)")
	f.BoolVar(&noBootstrap, "no-bootstrap", false, "stop once the rack stands powered off with its BMCs answering, and print the bootstrap command to run yourself")
	return cmd
}

type labResult struct{ *lab.Result }

func (r labResult) Header() []string { return []string{"LAB", "ACCEL", "KUBECONFIG", "TOTAL"} }

func (r labResult) Rows() [][]string {
	return [][]string{{r.Name, r.Accel, r.Kubeconfig, r.Total.String()}}
}

// printPhases shows how long each step of `lab up` took and when, during
// the bootstrap, the last machine got where.
func printPhases(w io.Writer, res *lab.Result) {
	fmt.Fprintf(w, "lab %s: %d nodes, %s, %s in all\n", res.Name, res.Nodes, res.Accel, res.Total)
	for _, p := range res.Phases {
		fmt.Fprintf(w, "  %-36s %9s\n", p.Phase, p.Took)
	}
	for _, m := range res.Milestones {
		fmt.Fprintf(w, "    %-34s at %8s\n", m.Name, m.At)
	}
	if len(res.VMCPU) > 0 {
		fmt.Fprintf(w, "  CPU time of each VM:\n")
		for _, v := range res.VMCPU {
			fmt.Fprintf(w, "    %-12s %-12s %-5s %9s\n", v.Machine, v.Role, v.Firmware, v.CPU.Round(100*time.Millisecond))
		}
	}
}

func newLabDownCommand(g *Globals, load func() (*lab.Config, error)) *cobra.Command {
	var purge bool
	cmd := &cobra.Command{
		Use:   "down",
		Short: "Stop the lab's VMs and remove its network namespace, bridge and taps (safe to run twice)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := load()
			if errors.Is(err, os.ErrNotExist) {
				fmt.Fprintln(g.stderr, "no such lab: nothing to remove")
				return nil
			}
			if err != nil {
				return err
			}
			if err := lab.Down(context.WithoutCancel(cmd.Context()), c, purge); err != nil {
				return err
			}
			if purge {
				fmt.Fprintf(g.stderr, "lab %s removed\n", c.Name)
			} else {
				fmt.Fprintf(g.stderr, "lab %s is down; its disks, serial logs and state stay in %s (--purge removes them)\n", c.Name, c.Dir)
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&purge, "purge", false, "also delete the lab's directory: disks, serial logs, secrets, kubeconfig")
	return cmd
}

type labStatus []lab.NodeStatus

func (s labStatus) Header() []string {
	return []string{"NODE", "ROLE", "FIRMWARE", "MAC", "IP", "VM", "PHASE"}
}

func (s labStatus) Rows() [][]string {
	var rows [][]string
	for _, n := range s {
		rows = append(rows, []string{n.Name, n.Role, n.Firmware, n.MACText, n.IP.String(), n.VM, dash(string(n.Phase))})
	}
	return rows
}

func newLabStatusCommand(g *Globals, load func() (*lab.Config, error)) *cobra.Command {
	return &cobra.Command{
		Use:   "status",
		Short: "List the lab's VMs: firmware, address, whether QEMU runs, bootstrap phase",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := load()
			if err != nil {
				return err
			}
			st, err := lab.Status(c)
			if err != nil {
				return err
			}
			if err := g.Print(labStatus(st)); err != nil {
				return err
			}
			for _, p := range lab.ImageProblems(cmd.Context(), c) {
				fmt.Fprintln(g.stderr, "image not pulled:", p)
			}
			return nil
		},
	}
}

func newLabConsoleCommand(g *Globals, load func() (*lab.Config, error)) *cobra.Command {
	return &cobra.Command{
		Use:   "console NODE",
		Short: "Print a node's serial console log",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := load()
			if err != nil {
				return err
			}
			path, err := lab.Console(c, args[0])
			if err != nil {
				return err
			}
			f, err := os.Open(path)
			if err != nil {
				return fmt.Errorf("%s has no console log yet: %w", args[0], err)
			}
			defer f.Close()
			_, err = io.Copy(g.stdout, f)
			return err
		},
	}
}

// labImage builds (or finds, cached) the emulated node image: Debian's
// kernel, busybox, cozy-talos-node from next to this cozyctl, and the
// Kubernetes binaries, containerd and the CNI plugins, each from the
// cache, built first if the cache lacks them (hack's scripts, with their
// progress on stderr).
func labImage(ctx context.Context, c *lab.Config, progress io.Writer) (kernelimage.Image, error) {
	if c.Image == "talos" {
		return lab.TalosImage(ctx, c, nil, cachedir.Dir())
	}
	self, err := os.Executable()
	if err != nil {
		return kernelimage.Image{}, err
	}
	node := filepath.Join(filepath.Dir(self), "cozy-talos-node")
	if _, err := os.Stat(node); err != nil {
		return kernelimage.Image{}, fmt.Errorf("the emulated node binary: %w (make build writes it next to cozyctl)", err)
	}
	o := nodeimage.Options{NodeBinary: node, CacheDir: filepath.Join(cachedir.Dir(), "lab", "images")}
	for _, b := range []struct {
		dir    *string
		script string
	}{{&o.KernelDir, scriptKernel}, {&o.KubernetesDir, scriptKubernetes}, {&o.RuntimeDir, scriptRuntime}} {
		if *b.dir, err = runBuildScript(ctx, b.script, progress); err != nil {
			return kernelimage.Image{}, err
		}
	}
	img, err := nodeimage.Build(ctx, o)
	if err != nil {
		return kernelimage.Image{}, err
	}
	return kernelimage.Image{Kernel: img.Kernel, Initrds: []string{img.Initrd}, Cmdline: img.Cmdline}, nil
}

func newLabKubectlCommand(g *Globals, load func() (*lab.Config, error)) *cobra.Command {
	return &cobra.Command{
		Use:   "kubectl -- ARGS...",
		Short: "Run kubectl against the lab's cluster, inside its network, with its kubeconfig",
		Long: `Runs kubectl (built with the lab's other Kubernetes binaries, from the cache)
inside the lab's network namespace, where the cluster's API is, with the
kubeconfig the bootstrap fetched. Everything after -- goes to kubectl.`,
		Example: `  cozyctl lab kubectl -- get nodes -o wide
  cozyctl lab kubectl -- -n kube-system logs deploy/coredns`,
		DisableFlagParsing: false,
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := load()
			if err != nil {
				return err
			}
			k8s, err := runBuildScript(cmd.Context(), scriptKubernetes, g.stderr)
			if err != nil {
				return err
			}
			kc := filepath.Join(c.Dir, lab.StateDir, bootstrap.KubeconfigFile)
			if _, err := os.Stat(kc); err != nil {
				return fmt.Errorf("lab %s has no kubeconfig yet (%w): is it bootstrapped? cozyctl lab status --name %s", c.Name, err, c.Name)
			}
			kubectl := exec.CommandContext(cmd.Context(), "ip", append([]string{"netns", "exec", lab.Namespace(c.Name),
				filepath.Join(k8s, "kubectl"), "--kubeconfig", kc}, args...)...)
			kubectl.Stdin, kubectl.Stdout, kubectl.Stderr = cmd.InOrStdin(), g.stdout, g.stderr
			if err := kubectl.Run(); err != nil {
				var exit *exec.ExitError
				if errors.As(err, &exit) {
					return exitCode(exit.ExitCode())
				}
				return err
			}
			return nil
		},
	}
}

func newLabBMCCommand(g *Globals, load func() (*lab.Config, error)) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "bmc",
		Short: "The lab's emulated BMCs",
	}
	accel := ""
	serve := &cobra.Command{
		Use:   "serve",
		Short: "Serve one Redfish BMC per lab VM, inside the lab's namespace (lab up starts it)",
		Long: `Serve one Redfish BMC per VM of the lab, each at its address on the lab's
management network (192.168.78.0/24 on the lab's bridge), over HTTPS with a
self-signed certificate and the account in the lab's bmc.yaml. Power goes to
the VM's QEMU: On starts it, ForceOff quits it, GracefulShutdown presses its
ACPI power button, ForceRestart resets it; a one-time network boot puts its
NIC first in the boot order of the next start. 'cozyctl lab up' runs this in
the lab's namespace; it stops with the namespace at 'lab down'.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if accel != "kvm" && accel != "tcg" {
				return fmt.Errorf("--accel %q: kvm or tcg", accel)
			}
			c, err := load()
			if err != nil {
				return err
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			return lab.ServeBMCs(ctx, c, accel, g.Logger())
		},
	}
	serve.Flags().StringVar(&accel, "accel", "tcg", "the accelerator VMs start with: kvm or tcg")
	cmd.AddCommand(serve)
	return cmd
}
