package lab

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"cozy.dev/cozy/internal/netns"
)

// createNetwork makes the lab's namespace with its bridge (the netboot
// server's address on it) and one tap per machine, all up. Nothing is
// routed out of the namespace.
func createNetwork(ctx context.Context, name string, machines []Machine) error {
	ns := Namespace(name)
	if namespaceExists(ns) {
		return fmt.Errorf("network namespace %s exists: lab %q is up (cozyctl lab down --name %s first)", ns, name, name)
	}
	if err := netns.Add(ctx, ns); err != nil {
		return err
	}
	steps := [][]string{
		{"link", "set", "lo", "up"},
		{"link", "add", Bridge, "type", "bridge"},
		{"addr", "add", fmt.Sprintf("%s/%d", ServerIP, Subnet.Bits()), "dev", Bridge},
		{"link", "set", Bridge, "up"},
	}
	for _, m := range machines {
		steps = append(steps,
			[]string{"addr", "add", fmt.Sprintf("%s/%d", m.BMC, BMCSubnet.Bits()), "dev", Bridge},
			[]string{"tuntap", "add", "dev", m.Tap, "mode", "tap"},
			[]string{"link", "set", m.Tap, "master", Bridge},
			[]string{"link", "set", m.Tap, "up"})
	}
	for _, s := range steps {
		if err := ip(ctx, append([]string{"-n", ns}, s...)...); err != nil {
			_ = deleteNetwork(context.WithoutCancel(ctx), name)
			return err
		}
	}
	return nil
}

// deleteNetwork kills whatever still runs in the lab's namespace and
// deletes it, with its bridge and taps. Deleting a lab that is gone is
// not an error.
func deleteNetwork(ctx context.Context, name string) error {
	ns := Namespace(name)
	if !namespaceExists(ns) {
		return nil
	}
	killNamespace(ctx, ns)
	return ip(ctx, "netns", "del", ns)
}

func namespaceExists(ns string) bool {
	_, err := os.Stat("/run/netns/" + ns)
	return err == nil
}

// killNamespace ends every process in the namespace: SIGTERM, then SIGKILL
// for what is left after a few seconds.
func killNamespace(ctx context.Context, ns string) {
	for i, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGKILL} {
		pids := namespacePIDs(ctx, ns)
		if len(pids) == 0 {
			return
		}
		for _, pid := range pids {
			_ = syscall.Kill(pid, sig)
		}
		if i == 0 {
			deadline := time.Now().Add(5 * time.Second)
			for time.Now().Before(deadline) && len(namespacePIDs(ctx, ns)) > 0 {
				time.Sleep(100 * time.Millisecond)
			}
		}
	}
}

func namespacePIDs(ctx context.Context, ns string) []int {
	out, err := exec.CommandContext(ctx, "ip", "netns", "pids", ns).Output()
	if err != nil {
		return nil
	}
	var pids []int
	for _, f := range strings.Fields(string(out)) {
		if pid, err := strconv.Atoi(f); err == nil && pid != os.Getpid() {
			pids = append(pids, pid)
		}
	}
	return pids
}

func ip(ctx context.Context, args ...string) error {
	var stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, "ip", args...)
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("ip %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return nil
}

// radvdConfig answers the router solicitations of iPXE: it configures
// IPv6 beside DHCPv4 and, with no router on the link, waits about 13 s on
// every netboot before it fetches its script. An advertisement that says
// "no default router, no prefix, no DHCPv6" ends that wait at once; the
// lab's network stays IPv4 only.
const radvdConfig = `# Written by cozyctl lab up: tells iPXE (and the nodes) at once that this
# link has no IPv6 router, instead of letting them wait for one.
interface ` + Bridge + ` {
	AdvSendAdvert on;
	AdvDefaultLifetime 0;
	AdvManagedFlag off;
	AdvOtherConfigFlag off;
};
`

// startRouterAdvertiser runs radvd on the lab's bridge, inside its
// namespace, with its files in dir; deleteNetwork ends it with the rest of
// the namespace. Without radvd the lab still works, each netboot about
// 13 s slower, and the returned error says so.
func startRouterAdvertiser(ctx context.Context, name, dir string) error {
	bin, err := exec.LookPath("radvd")
	if err != nil {
		return fmt.Errorf("radvd is not installed (hack/install-deps.sh), so iPXE waits ~13 s for an IPv6 router on every netboot: %w", err)
	}
	conf := filepath.Join(dir, "radvd.conf")
	if err := os.WriteFile(conf, []byte(radvdConfig), 0o644); err != nil {
		return err
	}
	// radvd daemonizes once it has read its config.
	return ip(ctx, "netns", "exec", Namespace(name), bin, "--config", conf,
		"--pidfile", filepath.Join(dir, "radvd.pid"), "--logmethod", "logfile", "--logfile", filepath.Join(dir, "radvd.log"))
}
