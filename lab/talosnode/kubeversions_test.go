package talosnode

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"cozy.dev/cozy/internal/testing/poll"
)

// fakeKube writes a program that reports version v as a Kubernetes
// binary does, and otherwise sleeps until killed.
func fakeKube(t *testing.T, dir, name, v string) string {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(dir, name)
	script := "#!/bin/sh\nif [ \"$1\" = --version ]; then echo 'Kubernetes " + v + "'; exit 0; fi\necho started \"$@\"\nexec sleep 600\n"
	if err := os.WriteFile(p, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestKubeBinary: a component runs the binary of its image's version,
// from the assets directories first; the default binary when none has
// that version; and only an image of a version the node has is pulled.
func TestKubeBinary(t *testing.T) {
	dir := t.TempDir()
	def := fakeKube(t, filepath.Join(dir, "default"), "kube-apiserver", "v1.36.3")
	old := fakeKube(t, filepath.Join(dir, "old"), "kube-apiserver", "v1.35.4")
	same := fakeKube(t, filepath.Join(dir, "same"), "kube-apiserver", "v1.36.3")
	c := Config{KubernetesAssets: []string{filepath.Dir(old), filepath.Dir(same)}, Bin: Binaries{APIServer: def}}
	for _, tc := range []struct{ image, want string }{
		{"registry.k8s.io/kube-apiserver:v1.35.4", old},
		{"registry.k8s.io/kube-apiserver:v1.36.3", same}, // the assets before the default
		{"registry.k8s.io/kube-apiserver:v1.36.0", def},  // none: the default
		{"registry.k8s.io/kube-apiserver", def},          // "latest"
		{"not an image reference!", def},
	} {
		if got := c.kubeBinary("kube-apiserver", tc.image); got != tc.want {
			t.Errorf("%s runs %s, want %s", tc.image, got, tc.want)
		}
	}
	if got := strings.Join(c.versionsOf("kube-apiserver"), " "); got != "v1.35.4 v1.36.3 v1.36.3" {
		t.Errorf("versions: %s", got)
	}
	for _, tc := range []struct {
		image, component string
		ok               bool
	}{
		{"registry.k8s.io/kube-apiserver:v1.35.4", "kube-apiserver", true},
		{"ghcr.io/siderolabs/kubelet:v1.36.3", "kubelet", true},
		{"docker.io/library/alpine:3", "", false},
	} {
		comp, ok := componentOfImage(tc.image)
		if comp != tc.component || ok != tc.ok {
			t.Errorf("componentOfImage(%s) = %q, %v", tc.image, comp, ok)
		}
	}
}

// TestProgramRestartsOnSet: a supervised program whose binary or
// arguments change is stopped and started again at once with the new
// ones; setting the same ones restarts nothing; what runs is the old
// binary until it has shut down, then the new one.
func TestProgramRestartsOnSet(t *testing.T) {
	dir := t.TempDir()
	a := fakeKube(t, filepath.Join(dir, "a"), "kube-apiserver", "v1.35.4")
	// A graceful shutdown that takes a second.
	slow := "#!/bin/sh\ntrap 'sleep 1; kill $!; exit 0' TERM\necho started \"$@\"\nsleep 600 &\nwait\n"
	if err := os.WriteFile(a, []byte(slow), 0o755); err != nil {
		t.Fatal(err)
	}
	b := fakeKube(t, filepath.Join(dir, "b"), "kube-apiserver", "v1.36.3")
	logPath := filepath.Join(dir, "log")
	spawn := newSpawner()
	defer spawn.close()
	ctx, cancel := context.WithCancel(context.Background())
	p := newProgram(a, []string{"--one"})
	done := make(chan struct{})
	go func() {
		defer close(done)
		superviseProgram(ctx, slog.New(slog.DiscardHandler), spawn, "kube-apiserver", p, nil, logPath)
	}()
	defer func() { cancel(); <-done }()
	starts := func() string {
		b, _ := os.ReadFile(logPath)
		return string(b)
	}
	startedTimes := func(n int) func() error {
		return func() error {
			if got := strings.Count(starts(), "started"); got != n {
				return fmt.Errorf("started %d times", got)
			}
			return nil
		}
	}
	poll.Within(t, time.Minute, 20*time.Millisecond, "the first start", startedTimes(1))
	if p.set(a, []string{"--one"}) {
		t.Error("setting the same binary and arguments reported a change")
	}
	if got, latest := p.current(); got != a || !latest {
		t.Errorf("running %q (latest config: %v), want %q, the latest", got, latest, a)
	}
	if !p.set(b, []string{"--two"}) {
		t.Error("a new binary reported no change")
	}
	// a shuts down slowly, as kube-apiserver does: until it has exited,
	// it is what runs (so its static pod's status says its version).
	if got, latest := p.current(); got != a || latest {
		t.Errorf("running %q (latest config: %v) right after the new binary was set, want the old one, %q, still shutting down, not the latest", got, latest, a)
	}
	poll.Within(t, time.Minute, 20*time.Millisecond, "the restart", startedTimes(2))
	if got := starts(); !strings.HasSuffix(got, "started --two\n") {
		t.Errorf("log %q: want the second start with the new arguments", got)
	}
	if got, latest := p.current(); got != b || !latest {
		t.Errorf("running %q (latest config: %v) after the restart, want %q, the latest", got, latest, b)
	}
}
