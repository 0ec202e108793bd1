package cli

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// Cozy's build scripts (hack/), which build upstream components from the
// Go module proxy and Debian packages into a cache keyed by version and
// print the directory. `cozyctl lab up` runs them itself, so a cold cache
// is filled without make.
const (
	scriptKubernetes = "envtest-assets.sh"   // etcd and the Kubernetes binaries
	scriptKernel     = "boot-assets.sh"      // Debian's kernel and the node's modules
	scriptRuntime    = "node-assets.sh"      // containerd and the CNI plugins
	scriptImages     = "lab-images.sh"       // the images the lab's nodes pull
	scriptPlatform   = "platform-images.sh"  // the platform's images (lab up --platform)
	scriptFlux       = "flux-controllers.sh" // Flux's controllers and their install.yaml
)

// runBuildScript runs hack/<script> of the source tree cozyctl was built
// from (bin/cozyctl sits in it) or of the working directory, and returns
// the directory it prints. Its progress, minutes of it on a cold cache,
// goes to progress.
func runBuildScript(ctx context.Context, script string, progress io.Writer) (string, error) {
	path, err := findBuildScript(script)
	if err != nil {
		return "", err
	}
	var out bytes.Buffer
	cmd := exec.CommandContext(ctx, "bash", path)
	cmd.Dir = filepath.Dir(filepath.Dir(path))
	cmd.Stdout, cmd.Stderr = &out, progress
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("%s: %w", path, err)
	}
	dir := strings.TrimSpace(out.String())
	if fi, err := os.Stat(dir); err != nil || !fi.IsDir() {
		return "", fmt.Errorf("%s printed %q, not a directory", path, dir)
	}
	return dir, nil
}

func findBuildScript(script string) (string, error) {
	var roots []string
	if self, err := os.Executable(); err == nil {
		if self, err := filepath.EvalSymlinks(self); err == nil {
			roots = append(roots, filepath.Dir(filepath.Dir(self)))
		}
	}
	if wd, err := os.Getwd(); err == nil {
		roots = append(roots, wd)
	}
	for _, r := range roots {
		p := filepath.Join(r, "hack", script)
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
	}
	return "", errors.New("hack/" + script + " is not beside this cozyctl: run the bin/cozyctl of a Cozy clone (make build), or cozyctl from the clone's directory")
}
