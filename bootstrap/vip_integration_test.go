//go:build integration

package bootstrap_test

import (
	"context"
	"strings"
	"testing"
	"time"
)

// TestVIPTakeover: the control plane that holds the VIP loses power, its
// NIC dark and its processes gone at once, with no time to let the VIP
// go. Another control plane takes the VIP once the dead holder's lease
// expires (10 s), announces it, and the API answers through the VIP
// again, from the two control planes left (etcd's quorum).
func TestVIPTakeover(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	r, rc := haRack(ctx, t, 3, 0)
	dead := r.node(r.vipHolder(t))
	hc, url := namespaceReader(t, rc)
	if err := getOK(ctx, hc, url); err != nil {
		t.Fatalf("the API through the VIP, before: %v", err)
	}
	takes := map[string]int{}
	for _, n := range r.nodes {
		takes[n.host] = strings.Count(n.log.String(), vipTaken)
	}

	// Power lost: the NIC first, so that nothing of the node answers for
	// the VIP any more, then every process of it (its etcd and
	// kube-apiserver die with it).
	dead.ns.IP(t, "link", "set", dead.iface, "down")
	if err := dead.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	lost := time.Now()
	var failed int
	for {
		err := getOK(ctx, hc, url)
		if err == nil {
			break
		}
		failed++
		if ctx.Err() != nil || time.Since(lost) > 2*time.Minute {
			t.Fatalf("the API through the VIP did not answer within 2 min after its holder, %s, lost power: %v", dead.host, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	back := time.Since(lost)

	var took []string
	for _, n := range r.nodes {
		if n != dead && strings.Count(n.log.String(), vipTaken) > takes[n.host] {
			took = append(took, n.host)
		}
	}
	if len(took) != 1 {
		t.Errorf("after %s lost power, %v took the VIP, want one other control plane", dead.host, took)
	}
	t.Logf("%s held the VIP and lost power; %v took it, and the API answered through it again %v later (%d reads failed meanwhile, 1 s timeout, 100 ms apart)",
		dead.host, took, back.Round(100*time.Millisecond), failed)
}
