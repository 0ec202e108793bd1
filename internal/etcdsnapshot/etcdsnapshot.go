// Package etcdsnapshot checks the integrity hash etcd appends to a
// snapshot it streams, before anything parses the database: etcd's
// snapshot status hands the file to bbolt, which panics (in a goroutine
// of its own, where no recover reaches) on a corrupt database.
package etcdsnapshot

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"os"
)

// VerifyHash checks that path ends with the sha256 of the rest, as etcd
// writes a snapshot: the database, whose size is a multiple of 512
// bytes, then its sha256 (etcd's restore tells the two apart by that
// size, and so does this).
func VerifyHash(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return err
	}
	size := fi.Size()
	if size%512 != sha256.Size || size < 512+sha256.Size {
		return fmt.Errorf("no sha256 appended (%d bytes): not a snapshot etcd streamed; a copied member/snap/db is not taken", size)
	}
	h := sha256.New()
	if _, err := io.Copy(h, io.LimitReader(f, size-sha256.Size)); err != nil {
		return err
	}
	want := make([]byte, sha256.Size)
	if _, err := io.ReadFull(f, want); err != nil {
		return err
	}
	if !bytes.Equal(h.Sum(nil), want) {
		return errors.New("its sha256 does not match its content: the file is corrupt")
	}
	return nil
}
