//go:build integration

package bootstrap_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/siderolabs/talos/pkg/machinery/api/machine"
	"github.com/siderolabs/talos/pkg/machinery/client"
	clientconfig "github.com/siderolabs/talos/pkg/machinery/client/config"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	grpcstatus "google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"cozy.dev/cozy/bootstrap"
	"cozy.dev/cozy/bootstrap/leave"
	"cozy.dev/cozy/bootstrap/state"
)

// TestNodeRemove takes a worker and then a control plane out of a rack of
// three control planes and a worker with `cozyctl node remove`, while
// etcd is sampled every 100 ms: the worker's Node is cordoned, drained
// (its pod evicted) and deleted, the machine wiped and powered off; the
// removal of cp3 is killed at ten random moments and run again to the
// end: cp3 leaves etcd once and is reset once, and etcd keeps a quorum
// throughout; the second control plane is refused with the numbers,
// changing nothing; a name not in the rack is refused; a second run of a
// removal finds nothing left to do.
func TestNodeRemove(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	r, rc := haRack(ctx, t, 3, 1)
	kc := kubernetes.NewForConfigOrDie(rc)
	cozy := func(args ...string) (string, string, error) { return r.cozyctl(ctx, args...) }
	remove := func(args ...string) bootstrap.Removed {
		t.Helper()
		out, stderr, err := cozy(append([]string{"node", "remove"}, args...)...)
		if err != nil {
			t.Fatalf("node remove %v: %v\n%s", args, err, tail(stderr, 30))
		}
		var res bootstrap.Removed
		if err := json.Unmarshal([]byte(out), &res); err != nil {
			t.Fatalf("node remove -o json: %v: %s", err, out)
		}
		return res
	}

	// The worker's Node and a pod on it, as its kubelet and the scheduler
	// would leave them (the process tier runs no kubelet).
	if _, err := kc.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "w1"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// (and the default ServiceAccount the controller-manager would make;
	// the process tier runs none)
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default", Namespace: "default"}}
	if _, err := kc.CoreV1().ServiceAccounts("default").Create(ctx, sa, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "app", Namespace: "default"},
		Spec: corev1.PodSpec{NodeName: "w1", Containers: []corev1.Container{{Name: "app", Image: "registry.k8s.io/pause:3.10"}}}}
	if _, err := kc.CoreV1().Pods("default").Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	if _, stderr, err := cozy("node", "remove", "w9"); err == nil || !strings.Contains(stderr, `no machine "w9" in the rack (its machines: cp1, cp2, cp3, w1)`) {
		t.Errorf("remove a machine not in the rack: %v\n%s", err, stderr)
	}
	plan := remove("w1", "--dry-run")
	if !plan.DryRun || !plan.Answers || !plan.HasNode || plan.Cordoned {
		t.Errorf("dry run %+v, want a plan for an answering w1 with a Node, nothing done", plan)
	}
	if n, err := kc.CoreV1().Nodes().Get(ctx, "w1", metav1.GetOptions{}); err != nil || n.Spec.Unschedulable {
		t.Fatalf("after the dry run, Node w1: %v, unschedulable %v: want it untouched", err, n.Spec.Unschedulable)
	}

	w1 := r.nodes[3]
	res := remove("w1")
	if !res.Cordoned || !slices.Equal(res.Evicted, []string{"default/app"}) || !res.NodeDeleted || res.Reset != "wiped (system), powered off" {
		t.Errorf("remove w1: %+v, want cordoned, default/app evicted, wiped and off, Node deleted", res)
	}
	waitExit(t, w1, "w1")
	if _, err := os.Stat(filepath.Join(w1.dir, "config.yaml")); !os.IsNotExist(err) {
		t.Errorf("w1's config is still on its disk after the remove (stat: %v)", err)
	}
	if _, err := kc.CoreV1().Nodes().Get(ctx, "w1", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("Node w1 after the remove: %v, want not found", err)
	}
	if got, err := kc.CoreV1().Pods("default").Get(ctx, "app", metav1.GetOptions{}); err == nil && got.DeletionTimestamp == nil {
		t.Errorf("the pod on w1 was not evicted")
	}

	// cp3 leaves while etcd is sampled: `node remove cp3` is killed at
	// ten random moments, then run to the end.
	s := sampleEtcd(t, r, r.nodes[0], r.nodes[1], r.nodes[2])
	start := time.Now()
	r.killedRuns(ctx, 200*time.Millisecond, 2800*time.Millisecond, "node", "remove", "cp3")
	res = remove("cp3")
	took := time.Since(start)
	samples := s.stop()
	if !res.Already && res.Reset == "" {
		t.Errorf("remove cp3, the last run: %+v, want it removed", res)
	}
	cp3 := r.nodes[2]
	waitExit(t, cp3, "cp3")
	t.Logf("remove cp3, killed 10 times, then to the end: %v; etcd sampled every 100 ms: %s", took.Round(100*time.Millisecond), samples)
	if samples.failed > 0 || samples.belowQuorum > 0 || samples.n < 10 {
		t.Errorf("etcd through the removal: %s; want a quorum of members answering in every sample", samples)
	}
	if got := etcdMembersThrough(t, r, r.nodes[0]); !slices.Equal(got, []string{"cp1", "cp2"}) {
		t.Errorf("members after the removal %v, want cp1 and cp2", got)
	}
	for what, line := range map[string]string{"left etcd": "left etcd: member removed", "was reset": "power transition requested"} {
		if n := strings.Count(cp3.log.String(), line); n != 1 {
			t.Errorf("cp3 %s %d times, want once", what, n)
		}
	}
	if _, err := os.Stat(filepath.Join(cp3.dir, "config.yaml")); !os.IsNotExist(err) {
		t.Errorf("cp3's config is still on its disk after the remove (stat: %v)", err)
	}

	// The second of three: refused before anything changes.
	_, stderr, err := cozy("node", "remove", "cp2")
	if err == nil || !strings.Contains(stderr, leave.ErrQuorum.Error()) ||
		!strings.Contains(stderr, "needs 2 of the 2 etcd members (cp1, cp2) healthy without it, and 1 are (cp1)") {
		t.Errorf("remove cp2 of the two left: %v\n%s", err, stderr)
	}
	if _, err := kc.CoreV1().Namespaces().Get(ctx, "default", metav1.GetOptions{}); err != nil {
		t.Errorf("the API after the refusal: %v", err)
	}
	if got := etcdMembersThrough(t, r, r.nodes[1]); !slices.Equal(got, []string{"cp1", "cp2"}) {
		t.Errorf("members after the refusal %v, want cp1 and cp2", got)
	}
	// Refusals record nothing: cp2 is ready in the state dir as before,
	// and the name not in the rack has no entry.
	st, err := state.Read(r.stateDir)
	if err != nil {
		t.Fatal(err)
	}
	if n := st.Nodes["cp2"]; n == nil || n.Phase != state.Ready {
		t.Errorf("cp2 in the state dir after the refusal: %+v, want ready", n)
	}
	if n, ok := st.Nodes["w9"]; ok {
		t.Errorf("the state dir has an entry for w9, a name not in the rack: %+v", n)
	}

	again := remove("cp3")
	if !again.Already {
		t.Errorf("a second remove of cp3: %+v, want nothing left to do", again)
	}
}

// waitExit waits for a machine powered off by its reset: the emulated
// node's process ends.
func waitExit(t *testing.T, n *emuNode, name string) {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- n.cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("%s exited: %v, want a clean power-off", name, err)
		}
	case <-time.After(time.Minute):
		t.Fatalf("%s still runs a minute after its reset", name)
	}
}

// talosClient is an admin Talos client of one node, dialled inside the
// rig's namespace.
func talosClient(t *testing.T, r *rackRig, n *emuNode) *client.Client {
	t.Helper()
	tc, err := clientconfig.Open(filepath.Join(r.stateDir, bootstrap.TalosDir, "talosconfig"))
	if err != nil {
		t.Fatal(err)
	}
	// Reconnect within 200 ms of a node's return: gRPC's default backoff
	// (up to 2 min) would report a node back for seconds as still down.
	c, err := client.New(context.Background(), client.WithConfig(tc), client.WithEndpoints(n.ip),
		client.WithGRPCDialOptions(grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
			return r.ns.DialContext(ctx, "tcp", addr)
		}), grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           backoff.Config{BaseDelay: 100 * time.Millisecond, Multiplier: 1, MaxDelay: 200 * time.Millisecond},
			MinConnectTimeout: time.Second,
		})))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

func etcdMembersThrough(t *testing.T, r *rackRig, n *emuNode) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := talosClient(t, r, n).EtcdMemberList(ctx, &machine.EtcdMemberListRequest{})
	if err != nil {
		t.Fatalf("etcd members through %s: %v", n.host, err)
	}
	var names []string
	for _, m := range resp.GetMessages()[0].GetMembers() {
		if !m.GetIsLearner() {
			names = append(names, m.GetHostname())
		}
	}
	slices.Sort(names)
	return names
}

// etcdSamples is what sampleEtcd saw.
type etcdSamples struct {
	n int
	// failed: no control plane listed the members; belowQuorum: fewer
	// members answered than a quorum of the voters listed; noLeader: the
	// first member that answered knew no leader (a leader election).
	failed, belowQuorum, noLeader int
	slow                          int // answers slower than 1 s
	fewest                        int // voters
	last                          []string
	firstErr                      error
	// belowErrs say why members did not answer, in the first samples
	// below quorum.
	belowErrs []string
}

func (s etcdSamples) String() string {
	msg := fmt.Sprintf("%d samples, %d failed, %d below quorum, %d during a leader election, %d member answers slower than 1 s, fewest voters %d",
		s.n, s.failed, s.belowQuorum, s.noLeader, s.slow, s.fewest)
	if s.firstErr != nil {
		msg += "; first error: " + s.firstErr.Error()
	}
	for _, e := range s.belowErrs {
		msg += "\n  below quorum: " + e
	}
	return msg
}

type etcdSampler struct {
	cancel context.CancelFunc
	wg     sync.WaitGroup
	s      etcdSamples
}

// sampleEtcd asks every node of nodes, every 100 ms, for its etcd's
// status, and the first that answers for the members, until stop: each
// sample counts the members whose node refuses the connection (down:
// rebooting, or off) against a quorum of the voters.
func sampleEtcd(t *testing.T, r *rackRig, nodes ...*emuNode) *etcdSampler {
	var clients []*client.Client
	for _, n := range nodes {
		clients = append(clients, talosClient(t, r, n))
	}
	ctx, cancel := context.WithCancel(context.Background())
	sm := &etcdSampler{cancel: cancel, s: etcdSamples{fewest: 1 << 30}}
	status := func(c *client.Client) (leader bool, err error) {
		cctx, ccancel := context.WithTimeout(ctx, time.Second)
		defer ccancel()
		st, err := c.EtcdStatus(cctx)
		if err != nil {
			return false, err
		}
		return st.GetMessages()[0].GetMemberStatus().GetLeader() != 0, nil
	}
	voters := func(c *client.Client) ([]string, error) {
		cctx, ccancel := context.WithTimeout(ctx, time.Second)
		defer ccancel()
		members, err := c.EtcdMemberList(cctx, &machine.EtcdMemberListRequest{})
		if err != nil {
			return nil, err
		}
		var out []string
		for _, m := range members.GetMessages()[0].GetMembers() {
			if !m.GetIsLearner() {
				out = append(out, m.GetHostname())
			}
		}
		slices.Sort(out)
		return out, nil
	}
	sm.wg.Go(func() {
		for ctx.Err() == nil {
			up, leaderKnown := 0, false
			var list []string
			var listErr error = errors.New("no member answered")
			var downErrs []string
			for i, c := range clients {
				leader, err := status(c)
				if err != nil {
					// Refused: the node is down (rebooting). Slower than
					// the timeout: not known down; counted, not held
					// against the quorum.
					if grpcstatus.Code(err) == codes.Unavailable {
						downErrs = append(downErrs, nodes[i].host+": "+err.Error())
					} else {
						sm.s.slow++
						up++
					}
					continue
				}
				if up == 0 {
					leaderKnown = leader
				}
				up++
				if list == nil {
					list, listErr = voters(c)
				}
			}
			if ctx.Err() != nil {
				return
			}
			sm.s.n++
			switch {
			case list == nil:
				sm.s.failed++
				if sm.s.firstErr == nil {
					sm.s.firstErr = listErr
				}
			default:
				if up < len(list)/2+1 {
					sm.s.belowQuorum++
					if len(sm.s.belowErrs) < 5 {
						sm.s.belowErrs = append(sm.s.belowErrs, strings.Join(downErrs, "; "))
					}
				}
				if !leaderKnown {
					sm.s.noLeader++
				}
				sm.s.fewest = min(sm.s.fewest, len(list))
				sm.s.last = list
			}
			select {
			case <-ctx.Done():
			case <-time.After(100 * time.Millisecond):
			}
		}
	})
	return sm
}

func (sm *etcdSampler) stop() etcdSamples {
	sm.cancel()
	sm.wg.Wait()
	return sm.s
}

// TestNodeAdd grows a bootstrapped rack of a control plane and a worker
// by a second worker with `cozyctl node add`: refused before the cluster
// exists and while the rack has nothing new; then the new machine
// netboots, is installed and joins, and the others are not touched (no
// config applied to them again, etcd not bootstrapped again).
func TestNodeAdd(t *testing.T) {
	r := newRackRig(t, 1, 2)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	full, err := os.ReadFile(r.rackFile)
	if err != nil {
		t.Fatal(err)
	}
	w2 := r.nodes[2]
	cut := bytes.Index(full, []byte("  - hostname: w2"))
	if cut < 0 {
		t.Fatalf("no w2 in the rig's rack:\n%s", full)
	}
	if err := os.WriteFile(r.rackFile, full[:cut], 0o644); err != nil {
		t.Fatal(err)
	}
	if _, stderr, err := r.cozyctl(ctx, "node", "add"); err == nil || !strings.Contains(stderr, "holds no bootstrapped cluster: cozyctl bootstrap builds it") {
		t.Errorf("node add before a bootstrap: %v\n%s", err, stderr)
	}

	p := r.bootstrap()
	defer r.failLogs(p)
	r.bootSome(ctx, r.nodes[:2]...)
	for range p.events {
	}
	if err := <-p.done; err != nil {
		t.Fatalf("bootstrap: %v", err)
	}
	if _, stderr, err := r.cozyctl(ctx, "node", "add"); err == nil || !strings.Contains(stderr, bootstrap.ErrNothingToAdd.Error()) {
		t.Errorf("node add with nothing new: %v\n%s", err, stderr)
	}

	if err := os.WriteFile(r.rackFile, full, 0o644); err != nil {
		t.Fatal(err)
	}
	applied := func(n *emuNode) int { return strings.Count(n.log.String(), "machine config applied") }
	before := map[string]int{"cp1": applied(r.nodes[0]), "w1": applied(r.nodes[1])}
	add := r.bringUp([]string{"node", "add"})
	defer r.failLogs(add)
	r.bootSome(ctx, w2)
	phases := map[string][]state.Phase{}
	for e := range add.events {
		if e.Node != "" {
			if l := phases[e.Node]; len(l) == 0 || l[len(l)-1] != e.Phase {
				phases[e.Node] = append(l, e.Phase)
			}
		}
	}
	if err := <-add.done; err != nil {
		t.Fatalf("node add: %v\n%s", err, tail(add.stderr.String(), 30))
	}
	if got := phaseList(phases["w2"]); got != "pending discovered applied configured ready" {
		t.Errorf("w2 went through %q, want it installed", got)
	}
	for i, host := range []string{"cp1", "w1"} {
		if got := phaseList(phases[host]); got != "ready" {
			t.Errorf("%s went through %q, want it left alone", host, got)
		}
		if n := applied(r.nodes[i]); n != before[host] {
			t.Errorf("%s took a config %d times during the add, want none", host, n-before[host])
		}
	}
	if n := strings.Count(r.nodes[0].log.String(), bootstrapLogLine); n != 1 {
		t.Errorf("etcd bootstrapped %d times on cp1, want once", n)
	}
	st, err := state.Read(r.stateDir)
	if err != nil {
		t.Fatal(err)
	}
	if ph := st.Nodes["w2"].Phase; ph != state.Ready {
		t.Errorf("w2 is %s in the state dir, want ready", ph)
	}
}
