package cachedir

import (
	"path/filepath"
	"testing"
)

func TestDir(t *testing.T) {
	t.Setenv("COZY_CACHE_DIR", "/srv/cozy-cache")
	if got := Dir(); got != "/srv/cozy-cache" {
		t.Errorf("with COZY_CACHE_DIR: %q", got)
	}
	t.Setenv("COZY_CACHE_DIR", "")
	t.Setenv("HOME", "/home/ops")
	if got, want := Dir(), filepath.Join("/home/ops", ".cache", "cozy"); got != want {
		t.Errorf("without: %q, want %q", got, want)
	}
}
