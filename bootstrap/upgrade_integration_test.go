//go:build integration

package bootstrap_test

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptrace"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/siderolabs/talos/pkg/machinery/gendata"
	"k8s.io/client-go/rest"

	"cozy.dev/cozy/bootstrap/upgrade"
)

// TestTalosUpgrade upgrades a rack of three control planes and a worker
// behind a VIP from the Talos version it was installed with to the next
// patch named in its rack file, with `cozyctl upgrade talos` killed at
// ten random moments and run again until it finishes, while etcd is
// sampled every 100 ms on every control plane and the Kubernetes API
// through the VIP: a quorum of etcd's three members answers in every
// sample,
// every node ends on the new version, each was asked to upgrade once,
// and a last run finds nothing to do. A --version other than the rack's
// and a downgrade are refused before anything changes (a jump of two
// minors: TestCheckStep; the rack file already refuses a Talos version
// its Kubernetes version does not run on).
func TestTalosUpgrade(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	r, rc := haRack(ctx, t, 3, 1)
	from := strings.TrimSpace(gendata.VersionTag)
	to := nextPatch(t, from)
	rackYAML, err := os.ReadFile(r.rackFile)
	if err != nil {
		t.Fatal(err)
	}
	setVersion := func(v string) {
		t.Helper()
		if err := os.WriteFile(r.rackFile, append(slices.Clone(rackYAML), []byte("talos: {version: "+v+"}\n")...), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	cozy := func(args ...string) (string, string, error) { return r.cozyctl(ctx, args...) }

	// Refused before anything changes.
	if _, stderr, err := cozy("upgrade", "talos", "--version", to); err == nil || !strings.Contains(stderr, "the rack file says talos.version "+from) {
		t.Errorf("--version other than the rack's: %v\n%s", err, stderr)
	}

	setVersion(to)
	out, stderr, err := cozy("upgrade", "talos", "--dry-run")
	if err != nil {
		t.Fatalf("dry run: %v\n%s", err, stderr)
	}
	var plan upgrade.Result
	if err := json.Unmarshal([]byte(out), &plan); err != nil {
		t.Fatalf("dry run -o json: %v: %s", err, out)
	}
	holder := r.vipHolder(t)
	if got, want := stepNames(plan), strings.Join(r.vipLast(holder), " "); got != want || plan.Nodes[0].From != from || plan.Nodes[0].Result != "to upgrade" {
		t.Errorf("plan %+v, want %s (the control planes, %s with the VIP last, then w1), from %s, to upgrade", plan, want, holder, from)
	}

	moves := r.vipMoves()
	api := sampleAPI(t, rc)
	s := sampleEtcd(t, r, r.nodes[0], r.nodes[1], r.nodes[2])
	start := time.Now()
	// Ten runs killed at random moments, then one to the end.
	r.killedRuns(ctx, 500*time.Millisecond, 4000*time.Millisecond, "upgrade", "talos")
	out, stderr, err = cozy("upgrade", "talos", "--timeout", "3m")
	took := time.Since(start)
	samples := s.stop()
	failures, requests := api.stop()
	if err != nil {
		t.Fatalf("upgrade: %v\n%s", err, tail(stderr, 30))
	}
	var res upgrade.Result
	if err := json.Unmarshal([]byte(out), &res); err != nil {
		t.Fatalf("upgrade -o json: %v: %s", err, out)
	}
	t.Logf("rolling Talos upgrade of 4 nodes %s → %s, 10 runs killed, then one to the end: %v; etcd: %s; Kubernetes API through the VIP: %d of %d requests failed",
		from, to, took.Round(100*time.Millisecond), samples, failures, requests)
	if n := r.vipMoves() - moves; n != 1 {
		t.Errorf("the VIP moved %d times in the upgrade, want once: its holder, %s, goes last", n, holder)
	}
	if samples.failed > 0 || samples.belowQuorum > 0 || samples.fewest < 3 || samples.n < 20 {
		t.Errorf("etcd through the upgrade: %s; want a quorum of its 3 members answering in every sample", samples)
	}
	for _, n := range r.nodes {
		if v := talosVersion(t, r, n); v != to {
			t.Errorf("%s runs %s after the upgrade, want %s", n.host, v, to)
		}
		if asked := strings.Count(n.log.String(), "upgrade request received"); asked != 1 {
			t.Errorf("%s was asked to upgrade %d times, want once", n.host, asked)
		}
	}

	out, stderr, err = cozy("upgrade", "talos")
	if err != nil {
		t.Fatalf("upgrade again: %v\n%s", err, stderr)
	}
	var again upgrade.Result
	if err := json.Unmarshal([]byte(out), &again); err != nil {
		t.Fatal(err)
	}
	for _, st := range again.Nodes {
		if st.Result != "already on the version" {
			t.Errorf("a last run: %s %s, want nothing to do", st.Node, st.Result)
		}
	}
	// Back to the old version in the rack: refused, nothing changes.
	setVersion(from)
	if _, stderr, err := cozy("upgrade", "talos"); err == nil || !strings.Contains(stderr, "it runs "+to+", newer than "+from+": Cozy does not downgrade") {
		t.Errorf("a downgrade: %v\n%s", err, stderr)
	}
}

func stepNames(r upgrade.Result) string {
	var names []string
	for _, s := range r.Nodes {
		names = append(names, s.Node)
	}
	return strings.Join(names, " ")
}

// nextPatch is v with its patch number one higher.
func nextPatch(t *testing.T, v string) string {
	var major, minor, patch int
	if _, err := fmt.Sscanf(v, "v%d.%d.%d", &major, &minor, &patch); err != nil {
		t.Fatalf("version %q: %v", v, err)
	}
	return fmt.Sprintf("v%d.%d.%d", major, minor, patch+1)
}

func talosVersion(t *testing.T, r *rackRig, n *emuNode) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	v, err := talosClient(t, r, n).Version(ctx)
	if err != nil {
		return err.Error()
	}
	return v.GetMessages()[0].GetVersion().GetTag()
}

// apiSampler reads a Namespace through the kubeconfig (the VIP) every
// 100 ms, each read on a new connection with a 1 s timeout: a read fails
// only while no API server behind the VIP serves it (a connection kept
// open would also fail once when the VIP moves, as any client's does).
type apiSampler struct {
	cancel             context.CancelFunc
	wg                 sync.WaitGroup
	failures, requests int
	// errs are the failures, as "+SECONDS: error", the first few.
	errs []string
}

func sampleAPI(t *testing.T, rc *rest.Config) *apiSampler {
	t.Helper()
	hc, url := namespaceReader(t, rc)
	ctx, cancel := context.WithCancel(context.Background())
	a := &apiSampler{cancel: cancel}
	start := time.Now()
	a.wg.Go(func() {
		for ctx.Err() == nil {
			err := getOK(ctx, hc, url)
			if ctx.Err() != nil {
				return
			}
			a.requests++
			if err != nil {
				a.failures++
				if len(a.errs) < 20 {
					a.errs = append(a.errs, fmt.Sprintf("+%.1fs: %v", time.Since(start).Seconds(), err))
				}
			}
			select {
			case <-ctx.Done():
			case <-time.After(100 * time.Millisecond):
			}
		}
	})
	return a
}

// namespaceReader is a client that reads the default Namespace through
// the kubeconfig (the VIP), each read on a new connection with a 1 s
// timeout, and the URL it reads.
func namespaceReader(t *testing.T, rc *rest.Config) (*http.Client, string) {
	t.Helper()
	tlsConfig, err := rest.TLSConfigFor(rc)
	if err != nil {
		t.Fatal(err)
	}
	hc := &http.Client{Timeout: time.Second, Transport: &http.Transport{
		DialContext: rc.Dial, TLSClientConfig: tlsConfig, DisableKeepAlives: true,
	}}
	return hc, strings.TrimSuffix(rc.Host, "/") + "/api/v1/namespaces/default"
}

// getOK GETs url and wants 200. A failure says how far the request got,
// which tells a VIP in the middle of a move (no TCP connection, or one
// refused) from an API server that answered late (connected, no reply in
// time).
func getOK(ctx context.Context, hc *http.Client, url string) error {
	start := time.Now()
	var connected, handshaken time.Duration
	trace := &httptrace.ClientTrace{
		ConnectDone: func(_, _ string, err error) {
			if err == nil {
				connected = time.Since(start)
			}
		},
		TLSHandshakeDone: func(_ tls.ConnectionState, err error) {
			if err == nil {
				handshaken = time.Since(start)
			}
		},
	}
	req, err := http.NewRequestWithContext(httptrace.WithClientTrace(ctx, trace), http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := hc.Do(req)
	if err != nil {
		switch {
		case handshaken > 0:
			return fmt.Errorf("connected in %v, TLS in %v: %w", connected.Round(time.Millisecond), handshaken.Round(time.Millisecond), err)
		case connected > 0:
			return fmt.Errorf("connected in %v, no TLS handshake: %w", connected.Round(time.Millisecond), err)
		}
		return fmt.Errorf("no connection: %w", err)
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("HTTP %d", resp.StatusCode)
	}
	return nil
}

func (a *apiSampler) stop() (failures, requests int) {
	a.cancel()
	a.wg.Wait()
	return a.failures, a.requests
}
