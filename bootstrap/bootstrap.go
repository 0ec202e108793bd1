// Package bootstrap turns a rack of machines netbooted into Talos
// maintenance mode into a Kubernetes cluster: it finds each machine of the
// rack file (the netboot server's inventory, confirmed by Talos's API),
// applies its machine config, waits for it to come back installed,
// bootstraps etcd once, and writes the kubeconfig.
//
// Every step is recorded in a state file (package state) before the next
// begins, so a killed run started again picks up where it stopped: it
// never regenerates secrets and never bootstraps etcd twice.
package bootstrap

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/siderolabs/talos/pkg/machinery/client"
	clientconfig "github.com/siderolabs/talos/pkg/machinery/client/config"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/tools/clientcmd"

	"cozy.dev/cozy/bootstrap/rack"
	"cozy.dev/cozy/bootstrap/rackapi"
	"cozy.dev/cozy/bootstrap/state"
	"cozy.dev/cozy/bootstrap/talosapi"
	"cozy.dev/cozy/bootstrap/talosconfig"
	"cozy.dev/cozy/pxe/inventory"
)

// Files in the state dir besides state.json.
const (
	TalosDir       = "talos" // secrets.yaml, machine configs, talosconfig (rackapi.TalosconfigFile)
	KubeconfigFile = rackapi.KubeconfigFile
)

// Options of one bootstrap run.
type Options struct {
	Rack     *rack.Rack
	StateDir string
	// Inventory lists the machines the netboot server has seen.
	Inventory func() ([]inventory.Machine, error)
	// Parallel bounds how many machines install at once (from applying
	// their config to answering installed).
	Parallel int
	// TalosPort is the Talos API port (default 50000).
	TalosPort int
	// Timeout bounds each wait: a machine to appear, to come back
	// installed, etcd and the Kubernetes API to answer (default 30m).
	Timeout time.Duration
	// Poll is how often waits retry (default 2s).
	Poll time.Duration
	// NetbootTimeout is how long a machine powered on through its BMC
	// has to reach the netboot server before it is power-cycled once
	// more, and then reported (default 10m: a large server's firmware
	// can take minutes to train its memory).
	NetbootTimeout time.Duration
	// Events receives every phase change; may be nil.
	Events func(Event)
	Log    *slog.Logger
}

// Event is one phase change of one node, or of the cluster (Node empty).
//
// With `cozyctl bootstrap -o json` each event is one line of JSON on
// stdout: the lab reads them from its namespace, and so may scripts.
// Version says which form a reader gets.
type Event struct {
	Version int           `json:"v"` // EventVersion
	Time    time.Time     `json:"time"`
	Node    string        `json:"node,omitempty"`
	Role    string        `json:"role,omitempty"`
	IP      string        `json:"ip,omitempty"`
	Phase   state.Phase   `json:"phase"`
	Elapsed time.Duration `json:"elapsed"`
	Message string        `json:"message,omitempty"`
}

// EventVersion is the version of Event's JSON form. It changes when a
// field changes meaning or goes away, not when one is added.
const EventVersion = 1

// Result is what a finished run produced.
type Result struct {
	Kubeconfig  string `json:"kubeconfig"`
	Talosconfig string `json:"talosconfig"`
	// EtcdBootstrapped names the control plane etcd started on.
	EtcdBootstrapped string       `json:"etcdBootstrapped"`
	Nodes            []state.Node `json:"nodes"`
}

// MessageAPIAnswers is the cluster event sent once the cluster's API
// answers with the written kubeconfig (other control planes may still be
// joining etcd).
const MessageAPIAnswers = "the cluster's API answers with the kubeconfig"

type run struct {
	opts    Options
	st      *state.Store
	start   time.Time
	tc      *clientconfig.Config
	configs map[string]string // hostname -> config file
	sem     chan struct{}
	// cpsApplied is done when every control plane is past applying its
	// config: workers wait for it, since they get their API certificate
	// from a control plane (trustd) and must not hold every install slot
	// while it waits for one.
	cpsApplied sync.WaitGroup
	gate       *etcdGate
	warned     sync.Map // unknown MACs reported once
}

// Run bootstraps the rack. It returns once the cluster's API answers with
// the written kubeconfig, or with the first error that stops it; rerun it
// to continue from the state dir.
func Run(ctx context.Context, opts Options) (*Result, error) {
	opts, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	b, talosconfigPath, err := openRun(opts)
	if err != nil {
		return nil, err
	}
	kubeconfig, err := b.installAll(ctx)
	if err != nil {
		return nil, err
	}
	return b.finish(kubeconfig, talosconfigPath)
}

// withDefaults fills in what opts leaves out, and refuses what it cannot.
func (opts Options) withDefaults() (Options, error) {
	if opts.Parallel <= 0 {
		opts.Parallel = 8
	}
	if opts.Timeout == 0 {
		opts.Timeout = 30 * time.Minute
	}
	if opts.Poll == 0 {
		opts.Poll = 2 * time.Second
	}
	if opts.NetbootTimeout == 0 {
		opts.NetbootTimeout = 10 * time.Minute
	}
	if opts.Log == nil {
		opts.Log = slog.New(slog.DiscardHandler)
	}
	if opts.Inventory == nil {
		return opts, errors.New("no inventory: bootstrap finds machines through the netboot server")
	}
	return opts, nil
}

// openRun loads the state dir (or starts it), writes the Talos configs and
// records every machine of the rack as pending unless the state already
// has it; it returns the run and the talosconfig's path.
func openRun(opts Options) (*run, string, error) {
	r := opts.Rack
	if err := os.MkdirAll(opts.StateDir, 0o700); err != nil {
		return nil, "", err
	}
	st, err := state.Open(opts.StateDir, r.Metadata.Name)
	if err != nil {
		return nil, "", err
	}
	w, err := talosconfig.Write(r, filepath.Join(opts.StateDir, TalosDir))
	if err != nil {
		return nil, "", err
	}
	tc, err := clientconfig.Open(w.Talosconfig)
	if err != nil {
		return nil, "", err
	}
	b := &run{opts: opts, st: st, start: time.Now(), tc: tc, configs: w.Configs, sem: make(chan struct{}, opts.Parallel)}
	if err := st.Update(func(s *state.State) {
		if s.Started.IsZero() {
			s.Started = b.start
		}
		for _, m := range r.Machines {
			if _, ok := s.Nodes[m.Hostname]; !ok {
				s.Nodes[m.Hostname] = &state.Node{Hostname: m.Hostname, Role: m.Role, MAC: m.MAC, UUID: m.UUID, Phase: state.Pending, Since: b.start}
			}
		}
	}); err != nil {
		return nil, "", err
	}
	for _, m := range r.Machines {
		b.emit(m.Hostname, "")
	}
	return b, w.Talosconfig, nil
}

// installAll installs every machine in parallel, control planes first,
// and bootstraps etcd once every machine has taken its config and every
// control plane is installed (etcdGate), while workers finish. It
// returns the kubeconfig's path, or every error that stopped a machine.
func (b *run) installAll(ctx context.Context) (string, error) {
	r := b.opts.Rack
	var hosts, cps []string
	for _, m := range r.Machines {
		hosts = append(hosts, m.Hostname)
	}
	for _, m := range r.ControlPlanes() {
		cps = append(cps, m.Hostname)
	}
	b.gate = newEtcdGate(hosts, cps)
	b.cpsApplied.Add(len(cps))
	installCtx, stopInstalls := context.WithCancel(ctx)
	defer stopInstalls()
	errs := make(chan error, len(r.Machines)+1)
	var wg sync.WaitGroup
	for i := range r.Machines {
		m := &r.Machines[i]
		wg.Go(func() {
			if err := b.install(installCtx, m); err != nil {
				b.gate.failed(m.Hostname)
				errs <- fmt.Errorf("%s: %w", m.Hostname, err)
				return
			}
			b.gate.installed(m.Hostname)
		})
	}
	first := &r.ControlPlanes()[0]
	var kubeconfig string
	if b.gate.wait() {
		err := b.bootstrapEtcd(ctx, first)
		if err == nil {
			kubeconfig, err = b.kubeconfig(ctx, first)
		}
		if err == nil {
			b.emitCluster(state.Bootstrap, MessageAPIAnswers)
			err = b.waitEtcdMembers(ctx, first, cps)
		}
		if err != nil {
			errs <- err
			stopInstalls()
		}
	}
	wg.Wait()
	close(errs)
	var all []error
	for err := range errs {
		all = append(all, err)
	}
	return kubeconfig, errors.Join(all...)
}

// finish marks the cluster and every node Ready in the state, and
// reports them.
func (b *run) finish(kubeconfig, talosconfigPath string) (*Result, error) {
	r, st := b.opts.Rack, b.st
	if err := st.Update(func(s *state.State) {
		s.Kubeconfig = kubeconfig
		s.Finished = time.Now()
		for _, n := range s.Nodes {
			if n.Phase != state.Ready {
				n.Phase, n.Since = state.Ready, time.Now()
			}
		}
	}); err != nil {
		return nil, err
	}
	res := &Result{Kubeconfig: kubeconfig, Talosconfig: talosconfigPath, EtcdBootstrapped: st.Snapshot().EtcdBootstrapped}
	for _, m := range r.Machines {
		b.emit(m.Hostname, "")
		res.Nodes = append(res.Nodes, st.Node(m.Hostname))
	}
	b.emitCluster(state.Ready, "kubeconfig written to "+kubeconfig)
	return res, nil
}

// emit reports a node's current phase (or the cluster's, for node "").
func (b *run) emit(node, msg string) {
	if b.opts.Events == nil {
		return
	}
	e := Event{Version: EventVersion, Time: time.Now(), Elapsed: time.Since(b.start).Round(time.Millisecond), Message: msg}
	if node != "" {
		n := b.st.Node(node)
		e.Node, e.Role, e.Phase = n.Hostname, n.Role, n.Phase
		if n.IP.IsValid() {
			e.IP = n.IP.String()
		}
	}
	b.opts.Events(e)
}

// emitCluster reports a cluster-wide event.
func (b *run) emitCluster(p state.Phase, msg string) {
	if b.opts.Events != nil {
		b.opts.Events(Event{Version: EventVersion, Time: time.Now(), Elapsed: time.Since(b.start).Round(time.Millisecond), Phase: p, Message: msg})
	}
}

// advance records a node's new phase (and address) before anything else
// happens, then reports it.
func (b *run) advance(m *rack.Machine, p state.Phase, ip netip.Addr) error {
	err := b.st.Update(func(s *state.State) {
		n := s.Nodes[m.Hostname]
		if ip.IsValid() {
			n.IP = ip
		}
		n.Phase, n.Since, n.Error = p, time.Now(), ""
	})
	if err == nil {
		b.opts.Log.Info("node", "node", m.Hostname, "phase", p, "ip", ip)
		b.emit(m.Hostname, "")
	}
	return err
}

// install takes one machine to Configured.
func (b *run) install(ctx context.Context, m *rack.Machine) error {
	cpApplied := func() {}
	if m.Role == rack.RoleControlPlane {
		cpApplied = sync.OnceFunc(b.cpsApplied.Done)
		defer cpApplied()
	}
	n := b.st.Node(m.Hostname)
	if n.Phase.AtLeast(state.Configured) {
		return nil
	}
	ip := n.IP
	if n.Phase.AtLeast(state.Applied) && ip.IsValid() {
		b.gate.appliedConfig(m.Hostname)
		return b.waitConfigured(ctx, m, ip)
	}
	ip, err := b.discover(ctx, m)
	if err != nil {
		return err
	}
	// Installed already (a run that died between apply and recording it)?
	if b.configured(ctx, ip) {
		if err := b.advance(m, state.Applied, ip); err != nil {
			return err
		}
		return b.advance(m, state.Configured, ip)
	}
	if m.Role != rack.RoleControlPlane {
		b.cpsApplied.Wait()
	}
	// At most Parallel machines install at once: each pulls the installer
	// image and writes its disk.
	select {
	case b.sem <- struct{}{}:
	case <-ctx.Done():
		return ctx.Err()
	}
	defer func() { <-b.sem }()
	err = b.apply(ctx, m, ip)
	cpApplied()
	if err != nil {
		return err
	}
	b.gate.appliedConfig(m.Hostname)
	return b.waitConfigured(ctx, m, ip)
}

// discover waits until the machine shows up in the netboot inventory and
// answers on Talos's API, and checks it is the machine the rack means. A
// machine with a BMC that has not been seen yet is powered into a
// one-time network boot first, and power-cycled once more if it does not
// netboot within NetbootTimeout.
func (b *run) discover(ctx context.Context, m *rack.Machine) (netip.Addr, error) {
	ctx, cancel := context.WithTimeout(ctx, b.opts.Timeout)
	defer cancel()
	pw := b.newPowerer(m)
	var last error
	for {
		ip, err := b.lookup(m)
		if err == nil {
			pw.netbooted(ctx)
			if b.configured(ctx, ip) {
				return ip, nil
			}
			if err = b.confirm(ctx, m, ip); err == nil {
				return ip, b.advance(m, state.Discovered, ip)
			}
		} else if errors.Is(err, errNotSeen) {
			if perr := pw.power(ctx); perr != nil {
				return netip.Addr{}, perr
			}
		}
		if last == nil || err.Error() != last.Error() {
			b.opts.Log.Debug("waiting for machine", "node", m.Hostname, "reason", err)
		}
		last = err
		select {
		case <-ctx.Done():
			return netip.Addr{}, fmt.Errorf("not found within %s: %w (%s)", b.opts.Timeout, last, pw.hint())
		case <-time.After(b.opts.Poll):
		}
	}
}

// errNotSeen: the netboot server has not seen the machine.
var errNotSeen = errors.New("not seen by the netboot server yet")

// lookup finds the machine's address in the inventory, by MAC or UUID,
// and reports machines that are not in the rack, once each.
func (b *run) lookup(m *rack.Machine) (netip.Addr, error) {
	list, err := b.opts.Inventory()
	if err != nil {
		return netip.Addr{}, fmt.Errorf("read the netboot inventory: %w", err)
	}
	for _, im := range list {
		if !b.inRack(im) {
			if _, seen := b.warned.LoadOrStore(im.MAC, true); !seen {
				b.opts.Log.Warn("a machine that is not in the rack netbooted; leaving it alone", "mac", im.MAC, "uuid", im.UUID, "ip", im.IP)
				b.emitCluster("unknown", fmt.Sprintf("unknown machine %s (uuid %s) at %s: not in the rack, not touched", im.MAC, im.UUID, im.IP))
			}
			continue
		}
		if (m.MAC != "" && im.MAC == m.MAC) || (m.UUID != "" && im.UUID == m.UUID) {
			if !im.IP.IsValid() {
				return netip.Addr{}, errors.New("netbooted, but its address is not known yet")
			}
			return im.IP, nil
		}
	}
	return netip.Addr{}, errNotSeen
}

func (b *run) inRack(im inventory.Machine) bool {
	for _, m := range b.opts.Rack.Machines {
		if (m.MAC != "" && im.MAC == m.MAC) || (m.UUID != "" && im.UUID == m.UUID) {
			return true
		}
	}
	return false
}

// confirm checks, through the maintenance API, that the machine at ip is
// in maintenance mode and is the one the rack describes.
func (b *run) confirm(ctx context.Context, m *rack.Machine, ip netip.Addr) error {
	c, err := talosapi.Maintenance(ctx, b.endpoint(ip))
	if err != nil {
		return err
	}
	defer c.Close()
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	f, err := talosapi.ReadFacts(cctx, c)
	if err != nil {
		return fmt.Errorf("the Talos API at %s: %w", ip, err)
	}
	if m.UUID != "" && f.UUID != "" && !strings.EqualFold(f.UUID, m.UUID) {
		return fmt.Errorf("the machine at %s has UUID %s, not the rack's %s", ip, f.UUID, m.UUID)
	}
	if m.MAC != "" && !hasMAC(f.Links, m.MAC) {
		return fmt.Errorf("the machine at %s has no link with MAC %s", ip, m.MAC)
	}
	return nil
}

// apply sends the machine its config, after checking its install disk.
func (b *run) apply(ctx context.Context, m *rack.Machine, ip netip.Addr) error {
	config, err := os.ReadFile(b.configs[m.Hostname])
	if err != nil {
		return err
	}
	c, err := talosapi.Maintenance(ctx, b.endpoint(ip))
	if err != nil {
		return err
	}
	defer c.Close()
	cctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	disk, err := talosapi.InstallDisk(cctx, c, config)
	if err != nil {
		return b.fail(m, fmt.Errorf("install disk: %w", err))
	}
	facts, err := talosapi.ReadFacts(cctx, c)
	if err != nil {
		return err
	}
	if err := checkLinks(m, facts.Links); err != nil {
		return b.fail(m, err)
	}
	if err := talosapi.Apply(cctx, c, config); err != nil {
		return b.fail(m, fmt.Errorf("apply config: %w", err))
	}
	b.opts.Log.Info("config applied", "node", m.Hostname, "disk", disk)
	return b.advance(m, state.Applied, ip)
}

// checkLinks makes sure every link the rack names exists on the machine,
// so a config never leaves a node without its network.
func checkLinks(m *rack.Machine, links []talosapi.Link) error {
	names := map[string]bool{}
	var have []string
	for _, l := range links {
		names[l.Name] = true
		have = append(have, l.Name+" ("+l.MAC+")")
	}
	var problems []string
	need := func(name string) {
		if !names[name] {
			problems = append(problems, fmt.Sprintf("link %s does not exist", name))
		}
	}
	for _, in := range m.Interfaces {
		switch {
		case in.Bond != nil:
			for _, l := range in.Bond.Links {
				need(l)
			}
			for _, mac := range in.Bond.MACs {
				if !hasMAC(links, mac) {
					problems = append(problems, "no link has MAC "+mac)
				}
			}
		case in.MAC != "":
			if !hasMAC(links, in.MAC) {
				problems = append(problems, "no link has MAC "+in.MAC)
			}
		default:
			need(in.Name)
		}
	}
	if len(problems) > 0 {
		return fmt.Errorf("%s; the machine has %s (select links by mac in the rack if names differ)", strings.Join(problems, ", "), strings.Join(have, ", "))
	}
	return nil
}

// fail records err on the node and returns it.
func (b *run) fail(m *rack.Machine, err error) error {
	_ = b.st.Update(func(s *state.State) { s.Nodes[m.Hostname].Error = err.Error() })
	b.emit(m.Hostname, err.Error())
	return err
}

// configured reports whether the node answers with mutual TLS, i.e. runs
// installed with this cluster's config.
func (b *run) configured(ctx context.Context, ip netip.Addr) bool {
	c, err := talosapi.Secure(ctx, b.tc, b.endpoint(ip))
	if err != nil {
		return false
	}
	defer c.Close()
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	_, err = c.Version(cctx)
	return err == nil
}

func (b *run) waitConfigured(ctx context.Context, m *rack.Machine, ip netip.Addr) error {
	err := b.poll(ctx, "come back installed", func() error {
		if b.configured(ctx, ip) {
			return nil
		}
		return errors.New("not answering with the cluster's talosconfig yet")
	})
	if err != nil {
		return b.fail(m, err)
	}
	return b.advance(m, state.Configured, ip)
}

// bootstrapEtcd bootstraps etcd on the first control plane, exactly once:
// the state file says whether it was done, and a node that already has
// etcd members (a run that died before recording it) is not asked again.
func (b *run) bootstrapEtcd(ctx context.Context, first *rack.Machine) error {
	if b.st.Snapshot().EtcdBootstrapped != "" {
		return nil
	}
	ip := b.st.Node(first.Hostname).IP
	c, err := b.secure(ctx, ip)
	if err != nil {
		return err
	}
	defer c.Close()
	members, err := talosapi.EtcdMembers(ctx, c)
	if err != nil {
		return fmt.Errorf("%s: etcd members: %w", first.Hostname, err)
	}
	if len(members) == 0 {
		err := talosapi.Bootstrap(ctx, c)
		if err != nil && !errors.Is(err, talosapi.ErrAlreadyBootstrapped) {
			return b.fail(first, fmt.Errorf("bootstrap etcd: %w", err))
		}
	}
	if err := b.st.Update(func(s *state.State) { s.EtcdBootstrapped = first.Hostname }); err != nil {
		return err
	}
	if err := b.advance(first, state.Bootstrap, ip); err != nil {
		return err
	}
	return b.poll(ctx, "etcd to list its first member", func() error {
		members, err := talosapi.EtcdMembers(ctx, c)
		if err == nil && len(members) == 0 {
			err = errors.New("no members yet")
		}
		return err
	})
}

// waitEtcdMembers waits until every control plane is a voting etcd
// member: the others join by themselves once the cluster's API answers.
func (b *run) waitEtcdMembers(ctx context.Context, first *rack.Machine, cps []string) error {
	if len(cps) < 2 {
		return nil
	}
	c, err := b.secure(ctx, b.st.Node(first.Hostname).IP)
	if err != nil {
		return err
	}
	defer c.Close()
	last := -1
	return b.poll(ctx, "every control plane to join etcd", func() error {
		members, err := talosapi.EtcdMembers(ctx, c)
		if err != nil {
			return err
		}
		missing := talosapi.Missing(members, cps)
		if len(missing) != last {
			last = len(missing)
			b.emitCluster(state.Bootstrap, fmt.Sprintf("etcd has %d of %d control planes", len(cps)-len(missing), len(cps)))
		}
		if len(missing) > 0 {
			return fmt.Errorf("not etcd members yet: %s", strings.Join(missing, ", "))
		}
		return nil
	})
}

// kubeconfig fetches the admin kubeconfig from the control plane, writes
// it (0600) and waits until the cluster's API answers /version with it.
func (b *run) kubeconfig(ctx context.Context, cp *rack.Machine) (string, error) {
	c, err := b.secure(ctx, b.st.Node(cp.Hostname).IP)
	if err != nil {
		return "", err
	}
	defer c.Close()
	var data []byte
	if err := b.poll(ctx, "the kubeconfig", func() error {
		var err error
		data, err = c.Kubeconfig(ctx)
		return err
	}); err != nil {
		return "", err
	}
	path := filepath.Join(b.opts.StateDir, KubeconfigFile)
	if err := talosconfig.WriteFile(path, data); err != nil {
		return "", err
	}
	rc, err := clientcmd.RESTConfigFromKubeConfig(data)
	if err != nil {
		return "", fmt.Errorf("kubeconfig from %s: %w", cp.Hostname, err)
	}
	rc.Timeout = 10 * time.Second
	dc, err := discovery.NewDiscoveryClientForConfig(rc)
	if err != nil {
		return "", err
	}
	err = b.poll(ctx, "the Kubernetes API at "+rc.Host, func() error {
		_, err := dc.ServerVersion()
		return err
	})
	return path, err
}

func (b *run) secure(ctx context.Context, ip netip.Addr) (*client.Client, error) {
	return talosapi.Secure(ctx, b.tc, b.endpoint(ip))
}

func (b *run) endpoint(ip netip.Addr) string { return talosapi.Endpoint(ip, b.opts.TalosPort) }

// poll calls f until it succeeds, ctx ends or the timeout passes. It
// retries quickly at first (a node that reboots in seconds is seen at
// once), then every Poll.
func (b *run) poll(ctx context.Context, what string, f func() error) error {
	ctx, cancel := context.WithTimeout(ctx, b.opts.Timeout)
	defer cancel()
	wait := min(100*time.Millisecond, b.opts.Poll)
	for {
		err := f()
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waited %s for %s: %w", b.opts.Timeout, what, err)
		case <-time.After(wait):
		}
		wait = min(wait*2, b.opts.Poll)
	}
}

func hasMAC(links []talosapi.Link, mac string) bool {
	for _, l := range links {
		if strings.EqualFold(l.MAC, mac) {
			return true
		}
	}
	return false
}
