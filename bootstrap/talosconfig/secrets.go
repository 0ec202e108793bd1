package talosconfig

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"

	"github.com/siderolabs/talos/pkg/machinery/config"
	"github.com/siderolabs/talos/pkg/machinery/config/generate/secrets"
	"go.yaml.in/yaml/v3"

	"cozy.dev/cozy/internal/atomicfile"
)

// SecretsFile is the secrets bundle's name in an output or state dir.
const SecretsFile = "secrets.yaml"

// LoadOrCreateSecrets returns the cluster's secrets bundle at path,
// generating it first if the file does not exist. An existing bundle is
// never replaced: it holds the cluster's CAs. The file is mode 0600; a
// bundle found with looser permissions is tightened.
func LoadOrCreateSecrets(path string, contract *config.VersionContract) (b *secrets.Bundle, created bool, err error) {
	if b, err := loadSecrets(path); !errors.Is(err, fs.ErrNotExist) {
		return b, false, err
	}
	b, err = secrets.NewBundle(secrets.NewClock(), contract)
	if err != nil {
		return nil, false, fmt.Errorf("generate secrets: %w", err)
	}
	data, err := yaml.Marshal(b)
	if err != nil {
		return nil, false, fmt.Errorf("encode secrets: %w", err)
	}
	err = atomicfile.Create(path, data, 0o600)
	if errors.Is(err, fs.ErrExist) {
		// Another run created it first; theirs is the cluster's bundle.
		b, err := loadSecrets(path)
		return b, false, err
	}
	if err != nil {
		return nil, false, err
	}
	return b, true, nil
}

func loadSecrets(path string) (*secrets.Bundle, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return nil, err
	}
	if fi.Mode().Perm()&0o077 != 0 {
		if err := os.Chmod(path, 0o600); err != nil {
			return nil, fmt.Errorf("%s is readable by others and cannot be made 0600: %w", path, err)
		}
	}
	b, err := secrets.LoadBundle(path)
	if err != nil {
		return nil, fmt.Errorf("load secrets bundle %s: %w", path, err)
	}
	if err := b.Validate(); err != nil {
		return nil, fmt.Errorf("secrets bundle %s is damaged: %w; restore it from backup (a new bundle would be a different cluster)", path, err)
	}
	return b, nil
}

// WriteFile replaces path with data atomically, mode 0600; unchanged
// content is left alone so file times show when a config really changed.
func WriteFile(path string, data []byte) error {
	if old, err := os.ReadFile(path); err == nil && bytes.Equal(old, data) {
		return os.Chmod(path, 0o600)
	}
	return atomicfile.Write(path, data, 0o600)
}
