package etcdbackup_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"cozy.dev/cozy/etcdbackup"
)

// TestCheckRefuses: files that are not etcd snapshots are refused with
// etcd's own reason, whatever they hold. (A real snapshot, and one with a
// byte changed, are checked against real etcd in
// bootstrap's TestEtcdSnapshotRestore.)
func TestCheckRefuses(t *testing.T) {
	dir := t.TempDir()
	page := make([]byte, 4096)
	for i := range page {
		page[i] = byte(i * 7)
	}
	for _, tc := range []struct {
		name, want string
		data       []byte // nil: no file
	}{
		{"missing", "no such file", nil},
		{"empty", "is not a usable etcd snapshot", []byte{}},
		{"text", "no sha256 appended", []byte("apiVersion: v1\nkind: ConfigMap\n")},
		{"garbage pages", "is not a usable etcd snapshot", append(append([]byte{}, page...), page...)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(dir, tc.name)
			if tc.data != nil {
				if err := os.WriteFile(path, tc.data, 0o600); err != nil {
					t.Fatal(err)
				}
			}
			_, err := etcdbackup.Check(path)
			if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), path) {
				t.Errorf("Check: %v, want an error naming the file and %q", err, tc.want)
			}
		})
	}
}

// FuzzCheck: whatever a file holds, Check answers with a status or an
// error; etcd's snapshot code must not take the process down.
func FuzzCheck(f *testing.F) {
	f.Add([]byte{})
	f.Add([]byte("not a snapshot"))
	f.Add(make([]byte, 8192+32))
	f.Fuzz(func(t *testing.T, data []byte) {
		path := filepath.Join(t.TempDir(), "snap.db") // bbolt locks it: one per call
		if err := os.WriteFile(path, data, 0o600); err != nil {
			t.Fatal(err)
		}
		_, _ = etcdbackup.Check(path)
	})
}
