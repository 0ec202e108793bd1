package gitserver_test

import (
	"context"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"cozy.dev/cozy/internal/testing/prereq"
	"cozy.dev/cozy/platform/gitserver"
)

// A rendering published twice: a clone over HTTP sees each as it was
// (the second without the file it dropped), an unchanged one makes no
// commit, and a push is refused.
func TestPublishAndClone(t *testing.T) {
	if _, err := exec.LookPath("git"); err != nil {
		prereq.Missing(t, "git is not installed (Debian git; hack/install-deps.sh)")
	}
	ctx := context.Background()
	root, src := t.TempDir(), t.TempDir()
	write := func(name, data string) {
		t.Helper()
		p := filepath.Join(src, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("clusters/lab/platform.yaml", "a: 1\n")
	write("clusters/lab/components/metallb/metallb.yaml", "b: 1\n")
	first, err := gitserver.Publish(ctx, root, "platform", "main", src, "render 1")
	if err != nil {
		t.Fatal(err)
	}

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	sctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- gitserver.Serve(sctx, ln, root) }()
	defer func() {
		stop()
		if err := <-done; err != nil {
			t.Errorf("Serve after its context ended: %v", err)
		}
	}()
	url := "http://" + ln.Addr().String()
	git := func(dir string, args ...string) string {
		t.Helper()
		cmd := exec.Command("git", args...)
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), "GIT_CONFIG_NOSYSTEM=1", "HOME="+t.TempDir())
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("git %s: %v: %s", strings.Join(args, " "), err, out)
		}
		return strings.TrimSpace(string(out))
	}
	clone := filepath.Join(t.TempDir(), "clone")
	git("", "clone", "--quiet", "--branch", "main", url+"/platform.git", clone)
	if got := git(clone, "rev-parse", "HEAD"); got != first {
		t.Errorf("clone at %s, want %s", got, first)
	}
	if got := git(clone, "ls-files"); got != "clusters/lab/components/metallb/metallb.yaml\nclusters/lab/platform.yaml" {
		t.Errorf("files %q", got)
	}

	if err := os.RemoveAll(filepath.Join(src, "clusters/lab/components")); err != nil {
		t.Fatal(err)
	}
	write("clusters/lab/platform.yaml", "a: 2\n")
	second, err := gitserver.Publish(ctx, root, "platform", "main", src, "render 2")
	if err != nil {
		t.Fatal(err)
	}
	again, err := gitserver.Publish(ctx, root, "platform", "main", src, "render 3")
	if err != nil || again != second {
		t.Errorf("publishing the same tree again: %s, %v; want no new commit (%s)", again, err, second)
	}
	git(clone, "pull", "--quiet", "--ff-only")
	if got := git(clone, "ls-files"); got != "clusters/lab/platform.yaml" {
		t.Errorf("after the second publish, files %q", got)
	}
	if got := git(clone, "rev-list", "--count", "HEAD"); got != "2" {
		t.Errorf("%s commits, want 2", got)
	}

	// Read-only: a push over HTTP is refused.
	write2 := filepath.Join(clone, "extra")
	if err := os.WriteFile(write2, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	git(clone, "add", "extra")
	git(clone, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "--quiet", "-m", "x")
	cmd := exec.Command("git", "push", "--quiet", "origin", "main")
	cmd.Dir = clone
	if out, err := cmd.CombinedOutput(); err == nil {
		t.Errorf("a push over HTTP was accepted: %s", out)
	}

	for _, name := range []string{"Platform", "../x", "a.git", ""} {
		if _, err := gitserver.Publish(ctx, root, name, "main", src, "x"); err == nil {
			t.Errorf("repository name %q accepted", name)
		}
	}
}
