package cozyctl

import (
	"encoding/json"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"sync"
	"testing"
)

func TestPathIsCozyctl(t *testing.T) {
	path := Path(t)
	out, err := exec.Command(path, "version", "-o", "json").Output()
	if err != nil {
		t.Fatalf("%s version: %v", path, err)
	}
	var v struct{ GoVersion, Platform string }
	if err := json.Unmarshal(out, &v); err != nil {
		t.Fatalf("version -o json: %v\n%s", err, out)
	}
	if v.GoVersion != runtime.Version() || v.Platform != runtime.GOOS+"/"+runtime.GOARCH {
		t.Errorf("version: %s, want %s on %s/%s", out, runtime.Version(), runtime.GOOS, runtime.GOARCH)
	}
	if again := Path(t); again != path {
		t.Errorf("second Path: %s, first %s", again, path)
	}
}

// Test processes build at once; when nothing changed, none replaces the
// binary the others may be running.
func TestRebuildKeepsTheBinary(t *testing.T) {
	before, err := os.Stat(Path(t))
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	paths, errs := make([]string, 3), make([]error, 3)
	for i := range paths {
		wg.Go(func() { paths[i], errs[i] = build() })
	}
	wg.Wait()
	for i, p := range paths {
		if errs[i] != nil {
			t.Fatal(errs[i])
		}
		after, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		if p != paths[0] || !os.SameFile(before, after) {
			t.Errorf("build %d replaced the binary (%s)", i, p)
		}
	}
}

func TestNoGoCommand(t *testing.T) {
	t.Setenv("PATH", t.TempDir())
	_, err := build()
	if err == nil || !strings.Contains(err.Error(), "go command is not on PATH") {
		t.Errorf("without go on PATH: %v", err)
	}
}
