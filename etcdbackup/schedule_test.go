package etcdbackup

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"cozy.dev/cozy/bootstrap/rack"
)

// TestScheduledBackups: what is due, what is kept, and that nothing but
// the schedule's own snapshots is counted or deleted.
func TestScheduledBackups(t *testing.T) {
	dir := t.TempDir()
	t0 := time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)
	name := func(at time.Time) string { return filepath.Join(dir, "prod-"+at.Format(backupTime)+".db") }
	for _, f := range []string{
		name(t0), name(t0.Add(6 * time.Hour)), name(t0.Add(12 * time.Hour)),
		filepath.Join(dir, "prod-manual.db"),                            // not named by the schedule
		filepath.Join(dir, "other-"+t0.Format(backupTime)+".db"),        // another cluster's
		filepath.Join(dir, "prod-"+t0.Format(backupTime)+".db.partial"), // not a .db
	} {
		if err := os.WriteFile(f, nil, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	have, err := listBackups(dir, "prod-")
	if err != nil {
		t.Fatal(err)
	}
	if len(have) != 3 || !have[0].Taken.Equal(t0) || !have[2].Taken.Equal(t0.Add(12*time.Hour)) {
		t.Fatalf("listed %+v, want the schedule's three, oldest first", have)
	}
	newest := t0.Add(12 * time.Hour)
	for _, tc := range []struct {
		now  time.Time
		want bool
	}{
		{newest.Add(5 * time.Hour), false},
		{newest.Add(6 * time.Hour), true},
		{newest.Add(-time.Hour), true}, // the clock went back
	} {
		if got := due(have, 6*time.Hour, tc.now); got != tc.want {
			t.Errorf("due at %s: %v, want %v", tc.now, got, tc.want)
		}
	}
	if !due(nil, 6*time.Hour, t0) {
		t.Error("no snapshot yet: not due")
	}
	kept, pruned := prune(have, 2)
	if len(kept) != 2 || len(pruned) != 1 || pruned[0].File != name(t0) {
		t.Errorf("keep 2: kept %+v, pruned %+v; want the oldest pruned", kept, pruned)
	}
	if kept, pruned := prune(have, 7); len(kept) != 3 || pruned != nil {
		t.Errorf("keep 7: kept %d, pruned %+v", len(kept), pruned)
	}
}

func TestScheduledNeedsASchedule(t *testing.T) {
	_, err := RunScheduled(context.Background(), Options{Rack: &rack.Rack{}, StateDir: t.TempDir()}, false, false, time.Now())
	if err == nil || !strings.Contains(err.Error(), "the rack has no etcd.backups.every") {
		t.Errorf("no schedule: %v", err)
	}
}
