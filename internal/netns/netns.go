// Package netns runs code inside a named network namespace (one under
// /run/netns, as `ip netns add` makes): a function on an OS thread that
// joined it, and dials from there, so a client in this process reaches
// servers that only that namespace can reach (a lab's VMs, a test's
// emulated nodes) without the namespace getting any way out.
package netns

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"runtime"
	"strings"

	"golang.org/x/sys/unix"
)

// Add creates the named network namespace with `ip netns add`, under a
// lock every Cozy process shares: the first `ip netns add` on a machine
// makes /run/netns a mount point, and two at once can stack that mount
// over a namespace one of them just mounted there, which then cannot be
// entered (setns: EINVAL).
func Add(ctx context.Context, name string) error {
	lock, err := os.OpenFile("/run/cozy-netns.lock", os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return err
	}
	defer lock.Close()
	if err := unix.Flock(int(lock.Fd()), unix.LOCK_EX); err != nil {
		return fmt.Errorf("lock /run/cozy-netns.lock: %w", err)
	}
	defer unix.Flock(int(lock.Fd()), unix.LOCK_UN) //nolint:errcheck // closing unlocks too
	out, err := exec.CommandContext(ctx, "ip", "netns", "add", name).CombinedOutput()
	if err != nil {
		return fmt.Errorf("ip netns add %s: %v: %s", name, err, strings.TrimSpace(string(out)))
	}
	return nil
}

// Do runs f on an OS thread that has joined the namespace name. Sockets f
// creates belong to the namespace for their whole life, wherever they are
// used afterwards. The thread is discarded after f.
func Do(name string, f func() error) error {
	errc := make(chan error, 1)
	go func() {
		// Never unlocked: the goroutine's exit ends the thread, so no
		// other goroutine ever runs in the namespace by accident.
		runtime.LockOSThread()
		fd, err := unix.Open("/run/netns/"+name, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			errc <- fmt.Errorf("open netns %s: %w", name, err)
			return
		}
		defer unix.Close(fd)
		if err := unix.Setns(fd, unix.CLONE_NEWNET); err != nil {
			errc <- fmt.Errorf("enter netns %s: %w", name, err)
			return
		}
		errc <- f()
	}()
	return <-errc
}

// Dialer dials from inside the namespace name; use it as an
// http.Transport's or a rest.Config's DialContext.
func Dialer(name string) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		var c net.Conn
		err := Do(name, func() error {
			var err error
			c, err = (&net.Dialer{}).DialContext(ctx, network, addr)
			return err
		})
		return c, err
	}
}
