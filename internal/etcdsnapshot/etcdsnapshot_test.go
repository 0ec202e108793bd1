package etcdsnapshot_test

import (
	"crypto/sha256"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"cozy.dev/cozy/internal/etcdsnapshot"
)

func TestVerifyHash(t *testing.T) {
	db := make([]byte, 4096)
	for i := range db {
		db[i] = byte(i)
	}
	sum := sha256.Sum256(db)
	good := append(append([]byte{}, db...), sum[:]...)
	flipped := append([]byte{}, good...)
	flipped[100] ^= 1
	for _, tc := range []struct {
		name string
		data []byte
		want string // "" for no error
	}{
		{"intact", good, ""},
		{"one byte changed", flipped, "does not match"},
		{"no hash", db, "no sha256 appended"},
		{"truncated", good[:len(good)-1], "no sha256 appended"},
		{"empty", nil, "no sha256 appended"},
		{"hash only", sum[:], "no sha256 appended"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "snap.db")
			if err := os.WriteFile(path, tc.data, 0o600); err != nil {
				t.Fatal(err)
			}
			err := etcdsnapshot.VerifyHash(path)
			if tc.want == "" && err != nil || tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)) {
				t.Errorf("VerifyHash: %v, want %q", err, tc.want)
			}
		})
	}
}
