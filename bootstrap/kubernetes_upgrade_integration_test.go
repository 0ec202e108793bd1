//go:build integration

package bootstrap_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"k8s.io/client-go/rest"

	"cozy.dev/cozy/bootstrap/upgrade"
	"cozy.dev/cozy/internal/testing/cozyctl"
)

// restartLine is what the emulated node logs when a config applied
// without a reboot restarts one of its Kubernetes components.
const restartLine = "restarting with the new machine config"

// TestKubernetesUpgrade runs `cozyctl upgrade kubernetes` on a rack of
// three control planes behind a VIP and a worker, from the
// kubernetesVersion the rack was bootstrapped with (1.36.1) to the one
// its rack file names next (1.36.3), killed at ten random moments and run
// again until it finishes, while etcd and the API through the VIP are
// sampled: every control plane's kube-apiserver is restarted once, on the
// binary of the new version, one control plane at a time; every node's
// config names the new images; a last run finds nothing to do.
//
// The process tier has one Kubernetes build (1.36.3): the nodes run it
// for 1.36.1 too (a version a node has no binary of runs the default
// binary, which reports its own version), and the upgrade moves
// kube-apiserver onto a second path to the same build (--kubernetes-assets),
// so the restart is real and the versions reported are not.
// TestKubernetesUpgradeVersions (`make e2e`) moves 1.35.4 binaries to
// 1.36.3 ones. Refused before anything changes: a --version other than
// the rack's, a version no node has a binary of (the pre-pull fails), and
// a downgrade.
func TestKubernetesUpgrade(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 12*time.Minute)
	defer cancel()
	alt := t.TempDir()
	if err := os.Symlink(filepath.Join(os.Getenv("KUBEBUILDER_ASSETS"), "kube-apiserver"), filepath.Join(alt, "kube-apiserver")); err != nil {
		t.Fatal(err)
	}
	const from, to = "v1.36.1", "v1.36.3"
	r, rc := haRackWith(ctx, t, 3, 1, "kubernetesVersion: "+from, []string{"--kubernetes-assets", alt})
	upgradeKubernetes(ctx, t, r, rc, from, to, func(t *testing.T, n *emuNode) {
		// One restart, on the second path.
		if got := strings.Count(n.log.String(), restartLine); n.role == "controlplane" && got != 1 || n.role != "controlplane" && got != 0 {
			t.Errorf("%s: %d restarts of its components, want one on a control plane and none on a worker", n.host, got)
		}
		if n.role == "controlplane" && !strings.Contains(n.log.String(), "binary="+filepath.Join(alt, "kube-apiserver")) {
			t.Errorf("%s: kube-apiserver was not restarted on %s", n.host, alt)
		}
	})
}

// upgradeKubernetes is the upgrade both Kubernetes upgrade tests run on
// a bootstrapped rack on from: the refusals, the plan, ten killed runs
// and one to the end, the samples, and a last run that does nothing;
// check looks at each node after.
func upgradeKubernetes(ctx context.Context, t *testing.T, r *rackRig, rc *rest.Config, from, to string, check func(*testing.T, *emuNode)) {
	t.Helper()
	rackYAML, err := os.ReadFile(r.rackFile)
	if err != nil {
		t.Fatal(err)
	}
	setVersion := func(v string) {
		t.Helper()
		y := strings.Replace(string(rackYAML), "kubernetesVersion: "+from, "kubernetesVersion: "+v, 1)
		if err := os.WriteFile(r.rackFile, []byte(y), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	cozy := func(args ...string) (string, string, error) { return r.cozyctl(ctx, args...) }
	restarts := func() int {
		n := 0
		for _, node := range r.nodes {
			n += strings.Count(node.log.String(), restartLine)
		}
		return n
	}

	// Refused before anything changes.
	if _, stderr, err := cozy("upgrade", "kubernetes", "--version", to); err == nil || !strings.Contains(stderr, "the rack file says cluster.kubernetesVersion "+from) {
		t.Errorf("--version other than the rack's: %v\n%s", err, stderr)
	}
	setVersion("v1.36.2")
	if _, stderr, err := cozy("upgrade", "kubernetes"); err == nil || !strings.Contains(stderr, "cannot pull registry.k8s.io/kube-apiserver:v1.36.2 (nothing was changed)") {
		t.Errorf("a version no node has: %v\n%s", err, tail(stderr, 10))
	}
	older := prevPatch(t, from)
	setVersion(older)
	if _, stderr, err := cozy("upgrade", "kubernetes"); err == nil || !strings.Contains(stderr, "it runs "+from+", newer than "+older+": Cozy does not downgrade") {
		t.Errorf("a downgrade: %v\n%s", err, tail(stderr, 10))
	}
	if n := restarts(); n != 0 {
		t.Fatalf("%d components restarted by refused upgrades", n)
	}

	setVersion(to)
	out, stderr, err := cozy("upgrade", "kubernetes", "--dry-run")
	if err != nil {
		t.Fatalf("dry run: %v\n%s", err, stderr)
	}
	var plan upgrade.KubernetesResult
	if err := json.Unmarshal([]byte(out), &plan); err != nil {
		t.Fatalf("dry run -o json: %v: %s", err, out)
	}
	// Each control-plane component on every control plane, then every
	// kubelet (the rack's CNI, Cilium, replaces kube-proxy: none to
	// upgrade).
	var got []string
	for _, s := range plan.Steps {
		got = append(got, s.Component+"/"+s.Node)
		if s.From != from || s.Result != "to upgrade" {
			t.Errorf("plan step %+v: want from %s, to upgrade", s, from)
		}
	}
	// The control planes in rack order but the VIP's holder, last.
	holder := r.vipHolder(t)
	var want []string
	for _, comp := range []string{"kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubelet"} {
		for _, n := range r.vipLast(holder) {
			if comp == "kubelet" || r.node(n).role == "controlplane" {
				want = append(want, comp+"/"+n)
			}
		}
	}
	if g, w := strings.Join(got, " "), strings.Join(want, " "); g != w {
		t.Errorf("plan:\n%s\nwant (%s holds the VIP):\n%s", g, holder, w)
	}

	moves := r.vipMoves()
	api := sampleAPI(t, rc)
	s := sampleEtcd(t, r, r.nodes[0], r.nodes[1], r.nodes[2])
	start := time.Now()
	r.killedRuns(ctx, 500*time.Millisecond, 4000*time.Millisecond, "upgrade", "kubernetes")
	out, stderr, err = cozy("upgrade", "kubernetes", "--timeout", "3m")
	took := time.Since(start)
	samples := s.stop()
	failures, requests := api.stop()
	if err != nil {
		t.Fatalf("upgrade: %v\n%s", err, tail(stderr, 30))
	}
	var res upgrade.KubernetesResult
	if err := json.Unmarshal([]byte(out), &res); err != nil {
		t.Fatalf("upgrade -o json: %v: %s", err, out)
	}
	t.Logf("Kubernetes upgrade of 4 nodes %s → %s, 10 runs killed, then one to the end: %v; etcd: %s; Kubernetes API through the VIP: %d of %d requests failed %v",
		from, to, took.Round(100*time.Millisecond), samples, failures, requests, api.errs)
	for _, st := range res.Steps {
		t.Logf("last run: %s %s: %s", st.Component, st.Node, st.Result)
	}
	if n := r.vipMoves() - moves; n != 1 {
		t.Errorf("the VIP moved %d times in the upgrade, want once: its holder, %s, restarts its kube-apiserver last", n, holder)
	}
	if samples.failed > 0 || samples.belowQuorum > 0 || samples.fewest < 3 {
		t.Errorf("etcd through the upgrade: %s; want a quorum of its 3 members answering in every sample", samples)
	}
	for _, n := range r.nodes {
		check(t, n)
	}
	// One control plane's kube-apiserver at a time: each stopped only
	// after the one before runs again.
	spans := apiServerRestarts(t, r)
	for i := 1; i < len(spans); i++ {
		if prev := spans[i-1]; !spans[i].stopped.After(prev.started) {
			t.Errorf("%s's kube-apiserver stopped at %s, before %s's ran again (%s): two down at once",
				spans[i].node, spans[i].stopped.Format("15:04:05.000"), prev.node, prev.started.Format("15:04:05.000"))
		}
	}

	// The rack file against what runs: in step, then a downgrade.
	validate := func() (string, error) {
		cmd := r.ns.Command(ctx, cozyctl.Path(t), "rack", "validate", r.rackFile, "--against-cluster", "--state-dir", r.stateDir)
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	if out, err := validate(); err != nil {
		t.Errorf("rack validate --against-cluster after the upgrade: %v\n%s", err, out)
	}
	setVersion(from)
	if out, err := validate(); err == nil || !strings.Contains(out, "cp1 (kube-apiserver, kube-controller-manager, kube-scheduler, kubelet): it runs "+to+", newer than "+from+": Cozy does not downgrade") ||
		!strings.Contains(out, "w1 (kubelet): it runs "+to) {
		t.Errorf("rack validate --against-cluster of a downgrade: %v\n%s", err, out)
	} else {
		t.Logf("rack validate --against-cluster of a downgrade:\n%s", out)
	}
	setVersion(to)

	out, stderr, err = cozy("upgrade", "kubernetes")
	if err != nil {
		t.Fatalf("upgrade again: %v\n%s", err, stderr)
	}
	var again upgrade.KubernetesResult
	if err := json.Unmarshal([]byte(out), &again); err != nil {
		t.Fatal(err)
	}
	if len(again.Steps) != len(plan.Steps) {
		t.Errorf("a last run has %d steps, want %d", len(again.Steps), len(plan.Steps))
	}
	for _, st := range again.Steps {
		if st.From != to || (st.Result != "already on the version" && !strings.HasPrefix(st.Result, "config only")) {
			t.Errorf("a last run: %+v, want nothing to do", st)
		}
	}
}

// restartSpan is one restart of a node's kube-apiserver onto a new
// config: when the node stopped the old process, and when the new one
// started.
type restartSpan struct {
	node             string
	stopped, started time.Time
}

// apiServerRestarts reads the control planes' kube-apiserver restarts
// from their logs, in the order they stopped.
func apiServerRestarts(t *testing.T, r *rackRig) []restartSpan {
	t.Helper()
	var spans []restartSpan
	for _, n := range r.nodes {
		open := -1 // the span whose new process has not started yet
		for _, l := range strings.Split(n.log.String(), "\n") {
			if !strings.Contains(l, "process=kube-apiserver") {
				continue
			}
			at, err := time.Parse(time.RFC3339Nano, strings.TrimPrefix(strings.Fields(l)[0], "time="))
			if err != nil {
				t.Fatalf("%s: a log line without its time: %q", n.host, l)
			}
			switch {
			case strings.Contains(l, restartLine):
				spans = append(spans, restartSpan{node: n.host, stopped: at})
				open = len(spans) - 1
			case strings.Contains(l, "process restarted with its new configuration") && open >= 0:
				spans[open].started = at
				open = -1
			}
		}
	}
	slices.SortFunc(spans, func(a, b restartSpan) int { return a.stopped.Compare(b.stopped) })
	return spans
}

// prevPatch is v with its patch number one lower.
func prevPatch(t *testing.T, v string) string {
	var major, minor, patch int
	if _, err := fmt.Sscanf(v, "v%d.%d.%d", &major, &minor, &patch); err != nil || patch == 0 {
		t.Fatalf("version %q: no patch before it (%v)", v, err)
	}
	return fmt.Sprintf("v%d.%d.%d", major, minor, patch-1)
}
