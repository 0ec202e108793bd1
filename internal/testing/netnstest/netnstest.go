// Package netnstest gives tests private networks: network namespaces joined
// by veth pairs, created by the test and deleted when it ends, so test
// traffic never reaches a real network. It needs root; without root a test
// fails under CI=true and skips elsewhere (see prereq).
package netnstest

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"cozy.dev/cozy/internal/netns"
	"cozy.dev/cozy/internal/testing/prereq"
)

// NS is a network namespace made for one test.
type NS struct {
	Name string
}

var (
	counter atomic.Int64
	sweep   sync.Once
)

// prefix starts the name of every namespace this package makes; the PID
// after it tells whose it is.
const prefix = "cozyt-"

// sweepOrphans deletes namespaces left by test processes that died without
// cleaning up (SIGKILL, a crash), and kills what still runs inside them.
func sweepOrphans() {
	entries, err := os.ReadDir("/run/netns")
	if err != nil {
		return
	}
	for _, e := range entries {
		rest, ok := strings.CutPrefix(e.Name(), prefix)
		if !ok {
			continue
		}
		pidText, _, _ := strings.Cut(rest, "-")
		pid, err := strconv.Atoi(pidText)
		if err != nil || pid == os.Getpid() || unix.Kill(pid, 0) == nil {
			continue // not ours, or its test is still running
		}
		killInside(e.Name())
		_ = exec.Command("ip", "netns", "del", e.Name()).Run()
	}
}

func killInside(name string) {
	out, err := exec.Command("ip", "netns", "pids", name).Output()
	if err != nil {
		return
	}
	for _, f := range strings.Fields(string(out)) {
		// Our own process shows up while a Do thread is still exiting.
		if pid, err := strconv.Atoi(f); err == nil && pid != os.Getpid() {
			_ = unix.Kill(pid, unix.SIGKILL)
		}
	}
}

// New creates a namespace with its loopback up and deletes it (and every
// interface in it) when the test ends.
func New(t testing.TB, label string) *NS {
	t.Helper()
	if os.Geteuid() != 0 {
		prereq.Missing(t, "network namespaces need root")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		prereq.Missing(t, "the ip command (Debian iproute2) is not installed")
	}
	sweep.Do(sweepOrphans)
	name := fmt.Sprintf("%s%d-%d-%s", prefix, os.Getpid(), counter.Add(1), label)
	if len(name) > 40 {
		name = name[:40]
	}
	if err := netns.Add(context.Background(), name); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		// Kill anything still inside, then remove the namespace.
		killInside(name)
		if out, err := exec.Command("ip", "netns", "del", name).CombinedOutput(); err != nil {
			t.Errorf("delete netns %s: %v: %s", name, err, out)
		}
	})
	ns := &NS{Name: name}
	ns.IP(t, "link", "set", "lo", "up")
	return ns
}

// IP runs `ip ARGS...` inside the namespace.
func (n *NS) IP(t testing.TB, args ...string) {
	t.Helper()
	run(t, "ip", append([]string{"-n", n.Name}, args...)...)
}

// Command runs a program inside the namespace.
func (n *NS) Command(ctx context.Context, name string, args ...string) *exec.Cmd {
	return exec.CommandContext(ctx, "ip", append([]string{"netns", "exec", n.Name, name}, args...)...)
}

// Veth joins a and b with a veth pair named aName (in a) and bName (in b)
// and brings both ends up. Addresses in CIDR form are optional ("" for none).
func Veth(t testing.TB, a *NS, aName, aAddr string, b *NS, bName, bAddr string) {
	t.Helper()
	// Create in a, then move one end, so no interface ever sits in the
	// host's namespace under a name that could collide.
	a.IP(t, "link", "add", aName, "type", "veth", "peer", "name", bName)
	a.IP(t, "link", "set", bName, "netns", b.Name)
	for _, end := range []struct {
		ns         *NS
		name, addr string
	}{{a, aName, aAddr}, {b, bName, bAddr}} {
		if end.addr != "" {
			end.ns.IP(t, "addr", "add", end.addr, "dev", end.name)
		}
		end.ns.IP(t, "link", "set", end.name, "up")
	}
}

// Do runs f on an OS thread that has joined the namespace. Sockets f
// creates belong to the namespace for their whole life, wherever they are
// used afterwards.
func (n *NS) Do(f func() error) error { return netns.Do(n.Name, f) }

// DialContext dials from inside the namespace; use it as an
// http.Transport's DialContext.
func (n *NS) DialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	return netns.Dialer(n.Name)(ctx, network, addr)
}

func run(t testing.TB, name string, args ...string) {
	t.Helper()
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v: %s", name, strings.Join(args, " "), err, out)
	}
}

// RESTConfig is the client config of a kubeconfig, dialing from inside the
// namespace (where the cluster's endpoint is reachable).
func (n *NS) RESTConfig(kubeconfig string) (*rest.Config, error) {
	rc, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return nil, err
	}
	rc.Dial = n.DialContext
	rc.Timeout = 10 * time.Second
	return rc, nil
}

// KubeVersion asks the API server of a kubeconfig for /version from inside
// the namespace and returns its gitVersion.
func (n *NS) KubeVersion(kubeconfig string) (string, error) {
	rc, err := n.RESTConfig(kubeconfig)
	if err != nil {
		return "", err
	}
	dc, err := discovery.NewDiscoveryClientForConfig(rc)
	if err != nil {
		return "", err
	}
	v, err := dc.ServerVersion()
	if err != nil {
		return "", err
	}
	return v.GitVersion, nil
}

// Forward makes a TCP service on the host's loopback (addr, e.g. an
// envtest API server on 127.0.0.1:PORT) reachable at the same address
// inside the namespace, so programs confined there (no route out) can use
// it without the namespace getting any other way out. It stops when the
// test ends.
func (n *NS) Forward(t testing.TB, addr string) {
	t.Helper()
	host, _, err := net.SplitHostPort(addr)
	if err != nil || !net.ParseIP(host).IsLoopback() {
		t.Fatalf("forward %s: only loopback addresses are forwarded", addr)
	}
	var l net.Listener
	if err := n.Do(func() error {
		var err error
		l, err = net.Listen("tcp", addr)
		return err
	}); err != nil {
		t.Fatalf("listen on %s in %s: %v", addr, n.Name, err)
	}
	relay(t, l, func() (net.Conn, error) { return net.Dial("tcp", addr) })
}

// Expose is Forward the other way round: a TCP service reachable inside
// the namespace (addr, e.g. a webhook server on 127.0.0.1:9443 there, or
// an emulated node on the namespace's own network) becomes reachable on
// the host's loopback, at the address Expose returns, for the API server
// or the test to call. The connection is made from inside the namespace,
// so it reaches only what the namespace reaches. It stops when the test
// ends.
func (n *NS) Expose(t testing.TB, addr string) string {
	t.Helper()
	if _, _, err := net.SplitHostPort(addr); err != nil {
		t.Fatalf("expose %s: %v", addr, err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	relay(t, l, func() (net.Conn, error) { return n.DialContext(context.Background(), "tcp", addr) })
	return l.Addr().String()
}

// relay accepts on l until the test ends and pipes each connection to
// one that dial opens.
func relay(t testing.TB, l net.Listener, dial func() (net.Conn, error)) {
	var wg sync.WaitGroup
	t.Cleanup(func() {
		l.Close()
		wg.Wait()
	})
	var conns sync.Map
	wg.Go(func() {
		defer conns.Range(func(c, _ any) bool { c.(net.Conn).Close(); return true })
		for {
			in, err := l.Accept()
			if err != nil {
				return
			}
			out, err := dial()
			if err != nil {
				in.Close()
				continue
			}
			conns.Store(in, nil)
			conns.Store(out, nil)
			go pipe(in, out, &conns)
		}
	})
}

// pipe copies both ways until either side closes.
func pipe(a, b net.Conn, conns *sync.Map) {
	done := make(chan struct{}, 2)
	cp := func(dst, src net.Conn) {
		buf := make([]byte, 32<<10)
		_, _ = io.CopyBuffer(dst, src, buf)
		if tc, ok := dst.(*net.TCPConn); ok {
			_ = tc.CloseWrite()
		}
		done <- struct{}{}
	}
	go cp(a, b)
	go cp(b, a)
	<-done
	<-done
	a.Close()
	b.Close()
	conns.Delete(a)
	conns.Delete(b)
}
