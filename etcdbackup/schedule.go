package etcdbackup

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// BackupDir is where scheduled snapshots are kept, in the bootstrap's
// state dir (0700, as the state dir: they hold every Secret).
const BackupDir = "etcd-backups"

// backupTime is the UTC time in a scheduled snapshot's name,
// <cluster>-<time>.db: it sorts as it reads, and names a snapshot to the
// millisecond so that two never share a name.
const backupTime = "20060102T150405.000Z"

// Backup is a scheduled snapshot on disk.
type Backup struct {
	File  string    `json:"file"`
	Taken time.Time `json:"taken"`
}

// Scheduled is what one scheduled run did.
type Scheduled struct {
	// Due says a snapshot was due (or forced).
	Due bool `json:"due"`
	// DryRun: nothing was taken or deleted; Pruned are the snapshots the
	// run would delete.
	DryRun bool `json:"dryRun,omitempty"`
	// Taken is the snapshot this run took; nil when none was due.
	Taken *Saved `json:"taken,omitempty"`
	// Next is when the next one is due.
	Next time.Time `json:"next"`
	// Kept are the snapshots kept, oldest first; Pruned those deleted.
	Kept   []Backup `json:"kept"`
	Pruned []Backup `json:"pruned,omitempty"`
}

// RunScheduled takes a snapshot into <state dir>/etcd-backups when the rack's
// etcd.backups says one is due (the newest there is `every` old, or there
// is none) or when force is set, then deletes the oldest beyond `keep`.
// Only files named as this function names them are counted or deleted.
// Run from cron or a systemd timer, or in a loop (`cozyctl etcd backup
// --watch`): a run with nothing due takes nothing. A dry run says whether
// one is due and what would be deleted, and changes nothing.
func RunScheduled(ctx context.Context, o Options, force, dryRun bool, now time.Time) (Scheduled, error) {
	o = o.withDefaults()
	pol := o.Rack.Etcd.Backups
	pol.Keep = max(pol.Keep, 1) // Load defaults and checks it
	every := pol.Interval()
	if every == 0 {
		return Scheduled{}, errors.New("the rack has no etcd.backups.every: set a schedule there (etcd: {backups: {every: 6h, keep: 7}}), or take one snapshot with `cozyctl etcd snapshot`")
	}
	dir := filepath.Join(o.StateDir, BackupDir)
	if !dryRun {
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return Scheduled{}, err
		}
	}
	prefix := o.Rack.Metadata.Name + "-"
	have, err := listBackups(dir, prefix)
	if err != nil {
		return Scheduled{}, err
	}
	res := Scheduled{Due: force || due(have, every, now), DryRun: dryRun}
	at := now.UTC().Truncate(time.Millisecond) // as the name holds it
	file := filepath.Join(dir, prefix+at.Format(backupTime)+".db")
	switch {
	case res.Due && dryRun:
		res.Kept, res.Pruned = prune(append(have, Backup{File: file, Taken: at}), pol.Keep)
		res.Kept = res.Kept[:len(res.Kept)-1] // not taken
		res.Next = now
		return res, nil
	case dryRun:
		res.Kept, res.Pruned = prune(have, pol.Keep)
		res.Next = res.Kept[len(res.Kept)-1].Taken.Add(every)
		return res, nil
	case res.Due:
		saved, err := Save(ctx, o, file)
		if err != nil {
			return Scheduled{Due: true, Kept: have, Next: now}, err
		}
		res.Taken = &saved
		have = append(have, Backup{File: file, Taken: at})
	}
	res.Kept, res.Pruned = prune(have, pol.Keep)
	for _, b := range res.Pruned {
		if err := os.Remove(b.File); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return res, fmt.Errorf("prune %s: %w", b.File, err)
		}
		o.Log.Info("old etcd snapshot deleted", "file", b.File)
	}
	res.Next = now
	if n := len(res.Kept); n > 0 {
		res.Next = res.Kept[n-1].Taken.Add(every)
	}
	return res, nil
}

// listBackups lists the scheduled snapshots in dir, oldest first.
func listBackups(dir, prefix string) ([]Backup, error) {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil // none yet
	}
	if err != nil {
		return nil, err
	}
	var out []Backup
	for _, e := range entries {
		name := e.Name()
		stamp, ok := strings.CutPrefix(name, prefix)
		if !ok || !e.Type().IsRegular() {
			continue
		}
		stamp, ok = strings.CutSuffix(stamp, ".db")
		if !ok {
			continue
		}
		t, err := time.Parse(backupTime, stamp)
		if err != nil {
			continue // not one of ours
		}
		out = append(out, Backup{File: filepath.Join(dir, name), Taken: t})
	}
	slices.SortFunc(out, func(a, b Backup) int { return a.Taken.Compare(b.Taken) })
	return out, nil
}

// due: there is no snapshot, the newest is every old, or it is in the
// future (the clock went back: better one snapshot too many).
func due(have []Backup, every time.Duration, now time.Time) bool {
	if len(have) == 0 {
		return true
	}
	newest := have[len(have)-1].Taken
	return now.Sub(newest) >= every || newest.After(now)
}

// prune keeps the newest keep snapshots of have (oldest first).
func prune(have []Backup, keep int) (kept, pruned []Backup) {
	if len(have) <= keep {
		return have, nil
	}
	return have[len(have)-keep:], have[:len(have)-keep]
}
