// Package runc runs an image's bundle (umoci unpack) in containers with
// Debian's runc, for the tests that check the images Cozy builds: one way
// to read an image of a layout (skopeo, umoci), edit a bundle's runtime
// spec, create, start and exec into a container, and delete it when the
// test ends.
package runc

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	rspec "github.com/opencontainers/runtime-spec/specs-go"
)

var containers atomic.Int64

// NewID is a container name no other test process uses.
func NewID() string {
	return fmt.Sprintf("cozy-test-%d-%d", os.Getpid(), containers.Add(1))
}

// EditSpec rewrites the bundle's runtime spec (config.json) through edit.
func EditSpec(t testing.TB, bundle string, edit func(*rspec.Spec)) {
	t.Helper()
	file := filepath.Join(bundle, "config.json")
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var spec rspec.Spec
	if err := json.Unmarshal(data, &spec); err != nil {
		t.Fatal(err)
	}
	edit(&spec)
	if data, err = json.Marshal(spec); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(file, data, 0o600); err != nil {
		t.Fatal(err)
	}
}

// Run runs the bundle's process in a new container in the foreground
// (runc run) and returns what it printed; a failure fails the test.
func Run(t testing.TB, bundle string) string {
	t.Helper()
	id := NewID()
	t.Cleanup(func() { _ = exec.Command("runc", "delete", "--force", id).Run() })
	out, err := exec.Command("runc", "run", "--bundle", bundle, id).CombinedOutput()
	if err != nil {
		t.Errorf("runc run %s: %v\n%s", bundle, err, out)
	}
	return string(out)
}

// Container is a container of a bundle, deleted when the test ends.
type Container struct {
	id  string
	log string // the first process's output
}

// Create makes a container of the bundle whose first process waits to
// be started (runc create), for commands to run in its namespaces.
func Create(t testing.TB, bundle string) *Container {
	t.Helper()
	c := &Container{id: NewID(), log: filepath.Join(t.TempDir(), "container.log")}
	t.Cleanup(func() { _ = exec.Command("runc", "delete", "--force", c.id).Run() })
	// The container's init keeps runc's stdout and stderr: a file, not a
	// pipe, so that waiting for runc does not wait for the container.
	c.runc(t, "create", "--bundle", bundle, c.id)
	return c
}

// Start starts the container's first process (runc start).
func (c *Container) Start(t testing.TB) {
	t.Helper()
	c.runc(t, "start", c.id)
}

func (c *Container) runc(t testing.TB, args ...string) {
	t.Helper()
	log, err := os.OpenFile(c.log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer log.Close()
	cmd := exec.Command("runc", args...)
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Run(); err != nil {
		t.Fatalf("runc %s: %v\n%s", args[0], err, c.Log())
	}
}

// Exec runs args in the container (runc exec, with runc's exec options
// opts, e.g. --user) and returns what it printed.
func (c *Container) Exec(opts []string, args ...string) (string, error) {
	out, err := exec.Command("runc", append(append(append([]string{"exec"}, opts...), c.id), args...)...).CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("runc exec %s: %v: %s", strings.Join(args, " "), err, out)
	}
	return string(out), nil
}

// ExecDetached starts args in the container and returns at once (runc
// exec --detach), its output in the container's log: a pipe would stay
// open as long as it runs.
func (c *Container) ExecDetached(t testing.TB, opts []string, args ...string) {
	t.Helper()
	c.runc(t, append(append(append([]string{"exec", "--detach"}, opts...), c.id), args...)...)
}

// Stopped says whether the container's first process has ended.
func (c *Container) Stopped() bool {
	out, err := exec.Command("runc", "state", c.id).Output()
	var state rspec.State
	return err != nil || json.Unmarshal(out, &state) != nil || state.Status == rspec.StateStopped
}

// Log is what the container's processes printed that went to its log.
func (c *Container) Log() string {
	data, _ := os.ReadFile(c.log)
	return string(data)
}

// Config is the config of the image ref in the OCI layout dir, as
// skopeo reads it.
func Config(t testing.TB, dir, ref string) ocispec.Image {
	t.Helper()
	var config ocispec.Image
	if err := json.Unmarshal(mustRun(t, "skopeo", "inspect", "--config", "oci:"+dir+":"+ref), &config); err != nil {
		t.Fatal(err)
	}
	return config
}

// CheckBlobs copies the image ref out of the layout with skopeo, which
// checks every blob against its digest.
func CheckBlobs(t testing.TB, dir, ref string) {
	t.Helper()
	mustRun(t, "skopeo", "copy", "--quiet", "oci:"+dir+":"+ref, "oci:"+filepath.Join(t.TempDir(), "copy")+":image")
}

// Unpack unpacks the image ref of the layout into a new bundle (umoci
// unpack) and returns its directory.
func Unpack(t testing.TB, dir, ref string) string {
	t.Helper()
	bundle := filepath.Join(t.TempDir(), "bundle")
	mustRun(t, "umoci", "unpack", "--image", dir+":"+ref, bundle)
	return bundle
}

func mustRun(t testing.TB, name string, args ...string) []byte {
	t.Helper()
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return out
}
