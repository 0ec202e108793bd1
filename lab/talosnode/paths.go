package talosnode

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// Where Talos keeps what its node services run with; the emulated node
// uses the same paths, so manifests written for Talos (flannel's hostPath
// volumes, kubelet's /var/log/pods) find what they expect.
const (
	kubernetesDir      = "/etc/kubernetes"
	kubeletConfigFile  = kubernetesDir + "/kubelet.yaml"
	kubeletBootstrapKC = kubernetesDir + "/bootstrap-kubeconfig"
	kubeletKubeconfig  = kubernetesDir + "/kubeconfig-kubelet"
	kubernetesCACert   = kubernetesDir + "/pki/ca.crt"
	staticPodDir       = kubernetesDir + "/manifests"
	kubeletRootDir     = "/var/lib/kubelet"
	kubeletPKIDir      = kubeletRootDir + "/pki"
	// podResolvConf is the resolv.conf of pods with dnsPolicy Default
	// (CoreDNS among them); Talos keeps it in /system/resolved.
	podResolvConf    = kubernetesDir + "/resolv.conf"
	criDir           = "/etc/cri"
	criConfigFile    = criDir + "/containerd.toml"
	criConfDir       = criDir + "/conf.d"
	criHostsDir      = criConfDir + "/hosts"
	containerdRoot   = "/var/lib/containerd"
	containerdState  = "/run/containerd"
	containerdSocket = containerdState + "/containerd.sock"
	cniConfDir       = "/etc/cni/net.d"
	defaultCNIBinDir = "/opt/cni/bin"
	cniStateDir      = "/var/lib/cni" // flannel\'s and host-local\'s state
	podLogsDir       = "/var/log/pods"
	containerLogsDir = "/var/log/containers"
	flannelRunDir    = "/run/flannel"
	netnsDir         = "/run/netns"
)

// systemDirs are Talos's directories that the node's services and pods
// write to. On both platforms the node binds a directory of its state
// dir over each (prepareMachine): on the container platform (several
// nodes on one host, each in a mount namespace of its own) so that nodes
// do not see each other's files, in a lab VM so that they live on the
// machine's disk.
var systemDirs = []string{
	kubernetesDir, kubeletRootDir, criDir, containerdRoot, containerdState,
	"/etc/cni", cniStateDir, podLogsDir, containerLogsDir, flannelRunDir, netnsDir,
}

// SystemDir is where a node on the container platform keeps the content
// of Talos's system directories, under its state dir.
const SystemDir = "system"

// privateMountNamespace fails unless the process has a mount namespace
// other than its parent's (cozy-talos-node makes one for the container
// platform: inMountNamespace), and stops mounts from propagating out of
// it: binding over the host's directories anywhere else would hide the
// host's own files.
func privateMountNamespace() error {
	own, err := ownNamespace("mnt")
	if err != nil {
		return fmt.Errorf("the mount namespace: %w", err)
	}
	if !own {
		return errors.New("the container platform needs a mount namespace of its own (cozy-talos-node makes one when run as a program)")
	}
	if ownUTS, err := ownNamespace("uts"); err != nil || !ownUTS {
		return fmt.Errorf("the container platform needs a UTS namespace of its own, for its hostname (cozy-talos-node makes one when run as a program): %v", err)
	}
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("make the mount namespace private: %w", err)
	}
	return nil
}

// bindSystemDirs binds root/<dir> over each of systemDirs.
func bindSystemDirs(root string) error {
	for _, dir := range systemDirs {
		src := filepath.Join(root, dir)
		if err := os.MkdirAll(src, 0o755); err != nil {
			return err
		}
		// The mount point must exist on the host's file system; an empty
		// directory is all that is left there.
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return err
		}
		if mounted(dir, src) {
			continue
		}
		if err := unix.Mount(src, dir, "", unix.MS_BIND, ""); err != nil {
			return fmt.Errorf("bind %s over %s: %w", src, dir, err)
		}
	}
	return nil
}

// mounted reports whether dir is already src bound (a reboot of the
// emulated node finds its binds in place).
func mounted(dir, src string) bool {
	var a, b unix.Stat_t
	if unix.Stat(dir, &a) != nil || unix.Stat(src, &b) != nil {
		return false
	}
	return a.Dev == b.Dev && a.Ino == b.Ino
}

// unmountBelow unmounts everything mounted inside dirs (pod volumes,
// network namespaces), deepest first, so a reset can wipe them; the binds
// of dirs themselves stay.
func unmountBelow(dirs []string) error {
	data, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return err
	}
	var points []string
	for _, line := range strings.Split(string(data), "\n") {
		f := strings.Fields(line)
		if len(f) < 5 {
			continue
		}
		mp := unescapeMountPath(f[4])
		for _, d := range dirs {
			if strings.HasPrefix(mp, d+"/") {
				points = append(points, mp)
				break
			}
		}
	}
	sort.Slice(points, func(i, j int) bool { return len(points[i]) > len(points[j]) })
	var errs []error
	for _, p := range points {
		if err := unix.Unmount(p, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
			errs = append(errs, fmt.Errorf("unmount %s: %w", p, err))
		}
	}
	return errors.Join(errs...)
}

// unescapeMountPath undoes mountinfo's octal escapes (\040 for a space).
func unescapeMountPath(s string) string {
	if !strings.Contains(s, "\\") {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if v, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// RemoveMountPoints removes the empty directories a container-platform
// node left on the host's file system as its mount points, once no node
// of this host runs any more (tests call it). A directory with anything
// in it is the host's own and stays.
func RemoveMountPoints() {
	dirs := slices.Clone(systemDirs)
	// Deepest first, so /etc/cni goes after /etc/cni/net.d would.
	sort.Slice(dirs, func(i, j int) bool { return len(dirs[i]) > len(dirs[j]) })
	for _, d := range dirs {
		_ = unix.Rmdir(d)
	}
}

// ownNamespace reports whether this process's namespace of a kind
// (mnt, uts) differs from its parent's.
func ownNamespace(kind string) (bool, error) {
	self, err := os.Readlink("/proc/self/ns/" + kind)
	if err != nil {
		return false, err
	}
	parent, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/%s", os.Getppid(), kind))
	if err != nil {
		return false, err
	}
	return self != parent, nil
}
