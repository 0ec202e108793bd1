// Package cozyctl gives tests the real cozyctl binary, built once, for the
// tests that must run it as a process of its own: a netboot server inside a
// network namespace, a registry that gets real signals, a bootstrap.
//
// Such tests used to re-run their own test binary as cozyctl from TestMain.
// That linked the whole CLI (Helm, client-go, every command) into each of
// those packages' test binaries, so `go test ./pxe` linked all of it too,
// and a pxe test depended on packages it does not test. Here the go command
// builds cmd/cozyctl into the cache directory instead: once per test
// process, under a file lock so that the packages of `go test ./...`, run
// in parallel, take turns, and cheaply after the first time, since the go
// command does not relink an output that is up to date.
package cozyctl

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/debug"
	"strings"
	"sync"
	"testing"

	"golang.org/x/sys/unix"

	"cozy.dev/cozy/internal/cachedir"
)

const mainPackage = "cozy.dev/cozy/cmd/cozyctl"

// The one build of this test process; every caller of Path gets its
// result, the error too.
var (
	buildOnce sync.Once
	built     string
	buildErr  error
)

// Path returns the path of a cozyctl binary built from this checkout's
// source, with the race detector if the test binary has it. The test
// fails if it cannot be built.
func Path(tb testing.TB) string {
	tb.Helper()
	buildOnce.Do(func() { built, buildErr = build() })
	if buildErr != nil {
		tb.Fatalf("cozyctl for this test: %v", buildErr)
	}
	return built
}

func build() (string, error) {
	goCmd, err := exec.LookPath("go")
	if err != nil {
		return "", fmt.Errorf("the go command is not on PATH (%v): tests build cozyctl with it; put Go's bin directory on PATH", err)
	}
	gomod, err := exec.Command(goCmd, "env", "GOMOD").Output()
	if err != nil {
		return "", fmt.Errorf("go env GOMOD: %w", err)
	}
	mod := strings.TrimSpace(string(gomod))
	if mod == "" || mod == os.DevNull {
		return "", errors.New("not run inside the cozy.dev/cozy module (go env GOMOD is empty)")
	}
	// One directory per checkout: two clones tested at once must not run
	// each other's cozyctl.
	dir := filepath.Join(cachedir.Dir(), "test-bin", fmt.Sprintf("%x", sha256.Sum256([]byte(filepath.Dir(mod))))[:16])
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	unlock, err := lock(filepath.Join(dir, "lock"))
	if err != nil {
		return "", err
	}
	defer unlock()

	name, args := "cozyctl", []string{"build"}
	if raceEnabled() {
		name, args = "cozyctl-race", append(args, "-race")
	}
	// The go command writes to staged, which no test runs: when it
	// relinks, it replaces the file (renames or removes and creates it),
	// never writes into it, so the published binary, a hard link to the
	// previous staged one, stays whole for whoever runs it. When staged is
	// up to date the go command leaves it alone and so is quick.
	staged, published := filepath.Join(dir, name+".build"), filepath.Join(dir, name)
	cmd := exec.Command(goCmd, append(args, "-o", staged, mainPackage)...)
	cmd.Dir = filepath.Dir(mod)
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build %s: %v\n%s", mainPackage, err, out)
	}
	if same(staged, published) {
		return published, nil
	}
	tmp := published + ".tmp"
	_ = os.Remove(tmp)
	if err := os.Link(staged, tmp); err != nil {
		return "", err
	}
	if err := os.Rename(tmp, published); err != nil {
		_ = os.Remove(tmp)
		return "", err
	}
	return published, nil
}

// lock holds an exclusive lock on path until unlock is called.
func lock(path string) (unlock func(), err error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, err
	}
	for {
		err = unix.Flock(int(f.Fd()), unix.LOCK_EX)
		if !errors.Is(err, unix.EINTR) {
			break
		}
	}
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("lock %s: %w", path, err)
	}
	return func() { f.Close() }, nil
}

func same(a, b string) bool {
	fa, errA := os.Stat(a)
	fb, errB := os.Stat(b)
	return errA == nil && errB == nil && os.SameFile(fa, fb)
}

// raceEnabled reports whether the test binary was built with -race: then
// cozyctl is too, as it was when tests re-ran themselves as cozyctl.
func raceEnabled() bool {
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return false
	}
	for _, s := range info.Settings {
		if s.Key == "-race" {
			return s.Value == "true"
		}
	}
	return false
}
