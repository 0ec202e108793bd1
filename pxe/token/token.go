// Package token issues the per-machine tokens that guard machine configs:
// a config URL carries HMAC-SHA256(key, MAC), so only the machine whose
// kernel command line holds the URL can fetch its config, and tokens stay
// valid across server restarts because the key lives in the state
// directory (mode 0600) and is created once.
package token

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"

	"cozy.dev/cozy/internal/atomicfile"
)

// KeyFile is the key's name in the state directory.
const KeyFile = "config-token.key"

// Keyring computes and checks tokens.
type Keyring struct {
	key []byte
}

// Load reads the key from dir, creating it if missing. A key readable by
// anyone but its owner is refused: whoever reads it can fetch every config.
func Load(dir string) (*Keyring, error) {
	path := filepath.Join(dir, KeyFile)
	key, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		key = make([]byte, 32)
		if _, err := rand.Read(key); err != nil {
			return nil, err
		}
		// Written whole and synced with its directory, or not at all: a
		// crash must not leave a short key that stops the next start.
		err := atomicfile.Create(path, key, 0o600)
		if errors.Is(err, fs.ErrExist) {
			return Load(dir) // another process made it first
		}
		if err != nil {
			return nil, fmt.Errorf("create token key: %w", err)
		}
		return &Keyring{key: key}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read token key: %w", err)
	}
	fi, err := os.Stat(path)
	if err != nil {
		return nil, err
	}
	if fi.Mode().Perm()&0o077 != 0 {
		return nil, fmt.Errorf("%s is readable by others (mode %v): run chmod 600 %s", path, fi.Mode().Perm(), path)
	}
	if len(key) != 32 {
		return nil, fmt.Errorf("%s: want 32 bytes, found %d", path, len(key))
	}
	return &Keyring{key: key}, nil
}

// For returns the token of the machine with mac.
func (k *Keyring) For(mac net.HardwareAddr) string {
	m := hmac.New(sha256.New, k.key)
	m.Write([]byte("cozy machine config\x00"))
	m.Write(mac)
	return base64.RawURLEncoding.EncodeToString(m.Sum(nil))
}

// Valid reports, in constant time, whether tok is mac's token.
func (k *Keyring) Valid(mac net.HardwareAddr, tok string) bool {
	return hmac.Equal([]byte(k.For(mac)), []byte(tok))
}
