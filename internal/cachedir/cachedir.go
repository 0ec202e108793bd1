// Package cachedir is where Cozy keeps what it builds, downloads or
// probes once: $COZY_CACHE_DIR, else ~/.cache/cozy, as hack's scripts and
// make use it. Commands and tests resolve it here; libraries are given
// the directory.
package cachedir

import (
	"os"
	"path/filepath"
)

// Dir is the cache directory.
func Dir() string {
	if d := os.Getenv("COZY_CACHE_DIR"); d != "" {
		return d
	}
	home, err := os.UserHomeDir()
	if err != nil {
		home = "/root"
	}
	return filepath.Join(home, ".cache", "cozy")
}
