package lab

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"cozy.dev/cozy/bootstrap"
	"cozy.dev/cozy/bootstrap/state"
	"cozy.dev/cozy/images"
	"cozy.dev/cozy/internal/kernelimage"
	"cozy.dev/cozy/internal/procstat"
	"cozy.dev/cozy/lab/nodeimage"
)

// Files in a lab's dir besides vms/.
const (
	ConfigFile = "lab.json"
	RackFile   = "rack.yaml"
	StateDir   = "state" // cozyctl bootstrap's state dir
)

// UpOptions are the tools Up works with.
type UpOptions struct {
	// Cozyctl is the cozyctl binary run inside the namespace for the
	// bootstrap (usually os.Executable()).
	Cozyctl string
	// Image builds or finds the node image.
	Image func(ctx context.Context) (kernelimage.Image, error)
	// Images builds or finds the OCI layout of the images the nodes pull
	// (hack/lab-images.sh), which the lab's registry serves. Nil for a
	// lab of real Talos, which pulls from the internet.
	Images func(ctx context.Context) (string, error)
	// CacheDir keeps what the lab learns once per kernel and QEMU (the
	// KVM probe's answer); cozyctl gives internal/cachedir's.
	CacheDir string
	// Stderr receives the bootstrap's progress.
	Stderr io.Writer
	// Timeout bounds each bootstrap wait (cozyctl bootstrap --timeout).
	Timeout time.Duration
	// With Config.Platform: PlatformImages builds or finds the OCI layout
	// of the platform's images (hack/platform-images.sh), FluxManifests
	// Flux's install manifests (hack/flux-controllers.sh's install.yaml),
	// and Charts makes the upstream charts the platform pins.
	PlatformImages func(ctx context.Context) (string, error)
	FluxManifests  func(ctx context.Context) (string, error)
	Charts         images.ChartMaker
	// NoBootstrap stops once the rack stands powered off with its BMCs
	// answering: the user drives it (cozyctl machine, the bootstrap
	// command in Result.Bootstrap).
	NoBootstrap bool
	Log         *slog.Logger
}

// PhaseTime is how long one step of `lab up` took.
type PhaseTime struct {
	Phase string        `json:"phase"`
	Took  time.Duration `json:"took"`
}

// Milestone is when, counted from the start of `lab up`, the last
// machine got somewhere during the bootstrap.
type Milestone struct {
	Name string        `json:"name"`
	At   time.Duration `json:"at"`
}

// Result is what `lab up` reports.
type Result struct {
	Name      string `json:"name"`
	Dir       string `json:"dir"`
	Namespace string `json:"namespace"`
	Accel     string `json:"accel"`
	Nodes     int    `json:"nodes"`
	// NodeServices: the emulated nodes run kubelet, containerd and the
	// controllers (Config.NodeServices resolved with the accelerator).
	NodeServices bool          `json:"nodeServices"`
	Kubeconfig   string        `json:"kubeconfig"`
	Phases       []PhaseTime   `json:"phases"`
	Milestones   []Milestone   `json:"milestones"`
	Total        time.Duration `json:"total"`
	// VMCPU is the CPU time each VM's QEMU used during `lab up`: under
	// TCG, what its emulated work cost this machine.
	VMCPU []VMCPU `json:"vmCPU,omitempty"`
	// Bootstrap is the command that bootstraps the lab, for a lab up
	// with NoBootstrap; run it inside Namespace.
	Bootstrap []string `json:"bootstrap,omitempty"`
}

// VMCPU is the CPU time one VM used.
type VMCPU struct {
	Machine  string        `json:"machine"`
	Firmware string        `json:"firmware"`
	Role     string        `json:"role"`
	CPU      time.Duration `json:"cpu"`
}

// Up builds the lab and bootstraps it. On failure the lab is left as it
// is, to be looked at (`cozyctl lab status`, `lab console`) and removed
// with Down.
func Up(ctx context.Context, c *Config, o UpOptions) (*Result, error) {
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	start := time.Now()
	res := &Result{Name: c.Name, Dir: c.Dir, Namespace: Namespace(c.Name), Nodes: c.Nodes}
	step := func(name string, f func() error) error {
		t := time.Now()
		o.Log.Info("lab: " + name)
		err := f()
		res.Phases = append(res.Phases, PhaseTime{Phase: name, Took: time.Since(t).Round(10 * time.Millisecond)})
		if err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		return nil
	}
	if err := c.writeFiles(); err != nil {
		return nil, err
	}
	var img kernelimage.Image
	if err := step("node image", func() (err error) { img, err = o.Image(ctx); return err }); err != nil {
		return res, err
	}
	if err := step("accelerator", func() (err error) { res.Accel, err = chooseAccel(ctx, c.Accel, img.Kernel, o.CacheDir); return err }); err != nil {
		return res, err
	}
	res.NodeServices = c.runsNodeServices(res.Accel)
	img.Cmdline = c.nodeCmdline(img.Cmdline, res.Accel, res.NodeServices)
	if c.Image != "talos" && !res.NodeServices {
		if c.NodeServices == NodeServicesAuto {
			o.Log.Warn("lab: under " + res.Accel + " the nodes run the Talos API, etcd and kube-apiserver only, no kubelet or pods " +
				"(without KVM they are slow: on 2 cores CoreDNS became available 8 to 10 minutes after lab up started with 1 or 2 VMs, and not at all with 3: docs/lab.md#measured); --node-services on runs them")
		}
	}
	if c.Platform && (c.Image == "talos" || !res.NodeServices) {
		return res, errors.New("--platform needs nodes that run pods: the emulated node image with --node-services on")
	}
	var bootstrapExtra []string
	if c.Platform {
		if o.FluxManifests == nil {
			return res, errors.New("--platform needs Flux's install manifests (hack/flux-controllers.sh)")
		}
		var fm string
		if err := step("flux manifests", func() error {
			src, err := o.FluxManifests(ctx)
			if err != nil {
				return err
			}
			fm, err = c.fluxManifests(src)
			return err
		}); err != nil {
			return res, err
		}
		// Flux's first reconcile waits for its controllers' images and
		// start, as long as a component may take (FluxTimeout).
		wait := max(o.Timeout, FluxTimeout)
		bootstrapExtra = []string{"--flux-manifests", fm, "--platform-wait", wait.String()}
	}
	machines := c.Machines()
	if err := step("network", func() error { return c.startNetwork(ctx, machines) }); err != nil {
		return res, err
	}
	if err := startRouterAdvertiser(ctx, c.Name, c.Dir); err != nil {
		o.Log.Warn("lab: no IPv6 router advertisements", "err", err)
	}
	if o.Images != nil && res.NodeServices {
		if err := step("registry mirror", func() error { return c.startMirror(ctx, o) }); err != nil {
			return res, err
		}
	}
	if c.Platform {
		if err := step("platform repository", func() error { return c.preparePlatform(ctx, o) }); err != nil {
			return res, err
		}
	}
	// The VMs stay off: the bootstrap powers each on through its BMC,
	// with a one-time network boot, as on a rack.
	if err := step("bmcs", func() error { return c.startBMCs(ctx, o.Cozyctl, res.Accel) }); err != nil {
		return res, err
	}
	if o.NoBootstrap {
		res.Bootstrap = append(append([]string{o.Cozyctl}, c.BootstrapArgs(img)...), bootstrapExtra...)
		res.Total = time.Since(start).Round(10 * time.Millisecond)
		return res, nil
	}
	err := step("bootstrap", func() (err error) {
		res.Milestones, err = c.runBootstrap(ctx, o, append(c.BootstrapArgs(img), bootstrapExtra...), start, len(machines))
		return err
	})
	kubeconfig := filepath.Join(c.Dir, StateDir, bootstrap.KubeconfigFile)
	if err == nil && res.NodeServices {
		// The emulated nodes run kubelet and the CNI: the lab is up when
		// every machine is a Ready Node and CoreDNS serves.
		err = step("nodes ready", func() error {
			ms, err := c.waitKubernetes(ctx, kubeconfig, start, o.Timeout)
			res.Milestones = append(res.Milestones, ms...)
			return err
		})
	}
	if err == nil && c.Platform {
		err = step("platform ready", func() error {
			if err := c.waitPlatform(ctx, kubeconfig, max(o.Timeout, FluxTimeout)); err != nil {
				return err
			}
			res.Milestones = append(res.Milestones, Milestone{"platform Ready", time.Since(start).Round(100 * time.Millisecond)})
			return nil
		})
	}
	res.Total = time.Since(start).Round(10 * time.Millisecond)
	res.VMCPU = c.vmCPU(machines)
	if err != nil {
		return res, err
	}
	res.Kubeconfig = kubeconfig
	return res, nil
}

// writeFiles writes the lab's directory: its config (lab.json), the
// BMCs' credentials and the rack file.
func (c *Config) writeFiles() error {
	if err := os.MkdirAll(c.Dir, 0o755); err != nil {
		return err
	}
	cfgJSON, _ := json.MarshalIndent(c, "", "  ")
	if err := os.WriteFile(filepath.Join(c.Dir, ConfigFile), append(cfgJSON, '\n'), 0o644); err != nil {
		return err
	}
	if err := c.writeBMCCredentials(); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(c.Dir, RackFile), c.Rack(), 0o644)
}

// startNetwork makes the lab's namespace, bridge and taps, and its way
// out with --internet.
func (c *Config) startNetwork(ctx context.Context, machines []Machine) error {
	if err := createNetwork(ctx, c.Name, machines); err != nil {
		return err
	}
	if c.Internet {
		return enableInternet(ctx, c.Name, "")
	}
	return nil
}

// startMirror starts the lab's registry and fills it with the images
// the nodes pull.
func (c *Config) startMirror(ctx context.Context, o UpOptions) error {
	layout, err := o.Images(ctx)
	if err != nil {
		return err
	}
	if err := c.startRegistry(ctx, o.Cozyctl); err != nil {
		return err
	}
	return c.mirrorImages(ctx, o.Cozyctl, layout, o.Stderr)
}

// runBootstrap runs `cozyctl bootstrap` inside the lab's namespace and
// returns when its events say the last machine reached each milestone.
func (c *Config) runBootstrap(ctx context.Context, o UpOptions, args []string, start time.Time, machines int) ([]Milestone, error) {
	args = append(args, "-o", "json")
	if o.Timeout > 0 {
		args = append(args, "--timeout", o.Timeout.String())
	}
	cmd := exec.CommandContext(ctx, "ip", append([]string{"netns", "exec", Namespace(c.Name), o.Cozyctl}, args...)...)
	cmd.Stderr = o.Stderr
	events, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	ms, readErr := milestones(events, time.Since(start), machines)
	if err := cmd.Wait(); err != nil {
		return ms, fmt.Errorf("cozyctl bootstrap: %w (serial logs: cozyctl lab console NODE --name %s)", err, c.Name)
	}
	return ms, readErr
}

// vmCPU is the CPU time each running VM's QEMU has used.
func (c *Config) vmCPU(machines []Machine) []VMCPU {
	var out []VMCPU
	for _, m := range machines {
		if pid := c.vmPID(m); pid != 0 {
			if cpu, err := procstat.CPU(pid); err == nil {
				out = append(out, VMCPU{Machine: m.Name, Firmware: string(m.Firmware), Role: m.Role, CPU: cpu})
			}
		}
	}
	return out
}

// milestones reads bootstrap's JSON events until they end and returns when
// the last machine was netbooted and in maintenance mode, had its config,
// was installed, when etcd was bootstrapped, when the API answered and
// when the bootstrap was done (every control plane in etcd);
// offset is when the bootstrap started. Milestones not reached by all
// machines are left out. Events of another version than
// bootstrap.EventVersion are an error: that cozyctl is not this one.
func milestones(events io.Reader, offset time.Duration, machines int) ([]Milestone, error) {
	steps := []struct {
		name  string
		phase state.Phase
	}{
		{"all machines in maintenance mode", state.Discovered},
		{"all configs applied", state.Applied},
		{"all machines installed", state.Configured},
	}
	first := map[state.Phase]map[string]time.Duration{}
	var etcd, api, ready time.Duration
	dec := json.NewDecoder(events)
	for {
		var e bootstrap.Event
		if err := dec.Decode(&e); err != nil {
			_, _ = io.Copy(io.Discard, events)
			break
		}
		if e.Version != bootstrap.EventVersion {
			_, _ = io.Copy(io.Discard, events)
			return nil, fmt.Errorf("cozyctl bootstrap wrote events of version %d, this lab reads version %d: run the lab and the bootstrap from the same cozyctl", e.Version, bootstrap.EventVersion)
		}
		switch {
		case e.Node == "" && e.Phase == state.Ready:
			ready = e.Elapsed
		case e.Node == "" && e.Message == bootstrap.MessageAPIAnswers:
			api = e.Elapsed
		case e.Node != "" && e.Phase == state.Bootstrap && etcd == 0:
			etcd = e.Elapsed
		}
		if e.Node == "" {
			continue
		}
		for _, s := range steps {
			if !e.Phase.AtLeast(s.phase) {
				continue
			}
			if first[s.phase] == nil {
				first[s.phase] = map[string]time.Duration{}
			}
			if _, ok := first[s.phase][e.Node]; !ok {
				first[s.phase][e.Node] = e.Elapsed
			}
		}
	}
	var out []Milestone
	for _, s := range steps {
		if len(first[s.phase]) < machines {
			continue
		}
		out = append(out, Milestone{s.name, offset + slices.Max(slices.Collect(maps.Values(first[s.phase])))})
	}
	if etcd > 0 {
		out = append(out, Milestone{"etcd bootstrapped", offset + etcd})
	}
	if api > 0 {
		out = append(out, Milestone{"the API answers", offset + api})
	}
	if ready > 0 {
		out = append(out, Milestone{"bootstrap done", offset + ready})
	}
	slices.SortStableFunc(out, func(a, b Milestone) int { return cmp.Compare(a.At, b.At) })
	for i := range out {
		out[i].At = out[i].At.Round(100 * time.Millisecond)
	}
	return out, nil
}

// nodeCmdline is the kernel command line the lab's machines boot with:
// the image's, plus what TCG needs (nodeimage.TCGArgs) and, for the
// emulated node without node services, the API-only switch.
func (c *Config) nodeCmdline(cmdline, accel string, nodeServices bool) string {
	args := strings.Fields(cmdline)
	if accel == "tcg" {
		args = append(args, strings.Fields(nodeimage.TCGArgs)...)
	}
	if c.Image != "talos" && !nodeServices {
		args = append(args, nodeimage.APIOnlyArg)
	}
	return strings.Join(args, " ")
}

// BootstrapArgs is the `cozyctl bootstrap` command line of the lab, run
// inside its namespace.
func (c *Config) BootstrapArgs(img kernelimage.Image) []string {
	args := []string{"bootstrap", "--rack", filepath.Join(c.Dir, RackFile), "--state-dir", filepath.Join(c.Dir, StateDir),
		"--kernel", img.Kernel, "--server-ip", ServerIP.String()}
	for _, i := range img.Initrds {
		args = append(args, "--initrd", i)
	}
	if img.Cmdline != "" {
		args = append(args, "--cmdline", img.Cmdline)
	}
	return args
}

// Load reads the config of the lab kept in dir.
func Load(dir string) (*Config, error) {
	data, err := os.ReadFile(filepath.Join(dir, ConfigFile))
	if err != nil {
		return nil, fmt.Errorf("no lab in %s: %w", dir, err)
	}
	var c Config
	if err := json.Unmarshal(data, &c); err != nil {
		return nil, fmt.Errorf("%s: %w", filepath.Join(dir, ConfigFile), err)
	}
	c.Dir = dir
	return &c, nil
}

// Down stops the lab's VMs and removes its namespace (with its bridge and
// taps) and every process left in it. The lab's dir (disks, serial logs,
// state) stays unless purge is set. Running it twice is harmless.
func Down(ctx context.Context, c *Config, purge bool) error {
	for _, m := range c.Machines() {
		c.stopVM(m)
	}
	if err := deleteNetwork(ctx, c.Name); err != nil {
		return err
	}
	// Whether or not the lab had --internet: nothing to remove is fine.
	if err := disableInternet(ctx, c.Name, ""); err != nil {
		return err
	}
	if purge {
		return os.RemoveAll(c.Dir)
	}
	return nil
}

// NodeStatus is one line of `lab status`.
type NodeStatus struct {
	Machine
	VM    string      `json:"vm"`
	Phase state.Phase `json:"phase,omitempty"`
}

// Status reports the lab's VMs and how far bootstrap took each.
func Status(c *Config) ([]NodeStatus, error) {
	st, err := state.Read(filepath.Join(c.Dir, StateDir))
	if err != nil {
		return nil, fmt.Errorf("the bootstrap's state: %w", err)
	}
	var out []NodeStatus
	for _, m := range c.Machines() {
		ns := NodeStatus{Machine: m, VM: c.VMStatus(m)}
		if n, ok := st.Nodes[m.Name]; ok {
			ns.Phase = n.Phase
		}
		out = append(out, ns)
	}
	return out, nil
}

// Console returns the path of a node's serial log.
func Console(c *Config, node string) (string, error) {
	var names []string
	for _, m := range c.Machines() {
		if m.Name == node {
			return c.files(m).serial(), nil
		}
		names = append(names, m.Name)
	}
	return "", fmt.Errorf("lab %s has no node %q: it has %s", c.Name, node, strings.Join(names, ", "))
}
