//go:build integration

package lab

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"

	"cozy.dev/cozy/internal/prereq"
)

// The lab's namespace holds the bridge with the server address and one tap
// per VM on it; a second `up` is refused; `down` removes everything and can
// run twice.
func TestNetworkUpDown(t *testing.T) {
	if os.Geteuid() != 0 {
		prereq.Missing(t, "network namespaces need root")
	}
	c := Config{Name: fmt.Sprintf("t%d", os.Getpid()), Nodes: 2, Dir: t.TempDir()}
	if err := c.SetDefaults(); err != nil {
		t.Fatal(err)
	}
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
