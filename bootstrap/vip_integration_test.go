//go:build integration

package bootstrap_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"cozy.dev/cozy/internal/testing/poll"
)

// TestVIPTakeover: the control plane that holds the VIP loses power, its
// NIC dark and its processes gone at once, with no time to let the VIP
// go. Another control plane takes the VIP once the dead holder's lease
// expires (10 s), announces it, and the API answers through the VIP
// again, from the two control planes left (etcd's quorum).
func TestVIPTakeover(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	r, dead, hc, url := vipRack(ctx, t)
	if err := getOK(ctx, hc, url); err != nil {
		t.Fatalf("the API through the VIP, before: %v", err)
	}
	takes := r.vipTakes()

	// Power lost: the NIC first, so that nothing of the node answers for
	// the VIP any more, then every process of it (its etcd and
	// kube-apiserver die with it).
	dead.ns.IP(t, "link", "set", dead.iface, "down")
	if err := dead.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	lost := time.Now()
	var failed int
	wait, cancelWait := context.WithDeadline(ctx, lost.Add(2*time.Minute))
	defer cancelWait()
	poll.Until(t, wait, 100*time.Millisecond, "the API through the VIP within 2 min after its holder, "+dead.host+", lost power", func() error {
		err := getOK(ctx, hc, url)
		if err != nil {
			failed++
		}
		return err
	})
	back := time.Since(lost)

	took := r.vipTookOver(t, takes)
	if len(took) != 1 || took[0] == dead.host {
		t.Errorf("after %s lost power, %v took the VIP, want one other control plane", dead.host, took)
	}
	t.Logf("%s held the VIP and lost power; %v took it, and the API answered through it again %v later (%d reads failed meanwhile, 1 s timeout, 100 ms apart)",
		dead.host, took, back.Round(100*time.Millisecond), failed)
}

// TestVIPPartition: the control plane that holds the VIP is cut off from
// the rest of the rack while it runs (its link taken off the rack's
// bridge). Its etcd loses its quorum, so its lease cannot be kept alive:
// it must drop the VIP, while another control plane takes it and the API
// answers through it. When the link comes back, exactly one control
// plane has the VIP on its NIC: two would answer ARP for it, and clients
// would flap between them.
func TestVIPPartition(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	r, cut, hc, url := vipRack(ctx, t)
	takes := r.vipTakes()
	released := strings.Count(cut.log.String(), vipReleased)

	r.ns.IP(t, "link", "set", cut.port, "nomaster")
	start := time.Now()
	wait, cancelWait := context.WithDeadline(ctx, start.Add(2*time.Minute))
	defer cancelWait()
	within := func(what string, cond func() error) time.Duration {
		t.Helper()
		poll.Until(t, wait, 100*time.Millisecond, what+" within 2 min of "+cut.host+"'s partition", cond)
		return time.Since(start)
	}
	lost := strings.Count(cut.log.String(), vipLost)
	dropped := within(cut.host+" drops the VIP", func() error {
		if strings.Count(cut.log.String(), vipReleased) == released || hasVIP(t, cut) {
			return fmt.Errorf("it still has %s", rigVIP)
		}
		return nil
	})
	if strings.Count(cut.log.String(), vipLost) == lost {
		t.Errorf("%s dropped the VIP without saying it lost its lease (%q)", cut.host, vipLost)
	}
	answers := within("the API through the VIP", func() error { return getOK(ctx, hc, url) })
	took := r.vipTookOver(t, takes)
	t.Logf("%s cut off: it dropped the VIP after %v; %v took it, and the API answered through it after %v",
		cut.host, dropped.Round(100*time.Millisecond), took, answers.Round(100*time.Millisecond))
	if len(took) != 1 || took[0] == cut.host {
		t.Fatalf("%v took the VIP, want one other control plane", took)
	}

	// Healed: the new holder keeps the VIP, the old one does not take it
	// back, and nobody else has it.
	r.ns.IP(t, "link", "set", cut.port, "master", "br0")
	time.Sleep(15 * time.Second) // longer than a lease, and the old holder's campaigns
	var holders []string
	for _, n := range r.nodes {
		if hasVIP(t, n) {
			holders = append(holders, n.host)
		}
	}
	if len(holders) != 1 || holders[0] != took[0] {
		t.Errorf("after the partition healed, %v have %s on their NIC, want %s alone", holders, rigVIP, took[0])
	}
	if err := getOK(ctx, hc, url); err != nil {
		t.Errorf("the API through the VIP after the partition healed: %v", err)
	}
}

// What a node logs when it takes the VIP, when it takes it off its NIC,
// and when it cannot keep the VIP's lease alive.
const (
	vipTaken    = "vip: this node holds the shared address"
	vipReleased = "vip: released the shared address"
	vipLost     = "vip: lost the election"
)

// hasVIP reports whether the VIP is on the node's NIC.
func hasVIP(t *testing.T, n *emuNode) bool {
	t.Helper()
	out, err := exec.Command("ip", "-n", n.ns.Name, "-4", "-o", "addr", "show", "dev", n.iface).CombinedOutput()
	if err != nil {
		t.Fatalf("%s's addresses: %v: %s", n.host, err, out)
	}
	return strings.Contains(string(out), " "+rigVIP+"/32 ")
}

// vipHolder is the control plane whose log says last that it took the
// VIP, and has not let it go since.
func (r *rackRig) vipHolder(t *testing.T) string {
	t.Helper()
	for _, n := range r.nodes {
		l := n.log.String()
		if i := strings.LastIndex(l, vipTaken); i >= 0 && !strings.Contains(l[i:], vipReleased) {
			return n.host
		}
	}
	t.Fatal("no control plane holds the VIP")
	return ""
}

// vipMoves is how many times the rig's nodes have taken the VIP.
func (r *rackRig) vipMoves() int {
	n := 0
	for _, takes := range r.vipTakes() {
		n += takes
	}
	return n
}

// vipLast is the order an upgrade takes the rig's nodes in: the control
// planes with holder last, then the workers.
func (r *rackRig) vipLast(holder string) []string {
	var cps, workers []string
	for _, n := range r.nodes {
		switch {
		case n.role != "controlplane":
			workers = append(workers, n.host)
		case n.host != holder:
			cps = append(cps, n.host)
		}
	}
	return slices.Concat(cps, []string{holder}, workers)
}

// vipRack is a rack of three control planes behind a VIP, the one that
// holds the VIP, and a reader of the API through it.
func vipRack(ctx context.Context, t *testing.T) (r *rackRig, holder *emuNode, hc *http.Client, url string) {
	t.Helper()
	r, rc := haRack(ctx, t, 3, 0)
	hc, url = namespaceReader(t, rc)
	return r, r.node(r.vipHolder(t)), hc, url
}

// vipTakes is how many times each of the rig's nodes has taken the VIP.
func (r *rackRig) vipTakes() map[string]int {
	takes := map[string]int{}
	for _, n := range r.nodes {
		takes[n.host] = strings.Count(n.log.String(), vipTaken)
	}
	return takes
}

// vipTookOver are the nodes that have taken the VIP since before, once
// one has said so: a node logs that it holds the VIP after it put the
// address on its NIC and announced it, so a client can reach the API
// through the VIP a moment before the log says who took it.
func (r *rackRig) vipTookOver(t *testing.T, before map[string]int) []string {
	t.Helper()
	var took []string
	poll.Within(t, 30*time.Second, 100*time.Millisecond, "a control plane's log saying it took the VIP", func() error {
		if took = r.vipTakers(before); len(took) == 0 {
			return errors.New("no node has logged it")
		}
		return nil
	})
	return took
}

// vipTakers are the nodes that have taken the VIP since before.
func (r *rackRig) vipTakers(before map[string]int) []string {
	var took []string
	for host, n := range r.vipTakes() {
		if n > before[host] {
			took = append(took, host)
		}
	}
	slices.Sort(took)
	return took
}
