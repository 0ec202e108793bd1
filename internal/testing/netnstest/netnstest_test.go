//go:build integration

package netnstest

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"testing"

	"cozy.dev/cozy/internal/netns"
	"cozy.dev/cozy/internal/testing/prereq"
)

func TestNamespaces(t *testing.T) {
	a := New(t, "a")
	b := New(t, "b")
	Veth(t, a, "a0", "10.99.0.1/30", b, "b0", "10.99.0.2/30")

	if _, err := net.InterfaceByName("a0"); err == nil {
		t.Fatal("a0 exists in the test's own namespace")
	}
	err := a.Do(func() error {
		if _, err := net.InterfaceByName("a0"); err != nil {
			return fmt.Errorf("a0 not in its namespace: %w", err)
		}
		// A socket made here lives here: reach b over the veth pair.
		ln, err := net.Listen("tcp4", "10.99.0.1:0")
		if err != nil {
			return err
		}
		defer ln.Close()
		port := ln.Addr().(*net.TCPAddr).Port
		go func() {
			if c, err := ln.Accept(); err == nil {
				c.Close()
			}
		}()
		return b.Do(func() error {
			c, err := net.Dial("tcp4", fmt.Sprintf("10.99.0.1:%d", port))
			if err == nil {
				c.Close()
			}
			return err
		})
	})
	if err != nil {
		t.Fatal(err)
	}
}

// A namespace whose test process died is removed by the next test run.
func TestSweepsOrphans(t *testing.T) {
	if os.Geteuid() != 0 {
		prereq.Missing(t, "network namespaces need root")
	}
	dead := exec.Command("true")
	if err := dead.Run(); err != nil {
		t.Fatal(err)
	}
	name := fmt.Sprintf("%s%d-1-orphan", prefix, dead.Process.Pid)
	// Through netns.Add, like every namespace Cozy makes: a bare `ip
	// netns add` racing another package's first one can leave that
	// package's namespace unenterable.
	if err := netns.Add(context.Background(), name); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", name).Run() })
	sweepOrphans()
	if _, err := os.Stat("/run/netns/" + name); err == nil {
		t.Fatalf("orphan namespace %s survived the sweep", name)
	}
}

// Forward makes a host loopback service reachable inside a namespace at the
// same address, both ways, and nothing else.
func TestForward(t *testing.T) {
	ns := New(t, "fwd")
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go echo(ln)
	ns.Forward(t, ln.Addr().String())

	err = ns.Do(func() error {
		c, err := net.Dial("tcp4", ln.Addr().String())
		if err != nil {
			return err
		}
		defer c.Close()
		msg := bytes.Repeat([]byte("cozy "), 20000) // larger than one copy buffer
		go func() { _, _ = c.Write(msg); _ = c.(*net.TCPConn).CloseWrite() }()
		got, err := io.ReadAll(c)
		if err != nil {
			return err
		}
		if !bytes.Equal(got, msg) {
			return fmt.Errorf("echo: %d bytes back, want %d", len(got), len(msg))
		}
		// Only that address is forwarded.
		if c, err := net.Dial("tcp4", "127.0.0.1:1"); err == nil {
			c.Close()
			return fmt.Errorf("127.0.0.1:1 answers inside the namespace")
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// Expose makes a service inside a namespace reachable on the host's
// loopback at a fresh port; the namespace's own address is not reachable
// from the host.
func TestExpose(t *testing.T) {
	ns := New(t, "expose")
	var ln net.Listener
	if err := ns.Do(func() error {
		var err error
		ln, err = net.Listen("tcp4", "127.0.0.1:0")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go echo(ln)
	addr := ns.Expose(t, ln.Addr().String())
	if addr == ln.Addr().String() {
		t.Fatalf("exposed at %s, the namespace's own address", addr)
	}
	c, err := net.Dial("tcp4", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	msg := bytes.Repeat([]byte("cozy "), 20000)
	go func() { _, _ = c.Write(msg); _ = c.(*net.TCPConn).CloseWrite() }()
	got, err := io.ReadAll(c)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, msg) {
		t.Fatalf("echo: %d bytes back, want %d", len(got), len(msg))
	}
}

// echo serves ln until it closes, sending back what each connection sends.
func echo(ln net.Listener) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		go func() { defer c.Close(); _, _ = io.Copy(c, c) }()
	}
}
