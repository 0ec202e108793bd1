package cli

import (
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"cozy.dev/cozy/bootstrap/rack"
	"cozy.dev/cozy/etcdbackup"
	"cozy.dev/cozy/internal/output"
)

func newEtcdCommand(g *Globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "etcd",
		Short: "Back up and restore the rack's etcd through the Talos API",
		Long: `Snapshot the rack's etcd, check a snapshot, and restore one (Talos's
disaster recovery). They use the bootstrap's state dir: its talosconfig
and the addresses it recorded. A snapshot holds every Secret of the
cluster: it is written 0600; keep it as safe as the state dir.`,
	}
	cmd.AddCommand(newEtcdSnapshotCommand(g), newEtcdBackupCommand(g), newEtcdCheckCommand(g), newEtcdRestoreCommand(g))
	return cmd
}

// rackFlags are --rack and --state-dir, as the bootstrap takes them.
type rackFlags struct {
	rackFile, stateDir string
}

func (f *rackFlags) register(cmd *cobra.Command) {
	cmd.Flags().StringVar(&f.rackFile, "rack", "", "the rack file (required)")
	cmd.Flags().StringVar(&f.stateDir, "state-dir", "", "the bootstrap's state dir (default: <rack dir>/<cluster name>)")
	_ = cmd.MarkFlagRequired("rack")
	_ = cmd.MarkFlagFilename("rack", "yaml", "yml")
	_ = cmd.MarkFlagDirname("state-dir")
}

// options loads the rack and fills in the state dir's default.
func (f *rackFlags) options(g *Globals) (etcdbackup.Options, error) {
	r, err := rack.Load(f.rackFile)
	if err != nil {
		return etcdbackup.Options{}, err
	}
	return etcdbackup.Options{Rack: r, StateDir: defaultStateDir(f.stateDir, f.rackFile, r), Log: g.Logger()}, nil
}

// defaultStateDir is the bootstrap's state dir: the one given, else
// <rack dir>/<cluster name>.
func defaultStateDir(dir, rackFile string, r *rack.Rack) string {
	if dir != "" {
		return dir
	}
	return filepath.Join(filepath.Dir(rackFile), r.Metadata.Name)
}

func newEtcdSnapshotCommand(g *Globals) *cobra.Command {
	var (
		f   rackFlags
		out string
	)
	cmd := &cobra.Command{
		Use:   "snapshot",
		Short: "Save a snapshot of the rack's etcd to a file",
		Long: `Stream a snapshot of etcd from the first control plane that gives one
(Talos's EtcdSnapshot) into --out, 0600. The file appears only once the
whole download has passed the check (the sha256 etcd appends, then etcd's
own snapshot status: its hash, revision and key count are printed); a
failed or corrupt download leaves --out as it was.`,
		Example: "  cozyctl etcd snapshot --rack rack.yaml --out backups/etcd-$(date +%F).db",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			o, err := f.options(g)
			if err != nil {
				return err
			}
			saved, err := etcdbackup.Save(cmd.Context(), o, out)
			if err != nil {
				return err
			}
			return g.Print(savedTable(saved))
		},
	}
	f.register(cmd)
	cmd.Flags().StringVar(&out, "out", "", "the snapshot file to write (required)")
	_ = cmd.MarkFlagRequired("out")
	return cmd
}

func newEtcdBackupCommand(g *Globals) *cobra.Command {
	var (
		f                    rackFlags
		force, watch, dryRun bool
	)
	cmd := &cobra.Command{
		Use:   "backup",
		Short: "Take the snapshot the rack's etcd.backups schedule says is due, and keep the newest",
		Long: `Take a snapshot of the rack's etcd into <state dir>/etcd-backups when the
rack file's schedule says one is due (etcd.backups.every: the newest there
is that old, or there is none), then delete the oldest beyond
etcd.backups.keep (default 7). Snapshots are named
<cluster>-<UTC time>.db, 0600, checked as 'etcd snapshot' checks them;
other files in the directory are left alone.

Run it from cron or a systemd timer as often as you like: a run with
nothing due takes nothing. --watch runs it in the foreground, waking when
the next one is due (after a failure, within a minute), until interrupted.
--force takes one now. --dry-run says whether one is due and which would
be deleted.`,
		Example: "  cozyctl etcd backup --rack rack.yaml            # from cron, e.g. every 10 minutes\n  cozyctl etcd backup --rack rack.yaml --watch    # as a service",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			o, err := f.options(g)
			if err != nil {
				return err
			}
			ctx := cmd.Context()
			for {
				res, err := etcdbackup.RunScheduled(ctx, o, force, dryRun, time.Now())
				force = false
				if err == nil {
					err = g.Print(scheduledTable(res))
				}
				if !watch || dryRun || ctx.Err() != nil {
					return err
				}
				wait := time.Until(res.Next)
				if err != nil {
					wait = min(time.Minute, o.Rack.Etcd.Backups.Interval())
					g.Logger().Error("etcd backup failed; trying again", "err", err, "in", wait)
				}
				select {
				case <-ctx.Done():
					return nil
				case <-time.After(max(wait, time.Second)):
				}
			}
		},
	}
	f.register(cmd)
	cmd.Flags().BoolVar(&force, "force", false, "take a snapshot now, due or not (then keep the newest, as scheduled)")
	cmd.Flags().BoolVar(&watch, "watch", false, "keep running: take each snapshot when it is due")
	cmd.Flags().BoolVar(&dryRun, "dry-run", false, "say whether a snapshot is due and which would be deleted; change nothing")
	return cmd
}

func newEtcdCheckCommand(g *Globals) *cobra.Command {
	return &cobra.Command{
		Use:   "check FILE",
		Short: "Check a snapshot file: the sha256 etcd appends, then etcd's own snapshot status",
		Args:  cobra.ExactArgs(1),
		RunE: func(_ *cobra.Command, args []string) error {
			st, err := etcdbackup.Check(args[0])
			if err != nil {
				return err
			}
			return g.Print(savedTable(etcdbackup.Saved{File: args[0], Status: st}))
		},
	}
}

func newEtcdRestoreCommand(g *Globals) *cobra.Command {
	var (
		f rackFlags
		o etcdbackup.RestoreOptions
	)
	cmd := &cobra.Command{
		Use:   "restore",
		Short: "Replace the rack's etcd with a snapshot (Talos's disaster recovery)",
		Long: `Restore etcd from a snapshot, as Talos's disaster recovery does:

  1. the snapshot is checked (the sha256 etcd appends, then etcd's own
     snapshot status);
  2. every control plane must answer, but those named with --lost (gone
     for good: they must not come back with their old disk, whose etcd
     still holds the cluster from before); if etcd runs on any, the restore is
     refused unless --wipe-etcd is given, which resets those control
     planes' EPHEMERAL volume (etcd's data; their config stays) and waits
     for them to be back with etcd stopped;
  3. the snapshot is uploaded to one control plane (--node, default the
     first in the rack) and etcd is bootstrapped there from it;
  4. the other control planes join it, and the restore waits for all of
     them to be members and for the Kubernetes API to answer.

Everything written to the cluster after the snapshot is lost. A restore cut
short is run again with the same flags. --dry-run makes every check and
prints the plan (the node, what would be wiped), changing nothing.`,
		Example: "  cozyctl etcd restore --rack rack.yaml --from backups/etcd-2026-12-01.db --wipe-etcd",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var err error
			if o.Options, err = f.options(g); err != nil {
				return err
			}
			res, err := etcdbackup.Restore(cmd.Context(), o)
			if err != nil {
				return err
			}
			return g.Print(restoredTable(res))
		},
	}
	f.register(cmd)
	fl := cmd.Flags()
	fl.StringVar(&o.From, "from", "", "the snapshot file (required)")
	fl.BoolVar(&o.WipeEtcd, "wipe-etcd", false, "wipe the etcd data of control planes where etcd runs, first")
	fl.StringVar(&o.Node, "node", "", "the control plane to restore on (default: the first in the rack)")
	fl.BoolVar(&o.DryRun, "dry-run", false, "make every check and print the plan; change nothing")
	fl.StringSliceVar(&o.Lost, "lost", nil, "control planes gone for good: not asked, wiped or waited for (wipe them before they come back)")
	fl.DurationVar(&o.Timeout, "timeout", 10*time.Minute, "bound on each wait: a node back after its reset, the members joined, the API answering")
	fl.IntVar(&o.TalosPort, "talos-port", 50000, "the Talos API port on the nodes")
	_ = fl.MarkHidden("talos-port")
	_ = cmd.MarkFlagRequired("from")
	return cmd
}

type savedTable etcdbackup.Saved

func (t savedTable) Header() []string {
	return []string{"FILE", "NODE", "REVISION", "KEYS", "SIZE", "HASH", "STORAGE"}
}

func (t savedTable) Rows() [][]string {
	return [][]string{{t.File, dash(t.Node), strconv.FormatInt(t.Revision, 10), strconv.Itoa(t.TotalKeys),
		strconv.FormatInt(t.TotalSize, 10), fmt.Sprintf("%08x", t.Hash), dash(t.Version)}}
}

type restoredTable etcdbackup.Restored

func (t restoredTable) Header() []string {
	return []string{"NODE", "WIPED", "LOST", "MEMBERS", "REVISION", "KEYS", "TOOK"}
}

func (t restoredTable) Rows() [][]string {
	took := t.Took.String()
	if t.DryRun {
		took = "- (dry run)"
	}
	return [][]string{{t.Node, dash(strings.Join(t.Wiped, ",")), dash(strings.Join(t.Lost, ",")), strings.Join(t.Members, ","),
		strconv.FormatInt(t.Status.Revision, 10), strconv.Itoa(t.Status.TotalKeys), took}}
}

type scheduledTable etcdbackup.Scheduled

func (t scheduledTable) Header() []string {
	return []string{"DUE", "TAKEN", "REVISION", "KEPT", "PRUNED", "NEXT"}
}

func (t scheduledTable) Rows() [][]string {
	taken, rev := "-", "-"
	if t.Taken != nil {
		taken, rev = filepath.Base(t.Taken.File), strconv.FormatInt(t.Taken.Revision, 10)
	}
	due := strconv.FormatBool(t.Due)
	if t.DryRun {
		due += " (dry run)"
	}
	return [][]string{{due, taken, rev, strconv.Itoa(len(t.Kept)), strconv.Itoa(len(t.Pruned)), t.Next.UTC().Format(time.RFC3339)}}
}

var (
	_ output.Tabular = scheduledTable{}
	_ output.Tabular = savedTable{}
	_ output.Tabular = restoredTable{}
)
