package token

import (
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

var (
	macA = net.HardwareAddr{0x52, 0x54, 0, 0, 0, 0x0a}
	macB = net.HardwareAddr{0x52, 0x54, 0, 0, 0, 0x0b}
)

func TestTokens(t *testing.T) {
	dir := t.TempDir()
	k, err := Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(filepath.Join(dir, KeyFile))
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("key file mode %v, %v; want 0600", fi.Mode().Perm(), err)
	}
	tok := k.For(macA)
	if !k.Valid(macA, tok) || k.Valid(macB, tok) || k.Valid(macA, "") || k.Valid(macA, tok[:len(tok)-1]) {
		t.Error("a token must open exactly its own machine's config")
	}
	again, err := Load(dir)
	if err != nil || !again.Valid(macA, tok) {
		t.Errorf("tokens must survive a restart: %v", err)
	}
	other, _ := Load(t.TempDir())
	if other.Valid(macA, tok) {
		t.Error("another server's key accepted this token")
	}
}

func TestLoadRefusesOpenKey(t *testing.T) {
	dir := t.TempDir()
	if _, err := Load(dir); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, KeyFile)
	if err := os.Chmod(path, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Load(dir); err == nil || !strings.Contains(err.Error(), "chmod 600") {
		t.Fatalf("world-readable key accepted: %v", err)
	}
	if err := os.WriteFile(path, []byte("short"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(path, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Load(dir); err == nil {
		t.Fatal("truncated key accepted")
	}
}
