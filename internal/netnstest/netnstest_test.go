//go:build integration

package netnstest

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"testing"

	"cozy.dev/cozy/internal/prereq"
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
	if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", name).Run() })
	sweepOrphans()
	if _, err := os.Stat("/run/netns/" + name); err == nil {
		t.Fatalf("orphan namespace %s survived the sweep", name)
	}
}
