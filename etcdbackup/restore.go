package etcdbackup

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/siderolabs/talos/pkg/machinery/api/machine"
	clientconfig "github.com/siderolabs/talos/pkg/machinery/client/config"
	"github.com/siderolabs/talos/pkg/machinery/constants"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/tools/clientcmd"

	"cozy.dev/cozy/bootstrap"
	"cozy.dev/cozy/bootstrap/state"
	"cozy.dev/cozy/bootstrap/talosapi"
	"cozy.dev/cozy/internal/wait"
)

// RestoreOptions of one restore.
type RestoreOptions struct {
	Options
	// From is the snapshot file (Save's, or talosctl etcd snapshot's).
	From string
	// WipeEtcd first resets the control planes whose etcd runs, wiping
	// their EPHEMERAL volume (etcd's data; the config on STATE stays).
	// Without it a running etcd refuses the restore.
	WipeEtcd bool
	// Node is the control plane etcd is restored on (default: the first
	// in the rack); the others join it.
	Node string
	// Lost are control planes gone for good (a dead disk, a machine
	// removed): not asked, not wiped, not waited for. Every other control
	// plane must answer. One named here must not come back with its old
	// disk: its etcd would still hold the cluster from before the restore
	// (wipe it first: cozyctl node reset, or a Talos reset).
	Lost []string
	// Timeout bounds each wait: a node back after its reset, every control
	// plane a member again, the Kubernetes API answering (default 10m).
	Timeout time.Duration
	// DryRun makes every check and returns the plan (the node, what would
	// be wiped), changing nothing.
	DryRun bool
}

// Restored is what a restore did.
type Restored struct {
	// Node is the control plane etcd was restored on.
	Node string `json:"node"`
	// Wiped are the control planes reset before the restore.
	Wiped []string `json:"wiped,omitempty"`
	// Lost are the control planes left out, as RestoreOptions.Lost.
	Lost []string `json:"lost,omitempty"`
	// Members are etcd's voting members once every control plane joined.
	Members []string      `json:"members"`
	Took    time.Duration `json:"took"`
	// Status is the snapshot's, as etcd's snapshot package read it.
	Status Status `json:"snapshot"`
	DryRun bool   `json:"dryRun,omitempty"`
}

// ErrEtcdRunning is what Restore returns, before it has changed
// anything, when etcd runs on a control plane and WipeEtcd is not set.
var ErrEtcdRunning = errors.New("etcd is running")

// Restore replaces the rack's etcd with a snapshot, Talos's disaster
// recovery: the snapshot is checked first, every control plane must
// answer, and nothing is wiped unless WipeEtcd says so; then the snapshot
// is uploaded to one control plane (EtcdRecover), etcd is bootstrapped
// there from it (Bootstrap with RecoverEtcd), and the restore waits for
// the other control planes to join and for the Kubernetes API. A restore
// cut short is run again: nodes already wiped are not wiped again.
func Restore(ctx context.Context, o RestoreOptions) (Restored, error) {
	o.Options = o.withDefaults()
	if o.Timeout == 0 {
		o.Timeout = 10 * time.Minute
	}
	start := time.Now()
	res := Restored{}
	st, err := Check(o.From)
	if err != nil {
		return res, err
	}
	res.Status = st
	cps, err := controlPlanes(o.Options)
	if err != nil {
		return res, err
	}
	target := cps[0]
	if o.Node != "" {
		var ok bool
		if target, ok = byName(cps, o.Node); !ok {
			return res, fmt.Errorf("%s is not a control plane of the rack (its control planes: %s)", o.Node, strings.Join(names(cps), ", "))
		}
	}
	res.Node = target.name
	present, err := withoutLost(cps, o.Lost, target)
	if err != nil {
		return res, err
	}
	res.Lost = o.Lost
	tc, err := talosconfig(o.Options)
	if err != nil {
		return res, err
	}
	live, err := runningEtcd(ctx, tc, present)
	if err != nil {
		return res, err
	}
	if len(live) > 0 {
		if !o.WipeEtcd {
			return res, fmt.Errorf("%w on %s: a restore replaces the cluster's data with the snapshot's (revision %d); run again with --wipe-etcd to wipe their etcd data first",
				ErrEtcdRunning, strings.Join(names(live), ", "), st.Revision)
		}
		res.Wiped = names(live)
	}
	if o.DryRun {
		res.DryRun = true
		res.Members = names(present)
		return res, nil
	}
	if len(live) > 0 {
		if err := wipeEtcd(ctx, o, tc, live); err != nil {
			return res, err
		}
	}
	if err := recoverOn(ctx, o, tc, target); err != nil {
		return res, err
	}
	if err := recordBootstrap(o.Options, target.name); err != nil {
		return res, err
	}
	res.Members, err = waitMembers(ctx, o, tc, target, names(present))
	if err != nil {
		return res, err
	}
	if err := waitAPI(ctx, o); err != nil {
		return res, err
	}
	res.Took = time.Since(start).Round(time.Millisecond)
	o.Log.Info("etcd restored", "node", target.name, "members", res.Members, "revision", st.Revision)
	return res, nil
}

// withoutLost is cps without the lost ones, each of which must be a
// control plane of the rack other than the restore's target.
func withoutLost(cps []controlPlane, lost []string, target controlPlane) ([]controlPlane, error) {
	for _, name := range lost {
		if _, ok := byName(cps, name); !ok {
			return nil, fmt.Errorf("--lost %s: not a control plane of the rack (its control planes: %s)", name, strings.Join(names(cps), ", "))
		}
		if name == target.name {
			return nil, fmt.Errorf("--lost %s: the restore is to run on it; name another control plane with --node", name)
		}
	}
	return slices.DeleteFunc(slices.Clone(cps), func(cp controlPlane) bool { return slices.Contains(lost, cp.name) }), nil
}

// runningEtcd asks every control plane whether its etcd service runs;
// each must answer, so that no etcd is left running unseen beside the
// restored one.
func runningEtcd(ctx context.Context, tc *clientconfig.Config, cps []controlPlane) ([]controlPlane, error) {
	var live []controlPlane
	for _, cp := range cps {
		state, err := etcdService(ctx, tc, cp)
		if err != nil {
			return nil, fmt.Errorf("%w (every control plane must answer before a restore; name one that is gone for good with --lost %s)", err, cp.name)
		}
		if state != etcdPreparing {
			live = append(live, cp)
		}
	}
	return live, nil
}

// etcdPreparing is the state of Talos's etcd service while it waits for a
// bootstrap or a cluster to join: no data, nothing running.
const etcdPreparing = "Preparing"

// etcdService is the state of cp's etcd service, as the node answers it
// (ServiceList): an error is never taken for a stopped etcd.
func etcdService(ctx context.Context, tc *clientconfig.Config, cp controlPlane) (string, error) {
	cctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	c, err := connect(cctx, tc, cp)
	if err != nil {
		return "", err
	}
	defer c.Close()
	resp, err := c.ServiceList(cctx)
	if err != nil {
		return "", fmt.Errorf("%s: service list: %w", cp.name, err)
	}
	for _, m := range resp.GetMessages() {
		for _, s := range m.GetServices() {
			if s.GetId() == "etcd" {
				return s.GetState(), nil
			}
		}
	}
	return "", fmt.Errorf("%s: no etcd service: is it a control plane?", cp.name)
}

// etcdMembers are the voting members cp's etcd lists.
func etcdMembers(ctx context.Context, tc *clientconfig.Config, cp controlPlane) ([]string, error) {
	cctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	c, err := connect(cctx, tc, cp)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	members, err := talosapi.EtcdMembers(cctx, c)
	if err != nil {
		return nil, fmt.Errorf("%s: etcd members: %w", cp.name, err)
	}
	return members, nil
}

// wipeEtcd resets the control planes' EPHEMERAL volume (not gracefully:
// the cluster is being replaced, nobody is to leave it) and waits for
// each to be back with its etcd stopped, as Talos's recovery guide does
// with `talosctl reset --graceful=false --reboot
// --system-labels-to-wipe=EPHEMERAL`.
func wipeEtcd(ctx context.Context, o RestoreOptions, tc *clientconfig.Config, cps []controlPlane) error {
	errs := make([]error, len(cps))
	var wg sync.WaitGroup
	for i, cp := range cps {
		wg.Go(func() {
			errs[i] = wipeOne(ctx, o, tc, cp)
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

func wipeOne(ctx context.Context, o RestoreOptions, tc *clientconfig.Config, cp controlPlane) error {
	o.Log.Info("wiping etcd's data: reset of the EPHEMERAL volume", "node", cp.name)
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	c, err := connect(cctx, tc, cp)
	if err == nil {
		err = c.ResetGeneric(cctx, &machine.ResetRequest{
			Graceful: false,
			Reboot:   true,
			SystemPartitionsToWipe: []*machine.ResetPartitionSpec{
				{Label: constants.EphemeralPartitionLabel, Wipe: true},
			},
		})
		c.Close()
	}
	cancel()
	if err != nil {
		return fmt.Errorf("%s: reset of EPHEMERAL: %w", cp.name, err)
	}
	// Until it reboots the node's etcd still runs (or stops); while it
	// reboots it does not answer; back, etcd waits for the restore.
	return wait.For(ctx, o.Timeout, cp.name+": back after the reset with etcd waiting", func() error {
		state, err := etcdService(ctx, tc, cp)
		if err == nil && state != etcdPreparing {
			return fmt.Errorf("its etcd service is %s", state)
		}
		return err
	})
}

// recoverOn uploads the snapshot to cp and bootstraps etcd there from it.
func recoverOn(ctx context.Context, o RestoreOptions, tc *clientconfig.Config, cp controlPlane) error {
	f, err := os.Open(o.From)
	if err != nil {
		return err
	}
	defer f.Close()
	cctx, cancel := context.WithTimeout(ctx, o.Timeout)
	defer cancel()
	c, err := connect(cctx, tc, cp)
	if err != nil {
		return err
	}
	defer c.Close()
	o.Log.Info("uploading the snapshot", "node", cp.name)
	if _, err := c.EtcdRecover(cctx, f); err != nil {
		return fmt.Errorf("%s: upload of the snapshot (EtcdRecover): %w", cp.name, err)
	}
	o.Log.Info("bootstrapping etcd from the snapshot", "node", cp.name)
	if err := c.Bootstrap(cctx, &machine.BootstrapRequest{RecoverEtcd: true}); err != nil {
		return fmt.Errorf("%s: bootstrap from the snapshot: %w", cp.name, err)
	}
	return nil
}

// recordBootstrap notes in the bootstrap's state which node etcd now
// started on.
func recordBootstrap(o Options, node string) error {
	st, err := state.Open(o.StateDir, o.Rack.Metadata.Name)
	if err != nil {
		return err
	}
	return st.Update(func(s *state.State) { s.EtcdBootstrapped = node })
}

// waitMembers waits until every control plane is a voting member of the
// restored etcd.
func waitMembers(ctx context.Context, o RestoreOptions, tc *clientconfig.Config, target controlPlane, want []string) ([]string, error) {
	var members []string
	err := wait.For(ctx, o.Timeout, "every control plane back in etcd", func() error {
		var err error
		members, err = etcdMembers(ctx, tc, target)
		if err != nil {
			return err
		}
		if missing := talosapi.Missing(members, want); len(missing) > 0 {
			return fmt.Errorf("not yet members: %s", strings.Join(missing, ", "))
		}
		return nil
	})
	slices.Sort(members)
	return members, err
}

// waitAPI waits for the Kubernetes API, through the bootstrap's
// kubeconfig, to answer /version.
func waitAPI(ctx context.Context, o RestoreOptions) error {
	rc, err := clientcmd.BuildConfigFromFlags("", filepath.Join(o.StateDir, bootstrap.KubeconfigFile))
	if err != nil {
		return err
	}
	rc.Timeout = 10 * time.Second
	dc, err := discovery.NewDiscoveryClientForConfig(rc)
	if err != nil {
		return err
	}
	return wait.For(ctx, o.Timeout, "the Kubernetes API at "+rc.Host, func() error {
		_, err := dc.ServerVersion()
		return err
	})
}
