//go:build integration

package lab

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"cozy.dev/cozy/internal/testing/netnstest"
	"cozy.dev/cozy/internal/testing/prereq"
)

// The lab's namespace holds the bridge with the server address and one tap
// per VM on it; a second `up` is refused; `down` removes everything and can
// run twice.
func TestNetworkUpDown(t *testing.T) {
	c := testLab(t, "t", 2)
	ctx := context.Background()
	t.Cleanup(func() { _ = Down(ctx, &c, false) })
	if err := createNetwork(ctx, c.Name, c.Machines()); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command("ip", "-n", Namespace(c.Name), "-br", "addr").CombinedOutput()
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"br0", "192.168.77.1/24", "tap0", "tap1"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("namespace lacks %s:\n%s", want, out)
		}
	}
	links, _ := exec.Command("ip", "-n", Namespace(c.Name), "-br", "link", "show", "master", Bridge).CombinedOutput()
	if !strings.Contains(string(links), "tap0") || !strings.Contains(string(links), "tap1") {
		t.Errorf("taps are not on the bridge:\n%s", links)
	}
	if routes, _ := exec.Command("ip", "-n", Namespace(c.Name), "route").CombinedOutput(); strings.Contains(string(routes), "default") {
		t.Errorf("the lab has a default route:\n%s", routes)
	}
	if err := createNetwork(ctx, c.Name, c.Machines()); err == nil || !strings.Contains(err.Error(), "lab down") {
		t.Errorf("a second up: %v", err)
	}
	for i := range 2 {
		if err := Down(ctx, &c, false); err != nil {
			t.Fatalf("down #%d: %v", i+1, err)
		}
	}
	if namespaceExists(Namespace(c.Name)) {
		t.Error("the namespace survived down")
	}
	st, err := Status(&c)
	if err != nil || len(st) != 2 || st[0].VM != "stopped" {
		t.Errorf("status of a lab that is down: %+v, %v", st, err)
	}
	if _, err := Console(&c, "nope"); err == nil || !strings.Contains(err.Error(), "cp1, w1") {
		t.Errorf("console of an unknown node: %v", err)
	}
}

// TestInternet: with --internet a VM on the lab's bridge reaches a
// server beyond "this machine" (here a namespace standing in for it,
// with a namespace beyond as the internet), NATed twice: the server sees
// the outside address only, and has no route back to the lab. Without
// it, and after disableInternet (harmless twice), nothing gets out.
func TestInternet(t *testing.T) {
	c := testLab(t, "i", 1)
	ctx := context.Background()
	outside, inet, vm := netnstest.New(t, "host"), netnstest.New(t, "inet"), netnstest.New(t, "vm")
	t.Cleanup(func() { _ = deleteNetwork(ctx, c.Name); _ = disableInternet(ctx, c.Name, outside.Name) })
	if err := createNetwork(ctx, c.Name, c.Machines()); err != nil {
		t.Fatal(err)
	}
	netnstest.Veth(t, outside, "o-inet", "203.0.113.1/24", inet, "i-host", "203.0.113.2/24")
	// A VM's NIC: a veth whose other end is a port of the lab's bridge.
	vm.IP(t, "link", "add", "eth0", "type", "veth", "peer", "name", "vmport", "netns", Namespace(c.Name))
	vm.IP(t, "addr", "add", "192.168.77.50/24", "dev", "eth0")
	vm.IP(t, "link", "set", "eth0", "up")
	vm.IP(t, "route", "add", "default", "via", ServerIP.String())
	if err := ip(ctx, "-n", Namespace(c.Name), "link", "set", "vmport", "master", Bridge, "up"); err != nil {
		t.Fatal(err)
	}

	var ln net.Listener
	if err := inet.Do(func() (err error) { ln, err = net.Listen("tcp4", "203.0.113.2:0"); return err }); err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	seen := make(chan string, 4)
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			seen <- conn.RemoteAddr().(*net.TCPAddr).IP.String()
			_, _ = io.Copy(conn, conn)
			conn.Close()
		}
	}()
	reach := func() error {
		return vm.Do(func() error {
			conn, err := net.DialTimeout("tcp4", ln.Addr().String(), 3*time.Second)
			if err != nil {
				return err
			}
			defer conn.Close()
			if _, err := conn.Write([]byte("cozy")); err != nil {
				return err
			}
			_ = conn.(*net.TCPConn).CloseWrite()
			got, err := io.ReadAll(conn)
			if err == nil && string(got) != "cozy" {
				err = fmt.Errorf("echo %q", got)
			}
			return err
		})
	}

	if err := reach(); err == nil {
		t.Fatal("the VM got out of a lab without --internet")
	}
	if err := enableInternet(ctx, c.Name, outside.Name); err != nil {
		t.Fatal(err)
	}
	if err := reach(); err != nil {
		t.Fatalf("with --internet: %v", err)
	}
	if from := <-seen; from != "203.0.113.1" {
		t.Errorf("the server saw %s, want the outside address 203.0.113.1 (NAT)", from)
	}
	for i := range 2 {
		if err := disableInternet(ctx, c.Name, outside.Name); err != nil {
			t.Fatalf("disable #%d: %v", i+1, err)
		}
	}
	if err := reach(); err == nil {
		t.Error("the VM still gets out after disableInternet")
	}
	if out, _ := outside.Command(ctx, "nft", "list", "tables").CombinedOutput(); strings.Contains(string(out), "cozy-lab-") {
		t.Errorf("the lab's nftables table survived:\n%s", out)
	}
}

// testLab is the config of a lab of nodes VMs named prefix and this
// process's ID (so concurrent test runs do not meet), in a temporary dir.
func testLab(t *testing.T, prefix string, nodes int) Config {
	t.Helper()
	if os.Geteuid() != 0 {
		prereq.Missing(t, "network namespaces need root")
	}
	c := Config{Name: fmt.Sprintf("%s%d", prefix, os.Getpid()), Nodes: nodes, Dir: t.TempDir()}
	c, err := c.WithDefaults()
	if err != nil {
		t.Fatal(err)
	}
	return c
}
