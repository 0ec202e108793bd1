// Package workeragent is what Cozy's worker image runs on first boot,
// after its /init has brought up the network and containerd: it applies
// the machine's cloud-init disk (a config drive or a NoCloud seed) as
// cloud-init would (host name, bootcmd,
// write_files, runcmd: the kubeadm bootstrap provider's `kubeadm join`)
// and keeps the kubelet running the way kubeadm's systemd drop-in does,
// from the files kubeadm writes, restarting it when it exits.
package workeragent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"cozy.dev/cozy/tenant/cloudinit"
)

// Agent applies a seed to the root file system Root ("/" on a node).
type Agent struct {
	// Root is where the node's files live; tests use a directory.
	Root string
	// Shell runs a cloud-config command line (/bin/sh on the node).
	Shell string
	// Log receives the agent's and the commands' output (the console).
	Log io.Writer
	// SetHostname sets the machine's host name; nil leaves it.
	SetHostname func(string) error
}

func (a *Agent) logf(format string, args ...any) {
	fmt.Fprintf(a.Log, "cozy-worker: "+format+"\n", args...)
}

// ErrSeed marks a seed that could not be read or asks what the image
// cannot do: nothing was applied.
var ErrSeed = errors.New("seed not applied")

// Apply reads the seed in dir and does what it asks, in cloud-init's
// order. A command that fails is reported and the next one runs, as in
// cloud-init's runcmd script; the error lists every failure. A seed that
// cannot be read, or asks what the image cannot do, changes nothing.
func (a *Agent) Apply(ctx context.Context, dir string) error {
	md, cfg, err := cloudinit.ReadSeed(dir)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrSeed, err)
	}
	a.logf("seed: instance %s, host name %q, %d files, %d boot and %d run commands", md.InstanceID, md.LocalHostname, len(cfg.Files), len(cfg.BootCmd), len(cfg.RunCmd))
	for _, k := range cfg.Ignored {
		a.logf("seed: %s is not applied (the image has no SSH server and keeps the VM's clock)", k)
	}
	if md.LocalHostname != "" {
		if err := a.hostname(md.LocalHostname); err != nil {
			return err
		}
	}
	var errs []error
	errs = append(errs, a.run(ctx, "bootcmd", cfg.BootCmd)...)
	for _, f := range cfg.Files {
		if err := cloudinit.Write(a.Root, f); err != nil {
			errs = append(errs, fmt.Errorf("write_files %s: %w", f.Path, err))
			continue
		}
		a.logf("wrote %s (%v, %d bytes)", f.Path, f.Mode, len(f.Content))
	}
	errs = append(errs, a.run(ctx, "runcmd", cfg.RunCmd)...)
	return errors.Join(errs...)
}

// hostname sets the host name and the files that name it, so the
// kubelet and kubeadm find the same name.
func (a *Agent) hostname(name string) error {
	if a.SetHostname != nil {
		if err := a.SetHostname(name); err != nil {
			return fmt.Errorf("host name %s: %w", name, err)
		}
	}
	if err := cloudinit.Write(a.Root, cloudinit.File{Path: "/etc/hostname", Content: []byte(name + "\n"), Mode: 0o644}); err != nil {
		return err
	}
	hosts := "127.0.0.1 localhost\n::1 localhost\n127.0.1.1 " + name + "\n"
	return cloudinit.Write(a.Root, cloudinit.File{Path: "/etc/hosts", Content: []byte(hosts), Mode: 0o644})
}

func (a *Agent) run(ctx context.Context, what string, cmds []string) []error {
	var errs []error
	for i, c := range cmds {
		a.logf("%s %d: %s", what, i, c)
		cmd := exec.CommandContext(ctx, a.Shell, "-c", c)
		cmd.Dir = a.Root
		cmd.Stdout, cmd.Stderr = a.Log, a.Log
		if err := cmd.Run(); err != nil {
			a.logf("%s %d failed: %v", what, i, err)
			errs = append(errs, fmt.Errorf("%s %d (%s): %w", what, i, c, err))
		}
	}
	return errs
}

// Files the kubelet is started from: those kubeadm's systemd drop-in
// (10-kubeadm.conf) names.
const (
	KubeletConfig      = "/var/lib/kubelet/config.yaml"
	KubeadmFlagsEnv    = "/var/lib/kubelet/kubeadm-flags.env"
	KubeletDefaults    = "/etc/default/kubelet"
	BootstrapKubeconf  = "/etc/kubernetes/bootstrap-kubelet.conf"
	KubeletKubeconfig  = "/etc/kubernetes/kubelet.conf"
	kubeletRestartWait = 10 * time.Second // the drop-in's RestartSec
)

// KubeletArgs are the kubelet's arguments as kubeadm's drop-in gives
// them: the kubeconfigs, the config file, KUBELET_KUBEADM_ARGS from
// kubeadm-flags.env and KUBELET_EXTRA_ARGS from /etc/default/kubelet.
// Before those comes --cgroup-driver=cgroupfs: the image has no systemd,
// whose cgroup driver kubeadm's KubeletConfiguration defaults to, and
// containerd's runc uses cgroupfs; the user's flags can still override it.
func KubeletArgs(root string) ([]string, error) {
	args := []string{
		"--bootstrap-kubeconfig=" + BootstrapKubeconf,
		"--kubeconfig=" + KubeletKubeconfig,
		"--config=" + KubeletConfig,
		"--cgroup-driver=cgroupfs",
	}
	for _, f := range []struct{ path, name string }{{KubeadmFlagsEnv, "KUBELET_KUBEADM_ARGS"}, {KubeletDefaults, "KUBELET_EXTRA_ARGS"}} {
		data, err := os.ReadFile(filepath.Join(root, f.path))
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, err
		}
		v, err := envValue(string(data), f.name)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", f.path, err)
		}
		args = append(args, strings.Fields(v)...)
	}
	return args, nil
}

// envValue reads NAME="..." (or unquoted) from an EnvironmentFile.
func envValue(data, name string) (string, error) {
	for line := range strings.SplitSeq(data, "\n") {
		line = strings.TrimSpace(line)
		v, ok := strings.CutPrefix(line, name+"=")
		if !ok {
			continue
		}
		if len(v) >= 2 && (v[0] == '"' || v[0] == '\'') {
			if v[len(v)-1] != v[0] {
				return "", fmt.Errorf("%s: unterminated quote", name)
			}
			v = v[1 : len(v)-1]
		}
		return v, nil
	}
	return "", nil
}

// RunKubelet starts kubelet once kubeadm has written its config, and
// again 10 s after each exit, until ctx ends (systemd's Restart=always
// under kubeadm's drop-in).
func (a *Agent) RunKubelet(ctx context.Context, kubelet string) {
	logged := false
	for ctx.Err() == nil {
		if _, err := os.Stat(filepath.Join(a.Root, KubeletConfig)); err != nil {
			if !logged {
				a.logf("kubelet waits for %s (kubeadm join writes it)", KubeletConfig)
				logged = true
			}
			sleep(ctx, time.Second)
			continue
		}
		args, err := KubeletArgs(a.Root)
		if err != nil {
			a.logf("kubelet: %v", err)
			sleep(ctx, kubeletRestartWait)
			continue
		}
		a.logf("starting kubelet %s", strings.Join(args, " "))
		cmd := exec.CommandContext(ctx, kubelet, args...)
		cmd.Stdout, cmd.Stderr = a.Log, a.Log
		cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
		cmd.WaitDelay = 30 * time.Second
		err = cmd.Run()
		a.logf("kubelet exited: %v; again in %v", err, kubeletRestartWait)
		sleep(ctx, kubeletRestartWait)
	}
}

func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}
