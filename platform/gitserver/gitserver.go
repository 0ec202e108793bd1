// Package gitserver serves the platform's Git repositories to Flux over
// Git's smart HTTP protocol, read-only, through `git http-backend` (the
// git package's own server, run as CGI), and publishes a rendered
// platform into them as a new commit. It is the lab's Git server, and
// an air-gapped rack's if it has none.
package gitserver

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/cgi"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"time"
)

// Handler serves every bare repository under root (root/NAME.git at
// /NAME.git) for clone and fetch. Pushes are refused: http-backend
// enables receive-pack only for an authenticated user, and none is.
func Handler(root string) (http.Handler, error) {
	git, err := exec.LookPath("git")
	if err != nil {
		return nil, errors.New("git is not installed (Debian git)")
	}
	execPath, err := exec.Command(git, "--exec-path").Output()
	if err != nil {
		return nil, fmt.Errorf("git --exec-path: %w", err)
	}
	root, err = filepath.Abs(root)
	if err != nil {
		return nil, err
	}
	return &cgi.Handler{
		Path: filepath.Join(strings.TrimSpace(string(execPath)), "git-http-backend"),
		Root: "/",
		Env:  []string{"GIT_PROJECT_ROOT=" + root, "GIT_HTTP_EXPORT_ALL=1"},
	}, nil
}

// Serve serves the repositories under root on ln until ctx ends, then
// lets the requests in flight finish (at most 10s).
func Serve(ctx context.Context, ln net.Listener, root string) error {
	h, err := Handler(root)
	if err != nil {
		ln.Close()
		return err
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ln) }()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		return err
	}
	if err := <-done; !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

var repoName = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]*$`)

// Publish commits the tree under dir as the new head of branch in the
// bare repository root/NAME.git, creating it if needed: the commit holds
// exactly dir's files (what dir no longer has is deleted). It returns the
// commit; nothing changed, it makes no commit and returns the head.
func Publish(ctx context.Context, root, name, branch, dir, message string) (string, error) {
	if !repoName.MatchString(name) || strings.HasSuffix(name, ".git") {
		return "", fmt.Errorf("repository name %q: use lower-case letters, digits, '.', '_' and '-', without .git", name)
	}
	repo := filepath.Join(root, name+".git")
	git := func(env []string, args ...string) (string, error) {
		cmd := exec.CommandContext(ctx, "git", append([]string{"--git-dir", repo}, args...)...)
		cmd.Dir = dir // pathspecs are read against the work tree
		cmd.Env = append(os.Environ(), append([]string{
			"GIT_AUTHOR_NAME=cozyctl", "GIT_AUTHOR_EMAIL=cozyctl@cozy.dev",
			"GIT_COMMITTER_NAME=cozyctl", "GIT_COMMITTER_EMAIL=cozyctl@cozy.dev",
			"GIT_CONFIG_NOSYSTEM=1", "HOME=" + root,
		}, env...)...)
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		if err := cmd.Run(); err != nil {
			return "", fmt.Errorf("git %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
		}
		return strings.TrimSpace(stdout.String()), nil
	}
	if _, err := os.Stat(filepath.Join(repo, "HEAD")); errors.Is(err, os.ErrNotExist) {
		if err := os.MkdirAll(root, 0o755); err != nil {
			return "", err
		}
		if _, err := git(nil, "init", "--quiet", "--bare", "--initial-branch", branch); err != nil {
			return "", err
		}
	}
	// A fresh index, filled from dir alone: the commit's tree is dir.
	index, err := os.CreateTemp("", "gitserver-index-")
	if err != nil {
		return "", err
	}
	index.Close()
	os.Remove(index.Name()) // git makes it; an empty file is not an index
	defer os.Remove(index.Name())
	env := []string{"GIT_INDEX_FILE=" + index.Name(), "GIT_WORK_TREE=" + dir}
	if _, err := git(env, "add", "--all", "."); err != nil {
		return "", err
	}
	tree, err := git(env, "write-tree")
	if err != nil {
		return "", err
	}
	ref := "refs/heads/" + branch
	parent, err := git(nil, "rev-parse", "--verify", "--quiet", ref)
	args := []string{"commit-tree", tree, "-m", message}
	if err == nil {
		if prev, err := git(nil, "rev-parse", parent+"^{tree}"); err == nil && prev == tree {
			return parent, nil
		}
		args = append(args, "-p", parent)
	}
	commit, err := git(nil, args...)
	if err != nil {
		return "", err
	}
	// Moves the branch only if nobody else moved it meanwhile.
	if _, err := git(nil, "update-ref", ref, commit, parent); err != nil {
		return "", err
	}
	return commit, nil
}
