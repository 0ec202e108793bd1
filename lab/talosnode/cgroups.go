package talosnode

import (
	"bufio"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// On the container platform several nodes share the host's cgroups, so
// each gets a tree of its own, /cozy-node-<name>: the node and what it
// starts (containerd and its shims, kubelet, etcd, …) in runtime/, and
// the kubelet's pods under it (the kubelet's cgroupRoot). A node that
// stops, or the test that ran it, kills the whole tree: shims and
// containers are not children of the node and would outlive it.

// cgroupMount is one cgroup file system mount.
type cgroupMount struct {
	point, fstype, options string
}

// readCgroupMounts lists the cgroup and cgroup2 mounts of a mountinfo
// file (/proc/self/mountinfo, or init's).
func readCgroupMounts(mountinfo string) ([]cgroupMount, error) {
	f, err := os.Open(mountinfo)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []cgroupMount
	s := bufio.NewScanner(f)
	for s.Scan() {
		// ID PARENT MAJ:MIN ROOT MOUNTPOINT OPTS ... - FSTYPE SOURCE SUPEROPTS
		pre, post, ok := strings.Cut(s.Text(), " - ")
		if !ok {
			continue
		}
		fields, after := strings.Fields(pre), strings.Fields(post)
		if len(fields) < 5 || len(after) < 3 {
			continue
		}
		if after[0] == "cgroup" || after[0] == "cgroup2" {
			out = append(out, cgroupMount{point: unescapeMountPath(fields[4]), fstype: after[0], options: after[2]})
		}
	}
	return out, s.Err()
}

// cgroupMounts lists this mount namespace's cgroup hierarchies: cgroup
// v2's unified mount, or one per v1 controller set and, on a hybrid host,
// the unified one beside them (runc makes cgroups there too).
func cgroupMounts() ([]string, error) {
	mounts, err := readCgroupMounts("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	var out []string
	for _, m := range mounts {
		if !slices.Contains(out, m.point) {
			out = append(out, m.point)
		}
	}
	if len(out) == 0 {
		return nil, errors.New("no cgroup file system is mounted")
	}
	return out, nil
}

// mountHostCgroups mounts the host's cgroup hierarchies where the host
// has them, when this mount namespace has none: `ip netns exec` mounts a
// fresh /sys for the namespace, without them. Mounting a hierarchy again
// with its options gives the same hierarchy, so the node's cgroups are the
// host's.
func mountHostCgroups() error {
	if _, err := cgroupMounts(); err == nil {
		return nil
	}
	host, err := readCgroupMounts("/proc/1/mountinfo")
	if err != nil {
		return err
	}
	if len(host) == 0 {
		return errors.New("the host has no cgroup file system mounted")
	}
	if err := unix.Mount("cgroup-root", "/sys/fs/cgroup", "tmpfs", 0, "mode=755"); err != nil {
		return fmt.Errorf("mount /sys/fs/cgroup: %w", err)
	}
	for _, m := range host {
		if err := os.MkdirAll(m.point, 0o755); err != nil {
			return err
		}
		opts := m.options
		if m.fstype == "cgroup" {
			// Keep the controllers (and name=), drop rw/ro: they are
			// mount flags, not hierarchy options.
			var keep []string
			for _, o := range strings.Split(opts, ",") {
				if o != "rw" && o != "ro" {
					keep = append(keep, o)
				}
			}
			opts = strings.Join(keep, ",")
		}
		if err := unix.Mount(m.fstype, m.point, m.fstype, 0, opts); err != nil {
			return fmt.Errorf("mount the host's %s at %s (%s): %w", m.fstype, m.point, opts, err)
		}
	}
	return nil
}

// nodeCgroup is the path of a node's cgroup tree, relative to each
// hierarchy's root.
func nodeCgroup(nodeName string) string { return hostCgroupRoot(nodeName) }

// enterNodeCgroup creates the node's tree in every hierarchy and moves
// this process into its runtime/ cgroup, so everything it starts from
// now on lands there.
func enterNodeCgroup(nodeName string) error {
	mounts, err := cgroupMounts()
	if err != nil {
		return err
	}
	pid := []byte(strconv.Itoa(os.Getpid()))
	for _, m := range mounts {
		for _, dir := range []string{filepath.Join(m, nodeCgroup(nodeName)), filepath.Join(m, nodeCgroup(nodeName), "runtime")} {
			if err := os.Mkdir(dir, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
				return fmt.Errorf("create cgroup %s: %w", dir, err)
			}
			if err := inheritCpuset(dir); err != nil {
				return err
			}
		}
		if err := os.WriteFile(filepath.Join(m, nodeCgroup(nodeName), "runtime", "cgroup.procs"), pid, 0o644); err != nil {
			return fmt.Errorf("join cgroup in %s: %w", m, err)
		}
	}
	return nil
}

// inheritCpuset gives a new v1 cpuset cgroup its parent's CPUs and memory
// nodes: it starts with none, and a process cannot join it so.
func inheritCpuset(dir string) error {
	for _, f := range []string{"cpuset.cpus", "cpuset.mems"} {
		cur, err := os.ReadFile(filepath.Join(dir, f))
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil // not the cpuset hierarchy
			}
			return err
		}
		if strings.TrimSpace(string(cur)) != "" {
			continue
		}
		parent, err := os.ReadFile(filepath.Join(filepath.Dir(dir), f))
		if err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(dir, f), parent, 0o644); err != nil {
			return fmt.Errorf("%s: %w", filepath.Join(dir, f), err)
		}
	}
	return nil
}

// KillNodeCgroup kills every process in a container-platform node's
// cgroup tree but this one, and removes the tree once it is empty unless
// this process is in it. Tests call it after a node's process is gone; a
// stopping node calls it for what it leaves behind (containerd's shims,
// pods).
func KillNodeCgroup(nodeName string) error {
	mounts, err := cgroupMounts()
	if err != nil {
		return err
	}
	self := os.Getpid()
	inside := false
	var errs []error
	for attempt := 0; attempt < 100; attempt++ {
		errs = nil
		left := 0
		for _, m := range mounts {
			for _, pid := range cgroupPIDs(filepath.Join(m, nodeCgroup(nodeName))) {
				if pid == self {
					inside = true
					continue
				}
				left++
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
		}
		if left == 0 {
			if inside {
				return nil
			}
			for _, m := range mounts {
				if err := removeCgroupTree(filepath.Join(m, nodeCgroup(nodeName))); err != nil {
					errs = append(errs, err)
				}
			}
			if len(errs) == 0 {
				return nil
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	if len(errs) == 0 {
		errs = append(errs, fmt.Errorf("processes of node %s survive SIGKILL", nodeName))
	}
	return errors.Join(errs...)
}

// cgroupPIDs lists the processes in a cgroup and all below it.
func cgroupPIDs(root string) []int {
	var pids []int
	_ = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil || !d.IsDir() {
			return nil
		}
		data, err := os.ReadFile(filepath.Join(p, "cgroup.procs"))
		if err != nil {
			return nil
		}
		for _, f := range strings.Fields(string(data)) {
			if pid, err := strconv.Atoi(f); err == nil && !slices.Contains(pids, pid) {
				pids = append(pids, pid)
			}
		}
		return nil
	})
	return pids
}

// removeCgroupTree removes an empty cgroup and its children, deepest
// first.
func removeCgroupTree(root string) error {
	var dirs []string
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil
			}
			return err
		}
		if d.IsDir() {
			dirs = append(dirs, p)
		}
		return nil
	})
	if err != nil {
		return err
	}
	slices.Reverse(dirs)
	for _, d := range dirs {
		if err := syscall.Rmdir(d); err != nil && !errors.Is(err, syscall.ENOENT) {
			return fmt.Errorf("remove cgroup %s: %w", d, err)
		}
	}
	return nil
}
