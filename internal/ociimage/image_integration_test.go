//go:build integration

package ociimage

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	rspec "github.com/opencontainers/runtime-spec/specs-go"

	"cozy.dev/cozy/internal/testing/prereq"
)

// TestOperatorImageWithRealTools builds the cozy-operator image as `make
// image` does and hands it to the tools a user pushes and runs it with:
// skopeo reads the archive and copies it into an OCI layout, umoci
// unpacks that into a runtime bundle, and runc runs the bundle as the
// chart's Deployment runs the container (its user, a read-only root
// filesystem, no capabilities, no network).
func TestOperatorImageWithRealTools(t *testing.T) {
	for _, bin := range []string{"skopeo", "umoci", "runc"} {
		if _, err := exec.LookPath(bin); err != nil {
			prereq.Missing(t, "%s is not installed (see hack/install-deps.sh)", bin)
		}
	}
	dir := t.TempDir()
	bin := filepath.Join(dir, "cozy-operator")
	build := exec.Command("go", "build", "-trimpath", "-ldflags", "-s -w -X cozy.dev/cozy/internal/version.Version=image-test", "-o", bin, "../../cmd/cozy-operator")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build cozy-operator: %v\n%s", err, out)
	}
	archive := filepath.Join(dir, "image.tar")
	f, err := os.Create(archive)
	if err != nil {
		t.Fatal(err)
	}
	err = Write(f, Image{
		Ref: "0.1.0", Arch: "amd64", Created: time.Unix(0, 0),
		Layers: []Layer{{Files: []File{{Path: "/cozy-operator", Mode: 0o755, Source: bin}}}},
		Config: ocispec.ImageConfig{User: "65532:65532", Entrypoint: []string{"/cozy-operator"}},
	})
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		t.Fatal(err)
	}

	run := func(name string, args ...string) []byte {
		t.Helper()
		out, err := exec.Command(name, args...).CombinedOutput()
		if err != nil {
			t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
		}
		return out
	}

	// skopeo: the image config as a registry client sees it.
	var config ocispec.Image
	if err := json.Unmarshal(run("skopeo", "inspect", "--config", "oci-archive:"+archive+":0.1.0"), &config); err != nil {
		t.Fatal(err)
	}
	if c := config.Config; c.User != "65532:65532" || strings.Join(c.Entrypoint, " ") != "/cozy-operator" || config.OS != "linux" || config.Architecture != "amd64" {
		t.Errorf("skopeo reads the config %+v (%s/%s)", c, config.OS, config.Architecture)
	}

	// skopeo copies it (checking every digest), umoci unpacks it.
	layout, bundle := filepath.Join(dir, "layout"), filepath.Join(dir, "bundle")
	run("skopeo", "copy", "--quiet", "oci-archive:"+archive+":0.1.0", "oci:"+layout+":0.1.0")
	run("umoci", "unpack", "--image", layout+":0.1.0", bundle)
	fi, err := os.Stat(filepath.Join(bundle, "rootfs", "cozy-operator"))
	if err != nil || fi.Mode().Perm() != 0o755 {
		t.Fatalf("unpacked binary: %v %v", fi, err)
	}

	// The runtime spec umoci made from the image, tightened as the
	// chart's securityContext does, with --version for arguments.
	specFile := filepath.Join(bundle, "config.json")
	data, err := os.ReadFile(specFile)
	if err != nil {
		t.Fatal(err)
	}
	var spec rspec.Spec
	if err := json.Unmarshal(data, &spec); err != nil {
		t.Fatal(err)
	}
	if u := spec.Process.User; u.UID != 65532 || u.GID != 65532 {
		t.Errorf("umoci runs it as %d:%d, want 65532:65532", u.UID, u.GID)
	}
	spec.Process.Args = append(spec.Process.Args, "--version")
	spec.Process.Terminal = false
	spec.Process.NoNewPrivileges = true
	spec.Process.Capabilities = &rspec.LinuxCapabilities{}
	spec.Root.Readonly = true
	hasNetNS := false
	for _, ns := range spec.Linux.Namespaces {
		hasNetNS = hasNetNS || ns.Type == rspec.NetworkNamespace
	}
	if !hasNetNS {
		spec.Linux.Namespaces = append(spec.Linux.Namespaces, rspec.LinuxNamespace{Type: rspec.NetworkNamespace})
	}
	if data, err = json.Marshal(spec); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(specFile, data, 0o600); err != nil {
		t.Fatal(err)
	}
	id := "cozy-image-test-" + filepath.Base(dir)
	t.Cleanup(func() { _ = exec.Command("runc", "delete", "--force", id).Run() })
	out := run("runc", "run", "--bundle", bundle, id)
	if !strings.HasPrefix(string(out), "image-test ") {
		t.Errorf("the container printed %q, want the version", out)
	}
}
