//go:build integration

package bootstrap_test

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"cozy.dev/cozy/etcdbackup"
)

// TestEtcdSnapshotRestore backs up the etcd of three control planes with
// `cozyctl etcd snapshot`, writes more, and restores: a restore onto the
// running cluster is refused, and so are a file that is not a snapshot,
// a corrupt snapshot, and a restore while cp3 is down, all before
// anything changes; with --wipe-etcd and --lost cp3 the others are reset
// (EPHEMERAL), etcd is bootstrapped from the snapshot on cp1, cp2 joins
// it again, and the cluster holds what was written before the snapshot
// and not what was written after.
func TestEtcdSnapshotRestore(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	r, rc := haRack(ctx, t, 3, 0)
	kc := kubernetes.NewForConfigOrDie(rc)
	put := func(name string) {
		t.Helper()
		cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name}, Data: map[string]string{"k": name}}
		if _, err := kc.CoreV1().ConfigMaps("default").Create(ctx, cm, metav1.CreateOptions{}); err != nil {
			t.Fatalf("create ConfigMap %s: %v", name, err)
		}
	}
	exists := func(name string) bool {
		t.Helper()
		var found bool
		var err error
		for range 60 { // the API may still be coming back
			_, err = kc.CoreV1().ConfigMaps("default").Get(ctx, name, metav1.GetOptions{})
			if err == nil || apierrors.IsNotFound(err) {
				found = err == nil
				return found
			}
			time.Sleep(time.Second)
		}
		t.Fatalf("get ConfigMap %s: %v", name, err)
		return false
	}
	cozy := func(args ...string) (string, string, error) { return r.cozyctl(ctx, args...) }

	put("before")
	snap := filepath.Join(r.dir, "etcd.db")
	out, stderr, err := cozy("etcd", "snapshot", "--out", snap)
	if err != nil {
		t.Fatalf("etcd snapshot: %v\n%s", err, stderr)
	}
	var saved etcdbackup.Saved
	if err := json.Unmarshal([]byte(out), &saved); err != nil {
		t.Fatalf("etcd snapshot -o json: %v: %s", err, out)
	}
	if saved.Node != "cp1" || saved.Revision <= 0 || saved.TotalKeys <= 0 {
		t.Errorf("snapshot %+v, want one from cp1 with a revision and keys", saved)
	}
	if fi, err := os.Stat(snap); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("snapshot file: %v, mode %v, want 0600", err, fi.Mode().Perm())
	}
	put("after")

	// Refused, changing nothing: onto a running etcd, and from a file
	// that is not a snapshot (checked before anything is wiped).
	if _, stderr, err := cozy("etcd", "restore", "--from", snap); err == nil ||
		!strings.Contains(stderr, "etcd is running on cp1, cp2, cp3") || !strings.Contains(stderr, "--wipe-etcd") {
		t.Errorf("restore onto the running cluster: %v\n%s", err, stderr)
	}
	notSnap := filepath.Join(r.dir, "rack.yaml")
	if _, stderr, err := cozy("etcd", "restore", "--from", notSnap, "--wipe-etcd"); err == nil ||
		!strings.Contains(stderr, "is not a usable etcd snapshot") {
		t.Errorf("restore from a file that is not a snapshot: %v\n%s", err, stderr)
	}
	// One byte changed: etcd's status may read it (or bbolt panics on
	// it), and etcd's restore, which checks the hash, would fail on the
	// node after the wipe; the check verifies the hash first.
	corrupt := filepath.Join(r.dir, "corrupt.db")
	data, err := os.ReadFile(snap)
	if err != nil {
		t.Fatal(err)
	}
	data[len(data)/2] ^= 0xff
	if err := os.WriteFile(corrupt, data, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, stderr, err := cozy("etcd", "restore", "--from", corrupt, "--wipe-etcd"); err == nil ||
		!strings.Contains(stderr, "is not a usable etcd snapshot") {
		t.Errorf("restore from a corrupt snapshot: %v\n%s", err, stderr)
	}
	// A dry run makes the checks and names what would be wiped.
	out, stderr, err = cozy("etcd", "restore", "--from", snap, "--wipe-etcd", "--dry-run")
	var plan etcdbackup.Restored
	if err != nil || json.Unmarshal([]byte(out), &plan) != nil || !plan.DryRun || plan.Node != "cp1" ||
		strings.Join(plan.Wiped, ",") != "cp1,cp2,cp3" || plan.Status.Revision != saved.Revision {
		t.Errorf("restore --dry-run: %+v, %v\n%s", plan, err, stderr)
	}
	if !exists("after") {
		t.Fatal("a refused restore, or a dry run, lost data")
	}

	// cp3 is lost: powered off for good. A restore needs every control
	// plane to answer, unless the lost one is named.
	cp3 := r.nodes[2]
	_ = cp3.cmd.Process.Signal(syscall.SIGTERM)
	_ = cp3.cmd.Wait()
	if _, stderr, err := cozy("etcd", "restore", "--from", snap, "--wipe-etcd", "--timeout", "3m"); err == nil ||
		!strings.Contains(stderr, "cp3") || !strings.Contains(stderr, "--lost cp3") {
		t.Errorf("restore with a control plane down: %v\n%s", err, tail(stderr, 5))
	}
	if !exists("after") {
		t.Fatal("a refused restore lost data")
	}

	out, stderr, err = cozy("etcd", "restore", "--from", snap, "--wipe-etcd", "--lost", "cp3", "--timeout", "3m")
	if err != nil {
		t.Fatalf("etcd restore: %v\n%s", err, tail(stderr, 30))
	}
	var restored etcdbackup.Restored
	if err := json.Unmarshal([]byte(out), &restored); err != nil {
		t.Fatalf("etcd restore -o json: %v: %s", err, out)
	}
	t.Logf("snapshot: %d bytes, revision %d, %d keys, saved in %v; restore (2 nodes wiped, rebooted, 1 restored, 1 rejoined, API answering) took %v",
		saved.TotalSize, saved.Revision, saved.TotalKeys, saved.Took, restored.Took)
	two := []string{"cp1", "cp2"}
	if restored.Node != "cp1" || !slices.Equal(restored.Members, two) || !slices.Equal(restored.Wiped, two) || !slices.Equal(restored.Lost, []string{"cp3"}) {
		t.Errorf("restore %+v, want cp1 restored, cp1 and cp2 wiped and members, cp3 lost", restored)
	}
	if !exists("before") {
		t.Error("what was written before the snapshot is gone after the restore")
	}
	if exists("after") {
		t.Error("what was written after the snapshot is back after the restore")
	}
	for _, n := range r.nodes {
		log := n.log.String()
		restoredHere := strings.Count(log, "bootstrap from a snapshot: etcd and kube-apiserver started")
		joined := strings.Count(log, "join etcd: promoted to a voting member")
		want := map[string][2]int{"cp1": {1, 0}, "cp2": {0, 2}, "cp3": {0, 1}}[n.host]
		if restoredHere != want[0] || joined != want[1] {
			t.Errorf("%s: restored %d times and joined %d times, want %d and %d", n.host, restoredHere, joined, want[0], want[1])
		}
	}
	if _, err := os.Stat(filepath.Join(r.nodes[0].dir, "etcd.snapshot")); !os.IsNotExist(err) {
		t.Errorf("the uploaded snapshot is still on cp1's disk after the restore (stat: %v)", err)
	}
}

// TestEtcdScheduledBackups: `cozyctl etcd backup` under the rack's
// etcd.backups (every 1h, keep 2) takes a snapshot when none is there,
// nothing on a second run (not due), one with --force each time, and
// keeps the newest two, deleting the oldest; a file in the directory
// that the schedule did not name is left alone.
func TestEtcdScheduledBackups(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	r, _ := haRack(ctx, t, 1, 0)
	cozy := func(args ...string) (string, string, error) { return r.cozyctl(ctx, args...) }
	if _, stderr, err := cozy("etcd", "backup"); err == nil || !strings.Contains(stderr, "the rack has no etcd.backups.every") {
		t.Errorf("etcd backup without a schedule: %v\n%s", err, stderr)
	}
	f, err := os.OpenFile(r.rackFile, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteString("etcd: {backups: {every: 1h, keep: 2}}\n"); err != nil {
		t.Fatal(err)
	}
	f.Close()
	dir := filepath.Join(r.stateDir, etcdbackup.BackupDir)
	run := func(args ...string) etcdbackup.Scheduled {
		t.Helper()
		out, stderr, err := cozy(append([]string{"etcd", "backup"}, args...)...)
		if err != nil {
			t.Fatalf("etcd backup %v: %v\n%s", args, err, stderr)
		}
		var res etcdbackup.Scheduled
		if err := json.Unmarshal([]byte(out), &res); err != nil {
			t.Fatalf("etcd backup -o json: %v: %s", err, out)
		}
		return res
	}
	if plan := run("--dry-run"); !plan.Due || !plan.DryRun || plan.Taken != nil {
		t.Errorf("a dry run with no snapshot yet: %+v, want due, nothing taken", plan)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("a dry run made %s: %v", dir, err)
	}
	first := run()
	if first.Taken == nil || len(first.Kept) != 1 || first.Taken.Revision <= 0 {
		t.Fatalf("first run: %+v, want a snapshot taken", first)
	}
	if err := os.WriteFile(filepath.Join(dir, "mine.db"), []byte("not the schedule's"), 0o600); err != nil {
		t.Fatal(err)
	}
	if again := run(); again.Taken != nil || len(again.Kept) != 1 || !again.Next.Equal(first.Next) {
		t.Errorf("a second run within the hour: %+v, want nothing taken, next %s", again, first.Next)
	}
	run("--force")
	if plan := run("--dry-run", "--force"); !plan.Due || plan.Taken != nil || len(plan.Pruned) != 1 || plan.Pruned[0].File != first.Taken.File {
		t.Errorf("a forced dry run at keep 2 with two: %+v, want the first named for deletion, nothing done", plan)
	}
	last := run("--force")
	if last.Taken == nil || len(last.Kept) != 2 || len(last.Pruned) != 1 || last.Pruned[0].File != first.Taken.File {
		t.Errorf("keep 2 after three: %+v, want the first pruned", last)
	}
	if _, err := os.Stat(first.Taken.File); !os.IsNotExist(err) {
		t.Errorf("the pruned snapshot: %v, want it gone", err)
	}
	entries, _ := os.ReadDir(dir)
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
		if fi, err := e.Info(); err == nil && fi.Mode().Perm() != 0o600 {
			t.Errorf("%s: mode %v, want 0600", e.Name(), fi.Mode().Perm())
		}
	}
	if len(names) != 3 || !slices.Contains(names, "mine.db") {
		t.Errorf("%s holds %v, want the two kept and mine.db", dir, names)
	}
	if fi, err := os.Stat(dir); err != nil || fi.Mode().Perm() != 0o700 {
		t.Errorf("%s: %v, want mode 0700", dir, err)
	}
	for _, b := range last.Kept {
		if _, err := etcdbackup.Check(b.File); err != nil {
			t.Errorf("kept snapshot: %v", err)
		}
	}
}
