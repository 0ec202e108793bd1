package workeragent

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"cozy.dev/cozy/internal/testing/syncbuf"
)

func seed(t *testing.T, userData string) string {
	t.Helper()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "meta-data"), []byte("instance-id: i-1\nlocal-hostname: w1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "user-data"), []byte(userData), 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

// TestApply runs a seed against a directory with the real /bin/sh: boot
// commands before the files, run commands after them and in order, a
// failing command reported while the next still runs, the host name set.
func TestApply(t *testing.T) {
	root := t.TempDir()
	var log bytes.Buffer
	var host string
	a := &Agent{Root: root, Shell: "/bin/sh", Log: &log, SetHostname: func(h string) error { host = h; return nil }}
	err := a.Apply(context.Background(), seed(t, `## template: jinja
#cloud-config
bootcmd: ["test ! -e etc/join.yaml && echo boot >> order"]
write_files:
- {path: /etc/join.yaml, content: "name: {{ v1.local_hostname }}\n", permissions: '0640'}
runcmd:
- "cat etc/join.yaml >> order"
- "exit 3"
- [sh, -c, "echo last >> order"]
`))
	if err == nil || !strings.Contains(err.Error(), "runcmd 1 (exit 3)") || errors.Is(err, ErrSeed) {
		t.Fatalf("error %v, want runcmd 1's exit status", err)
	}
	order, _ := os.ReadFile(filepath.Join(root, "order"))
	if want := "boot\nname: w1\nlast\n"; string(order) != want {
		t.Errorf("commands ran as %q, want %q\nlog:\n%s", order, want, log.String())
	}
	if host != "w1" {
		t.Errorf("host name %q, want w1", host)
	}
	if b, _ := os.ReadFile(filepath.Join(root, "etc/hosts")); !strings.Contains(string(b), "127.0.1.1 w1") {
		t.Errorf("/etc/hosts %q", b)
	}
}

// TestApplyRefusedSeedChangesNothing: a seed asking for what the image
// cannot do writes no file and runs no command.
func TestApplyRefusedSeedChangesNothing(t *testing.T) {
	root := t.TempDir()
	a := &Agent{Root: root, Shell: "/bin/sh", Log: &bytes.Buffer{}}
	err := a.Apply(context.Background(), seed(t, "#cloud-config\nmounts: [[vdb, /data]]\nruncmd: [\"touch ran\"]\nwrite_files: [{path: /x, content: a}]\n"))
	if !errors.Is(err, ErrSeed) || !strings.Contains(err.Error(), "mounting file systems") {
		t.Fatalf("error %v, want ErrSeed about mounts", err)
	}
	if entries, _ := os.ReadDir(root); len(entries) != 0 {
		t.Errorf("refused seed left %d entries in the root", len(entries))
	}
}

func TestKubeletArgs(t *testing.T) {
	for _, tc := range []struct {
		name, flags, defaults string
		want                  []string
		err                   string
	}{
		{name: "before kubeadm", want: nil},
		{name: "kubeadm flags", flags: "KUBELET_KUBEADM_ARGS=\"--container-runtime-endpoint=unix:///var/run/containerd/containerd.sock --node-labels=a=b\"\n",
			want: []string{"--container-runtime-endpoint=unix:///var/run/containerd/containerd.sock", "--node-labels=a=b"}},
		{name: "extra args", flags: "KUBELET_KUBEADM_ARGS=--v=2\n", defaults: "# set by the user\nKUBELET_EXTRA_ARGS='--max-pods=50'\n",
			want: []string{"--v=2", "--max-pods=50"}},
		{name: "unterminated", flags: "KUBELET_KUBEADM_ARGS=\"--v=2\n", err: "unterminated quote"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			if tc.flags != "" {
				os.MkdirAll(filepath.Join(root, "var/lib/kubelet"), 0o755)
				os.WriteFile(filepath.Join(root, KubeadmFlagsEnv), []byte(tc.flags), 0o644)
			}
			if tc.defaults != "" {
				os.MkdirAll(filepath.Join(root, "etc/default"), 0o755)
				os.WriteFile(filepath.Join(root, KubeletDefaults), []byte(tc.defaults), 0o644)
			}
			got, err := KubeletArgs(root)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("error %v, want %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			base := []string{"--bootstrap-kubeconfig=" + BootstrapKubeconf, "--kubeconfig=" + KubeletKubeconfig, "--config=" + KubeletConfig, "--cgroup-driver=cgroupfs"}
			if want := append(base, tc.want...); !slices.Equal(got, want) {
				t.Errorf("args %q, want %q", got, want)
			}
		})
	}
}

// TestRunKubeletWaitsForConfig: no kubelet before kubeadm wrote its
// config; then the kubelet runs with its arguments.
func TestRunKubeletWaitsForConfig(t *testing.T) {
	root := t.TempDir()
	out := filepath.Join(root, "args")
	kubelet := filepath.Join(root, "kubelet")
	os.WriteFile(kubelet, []byte("#!/bin/sh\necho \"$@\" > "+out+"\nexec sleep 60\n"), 0o755)
	var log syncbuf.Buffer
	a := &Agent{Root: root, Shell: "/bin/sh", Log: &log}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { a.RunKubelet(ctx, kubelet); close(done) }()
	time.Sleep(1500 * time.Millisecond)
	if _, err := os.Stat(out); err == nil {
		t.Fatal("kubelet started before its config existed")
	}
	os.MkdirAll(filepath.Join(root, "var/lib/kubelet"), 0o755)
	os.WriteFile(filepath.Join(root, KubeletConfig), []byte("kind: KubeletConfiguration\n"), 0o644)
	for i := 0; ; i++ {
		if b, err := os.ReadFile(out); err == nil && strings.Contains(string(b), "--config="+KubeletConfig) {
			break
		}
		if i == 600 {
			t.Fatalf("kubelet never started; log:\n%s", log.String())
		}
		time.Sleep(100 * time.Millisecond)
	}
	cancel()
	<-done
}
