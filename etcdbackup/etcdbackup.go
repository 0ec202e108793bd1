// Package etcdbackup backs up and restores a rack's etcd through the
// Talos API, as `talosctl etcd snapshot` and `talosctl bootstrap
// --recover-from` do: a snapshot streamed from a control plane's etcd,
// checked with etcd's own snapshot package before it is kept, and a
// restore that uploads it to one control plane and bootstraps etcd from
// it there, the other control planes joining as after a bootstrap.
//
// A snapshot holds every Secret of the cluster: it is written 0600 and
// never logged.
package etcdbackup

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"path/filepath"
	"slices"
	"time"

	"github.com/siderolabs/talos/pkg/machinery/api/machine"
	"github.com/siderolabs/talos/pkg/machinery/client"
	clientconfig "github.com/siderolabs/talos/pkg/machinery/client/config"
	"go.etcd.io/etcd/etcdutl/v3/snapshot"
	"go.uber.org/zap"

	"cozy.dev/cozy/bootstrap"
	"cozy.dev/cozy/bootstrap/rack"
	"cozy.dev/cozy/bootstrap/state"
	"cozy.dev/cozy/bootstrap/talosapi"
	"cozy.dev/cozy/internal/atomicfile"
	"cozy.dev/cozy/internal/etcdsnapshot"
)

// Options name the rack and the bootstrap's state dir, which holds the
// talosconfig and the nodes' addresses.
type Options struct {
	Rack     *rack.Rack
	StateDir string
	// TalosPort is the nodes' Talos API port (default 50000).
	TalosPort int
	Log       *slog.Logger
}

func (o Options) withDefaults() Options {
	if o.TalosPort == 0 {
		o.TalosPort = talosapi.Port
	}
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	return o
}

// Status is what etcd's snapshot status reads from a snapshot file
// (Check verifies the file's appended sha256 before that).
type Status struct {
	Hash      uint32 `json:"hash"`
	Revision  int64  `json:"revision"`
	TotalKeys int    `json:"totalKeys"`
	TotalSize int64  `json:"totalSize"`
	// Version is the etcd storage version the snapshot was taken with.
	Version string `json:"version,omitempty"`
}

// Check verifies the sha256 etcd appends to a snapshot (etcd's status
// does not; its restore does, on the node, after the wipe), then reads
// the snapshot with etcd's own snapshot status.
func Check(path string) (Status, error) {
	if err := etcdsnapshot.VerifyHash(path); err != nil {
		return Status{}, fmt.Errorf("%s is not a usable etcd snapshot: %w", path, err)
	}
	st, err := snapshot.NewV3(zap.NewNop()).Status(path)
	if err != nil {
		return Status{}, fmt.Errorf("%s is not a usable etcd snapshot: %w", path, err)
	}
	return Status{Hash: st.Hash, Revision: st.Revision, TotalKeys: st.TotalKey, TotalSize: st.TotalSize, Version: st.Version}, nil
}

// controlPlane is a control plane of the rack and its Talos API.
type controlPlane struct {
	name     string
	endpoint string
}

// controlPlanes lists the rack's control planes, in rack order, with the
// addresses the bootstrap recorded for them.
func controlPlanes(o Options) ([]controlPlane, error) {
	st, err := state.Read(o.StateDir)
	if err != nil {
		return nil, err
	}
	var out []controlPlane
	for _, m := range o.Rack.Machines {
		if m.Role != rack.RoleControlPlane {
			continue
		}
		var ip netip.Addr
		if n := st.Nodes[m.Hostname]; n != nil {
			ip = n.IP
		}
		if !ip.IsValid() {
			return nil, fmt.Errorf("%s: the bootstrap in %s has no address for this control plane: bootstrap the rack first", m.Hostname, o.StateDir)
		}
		out = append(out, controlPlane{name: m.Hostname, endpoint: talosapi.Endpoint(ip, o.TalosPort)})
	}
	if len(out) == 0 {
		return nil, errors.New("the rack has no control plane")
	}
	return out, nil
}

// talosconfig is the bootstrap's admin client config.
func talosconfig(o Options) (*clientconfig.Config, error) {
	return clientconfig.Open(filepath.Join(o.StateDir, bootstrap.TalosDir, "talosconfig"))
}

// connect opens the Talos API of cp.
func connect(ctx context.Context, tc *clientconfig.Config, cp controlPlane) (*client.Client, error) {
	c, err := talosapi.Secure(ctx, tc, cp.endpoint)
	if err != nil {
		return nil, fmt.Errorf("%s: the Talos API at %s: %w", cp.name, cp.endpoint, err)
	}
	return c, nil
}

// Saved is a snapshot written by Save.
type Saved struct {
	File string `json:"file"`
	// Node is the control plane whose etcd it was taken from.
	Node string        `json:"node"`
	Took time.Duration `json:"took"`
	Status
}

// Save takes a snapshot of the rack's etcd from the first control plane
// that gives one and writes it to out (0600). The file appears only once
// etcd's snapshot status has checked the whole download: an interrupted
// or corrupt download leaves out as it was.
func Save(ctx context.Context, o Options, out string) (Saved, error) {
	o = o.withDefaults()
	start := time.Now()
	cps, err := controlPlanes(o)
	if err != nil {
		return Saved{}, err
	}
	tc, err := talosconfig(o)
	if err != nil {
		return Saved{}, err
	}
	var errs []error
	for _, cp := range cps {
		st, err := saveFrom(ctx, tc, cp, out)
		if err == nil {
			o.Log.Info("etcd snapshot saved", "node", cp.name, "file", out, "revision", st.Revision)
			return Saved{File: out, Node: cp.name, Took: time.Since(start).Round(time.Millisecond), Status: st}, nil
		}
		o.Log.Info("no etcd snapshot from this control plane; trying the next", "node", cp.name, "err", err)
		errs = append(errs, err)
		if ctx.Err() != nil {
			break
		}
	}
	return Saved{}, fmt.Errorf("no control plane gave an etcd snapshot: %w", errors.Join(errs...))
}

func saveFrom(ctx context.Context, tc *clientconfig.Config, cp controlPlane, out string) (Status, error) {
	c, err := connect(ctx, tc, cp)
	if err != nil {
		return Status{}, err
	}
	defer c.Close()
	rd, err := c.EtcdSnapshot(ctx, &machine.EtcdSnapshotRequest{})
	if err != nil {
		return Status{}, fmt.Errorf("%s: etcd snapshot: %w", cp.name, err)
	}
	defer rd.Close()
	f, err := atomicfile.NewReplacement(out, 0o600)
	if err != nil {
		return Status{}, err
	}
	defer f.Abort()
	if _, err := io.Copy(f, rd); err != nil {
		return Status{}, fmt.Errorf("%s: etcd snapshot: %w", cp.name, err)
	}
	if err := f.Sync(); err != nil {
		return Status{}, fmt.Errorf("write %s: %w", out, err)
	}
	st, err := Check(f.Name())
	if err != nil {
		return Status{}, fmt.Errorf("%s: the snapshot it sent: %w", cp.name, err)
	}
	if err := f.Commit(); err != nil {
		return Status{}, err
	}
	return st, nil
}

// names lists the control planes' names.
func names(cps []controlPlane) []string {
	out := make([]string, len(cps))
	for i, cp := range cps {
		out[i] = cp.name
	}
	return out
}

// byName finds a control plane.
func byName(cps []controlPlane, name string) (controlPlane, bool) {
	i := slices.IndexFunc(cps, func(cp controlPlane) bool { return cp.name == name })
	if i < 0 {
		return controlPlane{}, false
	}
	return cps[i], true
}
