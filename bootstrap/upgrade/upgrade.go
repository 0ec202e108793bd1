// Package upgrade moves a bootstrapped rack to the Talos version its rack
// file names, one node at a time, control planes first (the one holding
// the VIP last of them, so that the VIP moves once), as Talos's
// `talosctl upgrade` does node by node: Talos's Upgrade API with the
// rack's installer image, gated on etcd (every member healthy before a
// node goes, and again once it is back) and on the node coming back on
// the new version and Ready in Kubernetes.
//
// It keeps no state of its own: what each node runs says what is left.
// Run again after a failure or a kill, it skips the nodes on the new
// version, waits for a node still upgrading or rebooting, and asks again
// only a node that runs the old version and is not upgrading, so no node
// is upgraded twice.
package upgrade

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"

	"github.com/siderolabs/talos/pkg/machinery/client"
	"github.com/siderolabs/talos/pkg/machinery/resources/runtime"
	"golang.org/x/mod/semver"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"cozy.dev/cozy/bootstrap/rack"
	"cozy.dev/cozy/bootstrap/rackapi"
	"cozy.dev/cozy/internal/wait"
)

// answerWait bounds the wait for a node to answer before the upgrade
// starts: long enough for a reboot.
const answerWait = 5 * time.Minute

// Options of one Talos upgrade.
type Options struct {
	Rack *rackapi.Rack
	// Version, if set, must be the rack's talos.version: the rack file is
	// what the rack runs, and what new machines install.
	Version string
	// DryRun only reads the nodes and returns the plan.
	DryRun bool
	// Timeout bounds the wait for each node (default 15m).
	Timeout time.Duration
	Log     *slog.Logger
}

// Step is one node's part of an upgrade.
type Step struct {
	Node string `json:"node"`
	Role string `json:"role"`
	From string `json:"from,omitempty"`
	To   string `json:"to"`
	// Result is "upgraded", "already on the version", "waited: it was
	// upgrading", or, in a dry run, "to upgrade".
	Result string        `json:"result"`
	Took   time.Duration `json:"took,omitempty"`
}

// Result is a whole upgrade.
type Result struct {
	Version string        `json:"version"`
	Image   string        `json:"image"`
	DryRun  bool          `json:"dryRun,omitempty"`
	Nodes   []Step        `json:"nodes"`
	Took    time.Duration `json:"took"`
}

// Talos upgrades every node that does not run the rack's Talos version,
// control planes first (in rack order, the VIP's holder last), then
// workers. It stops at the first node that fails, with the node and the
// reason.
func Talos(ctx context.Context, o Options) (Result, error) {
	start := time.Now()
	if o.Timeout == 0 {
		o.Timeout = 15 * time.Minute
	}
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	r := o.Rack.Rack
	target := r.Talos.Version
	if o.Version != "" && o.Version != target {
		return Result{}, fmt.Errorf("--version %s: the rack file says talos.version %s; set it to %s there first (the rack is what the rack runs, and what new machines install)",
			o.Version, target, o.Version)
	}
	image, err := r.InstallImage()
	if err != nil {
		return Result{}, err
	}
	res := Result{Version: target, Image: image, DryRun: o.DryRun}
	// Every node is read before any is touched: a downgrade or a jump
	// refuses the whole upgrade, and a node that does not answer stops it
	// before it starts. (One rebooting after a run cut short is back
	// within the wait.)
	for _, name := range order(r, vipHolder(ctx, o.Rack, o.Log)) {
		m, _ := o.Rack.Machine(name)
		var ms rackapi.MachineState
		err := wait.For(ctx, min(o.Timeout, answerWait), name+" answering", func() error {
			var err error
			ms, err = o.Rack.MachineState(ctx, name)
			return err
		})
		if err != nil {
			return res, fmt.Errorf("%s does not answer (%w): every node must, before an upgrade starts", name, err)
		}
		if err := checkStep("Talos", ms.Version, target); err != nil {
			return res, fmt.Errorf("%s: %w", name, err)
		}
		step := Step{Node: name, Role: m.Role, From: ms.Version, To: target, Result: "to upgrade"}
		if ms.Version == target {
			step.Result = "already on the version"
		}
		res.Nodes = append(res.Nodes, step)
	}
	if o.DryRun {
		return res, nil
	}
	for i := range res.Nodes {
		s := &res.Nodes[i]
		if s.Result != "to upgrade" {
			continue
		}
		t := time.Now()
		how, err := upgradeNode(ctx, o, s.Node, image, target)
		s.Took = time.Since(t).Round(100 * time.Millisecond)
		if err != nil {
			s.Result = "failed"
			return res, fmt.Errorf("%s: %w (the nodes before it are upgraded; run again to go on)", s.Node, err)
		}
		s.Result = how
	}
	res.Took = time.Since(start).Round(100 * time.Millisecond)
	return res, nil
}

// order is the rack's control planes, then its workers, each in rack
// order, except that the control plane holding the VIP (holder, "" if
// none is known) goes last of the control planes. A control plane
// that goes lets the VIP go if it holds it, and clients lose what they
// send while it moves (Talos removes the address from the old holder
// before the next one announces it, and a TCP connection attempt lost
// then is retried after a second). In rack order the VIP could move once
// per control plane; with its holder last, it moves once.
func order(r *rack.Rack, holder string) []string {
	var cps, last, workers []string
	for _, m := range r.Machines {
		switch {
		case m.Role != rack.RoleControlPlane:
			workers = append(workers, m.Hostname)
		case m.Hostname == holder:
			last = append(last, m.Hostname)
		default:
			cps = append(cps, m.Hostname)
		}
	}
	return slices.Concat(cps, last, workers)
}

// vipHolder is the control plane that holds the rack's VIP, "" if none
// answers that it does; the upgrade goes on without knowing.
func vipHolder(ctx context.Context, r *rackapi.Rack, log *slog.Logger) string {
	holder, err := r.VIPHolder(ctx)
	switch {
	case err != nil:
		log.Warn("cannot tell which control plane holds the VIP; control planes go in rack order", "err", err)
	case holder != "":
		log.Info("the VIP's holder goes last of the control planes, so that the VIP moves once", "node", holder, "vip", r.Rack.Cluster.VIP)
	}
	return holder
}

// checkStep refuses what Cozy does not do: a downgrade, a version that
// is not one, and a jump of more than one minor version. kind names the
// versions ("Talos", "Kubernetes").
func checkStep(kind, from, to string) error {
	if !semver.IsValid(to) {
		return fmt.Errorf("%q is not a %s version", to, kind)
	}
	if !semver.IsValid(from) {
		return fmt.Errorf("it runs %s version %q, which Cozy cannot compare with %s", kind, from, to)
	}
	if semver.Compare(from, to) > 0 {
		return fmt.Errorf("it runs %s, newer than %s: Cozy does not downgrade", from, to)
	}
	if minor(to)-minor(from) > 1 || semver.Major(to) != semver.Major(from) {
		return fmt.Errorf("%s to %s skips a minor version: upgrade one minor at a time (%s first)", from, to, nextMinor(from))
	}
	return nil
}

func minor(v string) int {
	var major, min int
	_, _ = fmt.Sscanf(semver.MajorMinor(v), "v%d.%d", &major, &min)
	return min
}

func nextMinor(v string) string {
	return fmt.Sprintf("%s.%d", semver.Major(v), minor(v)+1)
}

// upgradeNode gates, asks and waits: etcd healthy with every member, the
// Upgrade (unless the node is upgrading already), the node back on the
// version, its Node Ready, and etcd healthy with every member again.
func upgradeNode(ctx context.Context, o Options, name, image, target string) (string, error) {
	// Waited for, not just checked: after a run cut short, the node
	// before may still be rejoining.
	var before []string
	if err := wait.For(ctx, o.Timeout, "etcd healthy with every member", func() error {
		var err error
		before, err = etcdWhole(ctx, o.Rack)
		return err
	}); err != nil {
		return "", fmt.Errorf("before its upgrade: %w", err)
	}
	how := "upgraded"
	ms, err := o.Rack.MachineState(ctx, name)
	switch {
	case err != nil || ms.Stage != runtime.MachineStageRunning:
		// A run cut short asked it already: it is on its way.
		how = "waited: it was upgrading"
		o.Log.Info("not running: waiting for it instead of asking again", "node", name, "stage", ms.Stage.String(), "err", err)
	case ms.Version == target:
		return "already on the version", nil
	default:
		o.Log.Info("upgrading", "node", name, "from", ms.Version, "to", target)
		if err := request(ctx, o.Rack, name, image); err != nil {
			return "", err
		}
	}
	if err := wait.For(ctx, o.Timeout, "back on "+target, func() error {
		ms, err := o.Rack.MachineState(ctx, name)
		switch {
		case err != nil:
			return err
		case ms.Version != target:
			return fmt.Errorf("it runs %s (%s)", ms.Version, ms.Stage)
		case ms.Stage != runtime.MachineStageRunning:
			return fmt.Errorf("stage %s", ms.Stage)
		}
		return nil
	}); err != nil {
		return "", err
	}
	if err := waitReady(ctx, o, name); err != nil {
		return "", err
	}
	if err := wait.For(ctx, o.Timeout, "etcd healthy with every member again", func() error {
		after, err := etcdWhole(ctx, o.Rack)
		if err == nil && !slices.Equal(after, before) {
			err = fmt.Errorf("members %s, before %s", strings.Join(after, ","), strings.Join(before, ","))
		}
		return err
	}); err != nil {
		return "", err
	}
	o.Log.Info("upgraded", "node", name, "version", target)
	return how, nil
}

func request(ctx context.Context, r *rackapi.Rack, name, image string) error {
	return r.Call(ctx, name, time.Minute, func(ctx context.Context, c *client.Client) error {
		// Talos's MachineService.Upgrade: deprecated since Talos 1.13 for
		// LifecycleService (install, then a Reboot), removed in 1.18; the
		// emulated node serves this one. Moving over is still to do.
		//lint:ignore SA1019 the emulated node and Talos up to 1.17 serve it
		if _, err := c.Upgrade(ctx, image, false, false); err != nil {
			return fmt.Errorf("upgrade to %s: %w", image, err)
		}
		return nil
	})
}

// etcdWhole is etcd's voting members, once every member is healthy and
// none is a learner; an error otherwise (none for a rack without control
// planes).
func etcdWhole(ctx context.Context, r *rackapi.Rack) ([]string, error) {
	if len(r.ControlPlanes()) == 0 {
		return nil, nil
	}
	etcd, err := r.Etcd(ctx)
	if err != nil {
		return nil, err
	}
	voters, healthy := etcd.Voters(), etcd.Healthy()
	if len(voters) != len(etcd) || !slices.Equal(voters, healthy) {
		return nil, fmt.Errorf("etcd is not whole: %d members (%s), %d voting, %d healthy (%s)",
			len(etcd), strings.Join(names(etcd), ","), len(voters), len(healthy), strings.Join(healthy, ","))
	}
	return voters, nil
}

func names(e rackapi.Etcd) []string {
	var out []string
	for _, m := range e {
		out = append(out, m.Name)
	}
	slices.Sort(out)
	return out
}

// waitReady waits for the node's Node to be Ready, if Kubernetes has one
// (a node without a kubelet, as in the process tier, has none).
func waitReady(ctx context.Context, o Options, name string) error {
	kc, err := o.Rack.Kube()
	if err != nil {
		return err
	}
	return wait.For(ctx, o.Timeout, "its Node Ready", func() error {
		n, err := kc.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		if err != nil {
			return err
		}
		for _, c := range n.Status.Conditions {
			if c.Type == corev1.NodeReady && c.Status == corev1.ConditionTrue {
				return nil
			}
		}
		return errors.New("its Node is not Ready")
	})
}
