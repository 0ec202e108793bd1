//go:build integration

package bootstrap_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"cozy.dev/cozy/bmc"
	"cozy.dev/cozy/bootstrap"
	"cozy.dev/cozy/bootstrap/state"
	"cozy.dev/cozy/internal/testing/cozyctl"
	"cozy.dev/cozy/lab/redfishbmc"
	"cozy.dev/cozy/lab/redfishbmc/bmctest"
)

// rigMachine is a rig node behind a BMC: powered on into a network boot
// it takes a DHCP lease and starts its emulated Talos node, as a server
// netbooting into maintenance mode. misses power-ons do nothing at all,
// as firmware that missed the network boot.
type rigMachine struct {
	r      *rackRig
	n      *emuNode
	ctx    context.Context
	mu     sync.Mutex
	on     bool
	booted bool
	// addressed: the node's namespace has its address from an earlier boot.
	addressed bool
	misses    int
	starts    []string
}

func (m *rigMachine) Running(context.Context) (bool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.on, nil
}

func (m *rigMachine) Start(_ context.Context, netboot bool) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.on = true
	m.starts = append(m.starts, fmt.Sprintf("netboot=%v", netboot))
	if !netboot || m.booted {
		return nil // a disk with no system on it, or already running
	}
	if m.misses > 0 {
		m.misses--
		return nil
	}
	m.booted = true
	first := !m.addressed
	m.addressed = true
	go func() {
		if first {
			m.r.dhcp(m.ctx, m.n)
			m.n.ns.IP(m.r.t, "addr", "add", m.n.ip+"/24", "dev", m.n.iface)
		}
		m.r.start(m.n)
	}()
	return nil
}

// Stop cuts power: the node's process dies with it.
func (m *rigMachine) Stop(context.Context, bool) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.on, m.booted = false, false
	if m.n.cmd != nil {
		_ = m.n.cmd.Process.Kill()
	}
	return nil
}

func (m *rigMachine) Restart(ctx context.Context, netboot bool) error {
	return m.Start(ctx, netboot)
}

func (m *rigMachine) Starts() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return append([]string(nil), m.starts...)
}

// bmcRig is a rack rig whose machines are powered only through one
// Redfish BMC (the lab's) on the rig's bridge.
func bmcRig(t *testing.T, ctx context.Context, cps, workers int, misses map[string]int, wrap func(http.Handler) http.Handler) (*rackRig, map[string]*rigMachine) {
	t.Helper()
	const bmcAddr = rigSubnet + ".1:8443"
	r := newRackRigWith(t, cps, workers, func(host string) string {
		return fmt.Sprintf("    bmc: {address: \"redfish+http://%s/redfish/v1/Systems/%s\", credentialsFile: bmc.yaml}\n", bmcAddr, host)
	})
	if err := os.WriteFile(filepath.Join(r.dir, "bmc.yaml"), []byte("username: root\npassword: calvin-1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	machines := map[string]*rigMachine{}
	var systems []redfishbmc.System
	for _, n := range r.nodes {
		m := &rigMachine{r: r, n: n, ctx: ctx, misses: misses[n.host]}
		machines[n.host] = m
		systems = append(systems, redfishbmc.System{ID: n.host, MAC: n.mac, Machine: m})
	}
	var h http.Handler = redfishbmc.New(redfishbmc.Credentials{Username: "root", Password: "calvin-1"}, slog.New(slog.DiscardHandler), systems...)
	if wrap != nil {
		h = wrap(h)
	}
	var l net.Listener
	if err := r.ns.Do(func() (err error) { l, err = net.Listen("tcp", bmcAddr); return err }); err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(func() { _ = srv.Close() })
	return r, machines
}

// TestBootstrapPowersOnThroughBMC: no one powers the machines on; the
// bootstrap does, through their BMC, with a one-time network boot. w1's
// BMC refuses one-time boots: it gets a continuous one, put back once w1
// has netbooted. w2's firmware misses its first network boot: it is
// power-cycled once more after --netboot-timeout.
func TestBootstrapPowersOnThroughBMC(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	refuseOnceForW1 := bmctest.RefuseOnce(func(path string) bool { return strings.HasSuffix(path, "/w1") })
	r, machines := bmcRig(t, ctx, 1, 2, map[string]int{"w2": 1}, refuseOnceForW1)
	p := r.bootstrap("--netboot-timeout", "8s")
	defer r.failLogs(p)
	powered := map[string][]string{}
	for e := range p.events {
		if strings.Contains(e.Message, "through its BMC") {
			powered[e.Node] = append(powered[e.Node], e.Message)
		}
	}
	if err := <-p.done; err != nil {
		t.Fatalf("bootstrap: %v", err)
	}
	for host, want := range map[string]int{"cp1": 1, "w1": 1, "w2": 2} {
		if got := len(powered[host]); got != want {
			t.Errorf("%s powered on through its BMC %d times, want %d: %q", host, got, want, powered[host])
		}
	}
	if !strings.Contains(strings.Join(powered["w1"], ""), "refused a one-time boot") {
		t.Errorf("w1's event does not say its BMC refused a one-time boot: %q", powered["w1"])
	}
	if !strings.Contains(p.stderr.String(), "boot override restored") {
		t.Errorf("w1's boot override was not restored:\n%s", tail(p.stderr.String(), 30))
	}
	// w1's BMC holds its old override again: the next boot is its disk.
	if got, err := bootOverride(ctx, r, "w1"); err != nil || got != (bmc.Boot{Target: "None", Enabled: "Disabled"}) {
		t.Errorf("w1's override after the bootstrap: %+v, %v; want None Disabled", got, err)
	}
	for host, m := range machines {
		t.Logf("%s power-ons: %v", host, m.Starts())
	}
	if strings.Contains(p.stderr.String(), "calvin-1") {
		t.Error("the bootstrap logged the BMC password")
	}
}

// TestBootstrapReportsAMachineThatNeverNetboots: a machine whose BMC
// powers it on but that never netboots is power-cycled once more and
// then reported, with what to check.
func TestBootstrapReportsAMachineThatNeverNetboots(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	r, machines := bmcRig(t, ctx, 1, 0, map[string]int{"cp1": 99}, nil)
	p := r.bootstrap("--netboot-timeout", "3s")
	for range p.events {
	}
	err := <-p.done
	if err == nil || !strings.Contains(p.stderr.String(), "powered on through its BMC 2 times") || !strings.Contains(p.stderr.String(), "did not netboot within 3s") {
		t.Fatalf("bootstrap: %v\n%s", err, tail(p.stderr.String(), 20))
	}
	if got := len(machines["cp1"].Starts()); got != 2 {
		t.Errorf("cp1 powered on %d times, want 2", got)
	}
}

// TestReprovisionWorker: `cozyctl node reset` resets an installed worker
// through the Talos API (a one-time network boot set through its BMC
// first) back to maintenance mode and marks it pending; the next
// bootstrap installs it again and leaves the control plane alone. The
// only control plane is refused: etcd would lose its quorum.
func TestReprovisionWorker(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	r, _ := bmcRig(t, ctx, 1, 1, nil, nil)
	p := r.bootstrap()
	defer r.failLogs(p)
	for range p.events {
	}
	if err := <-p.done; err != nil {
		t.Fatalf("bootstrap: %v", err)
	}

	rows, out, err := reprovision(ctx, r, "w1", "cp1", "--timeout", "2m")
	if err == nil || len(rows) != 2 {
		t.Fatalf("reprovision: %v (want a failure, for cp1)\n%s", err, out)
	}
	if w := rows[0]; w.Machine != "w1" || w.How != "talos reset" || !w.Back || w.Error != "" {
		t.Errorf("w1: %+v, want a Talos reset back in maintenance mode", w)
	}
	if cp := rows[1]; !strings.Contains(cp.Error, "etcd would lose its quorum: removing cp1 needs 1 of the 1 etcd members (cp1) healthy without it, and 0 are") {
		t.Errorf("cp1: %+v, want refused: etcd would lose its quorum", cp)
	}
	st, err := state.Open(r.stateDir, "itest")
	if err != nil {
		t.Fatal(err)
	}
	if ph := st.Node("w1").Phase; ph != state.Pending {
		t.Errorf("w1 is %s in the state dir, want pending", ph)
	}
	if ph := st.Node("cp1").Phase; ph != state.Ready {
		t.Errorf("cp1 is %s in the state dir, want ready", ph)
	}
	// The BMC holds the one-time network boot set before the reset.
	if got, err := bootOverride(ctx, r, "w1"); err != nil || got != (bmc.Boot{Target: "Pxe", Enabled: "Once"}) {
		t.Errorf("w1's boot override after the reprovision: %+v, %v; want Pxe Once", got, err)
	}

	again := r.bootstrap()
	phases := map[string][]state.Phase{}
	for e := range again.events {
		if e.Node != "" {
			if l := phases[e.Node]; len(l) == 0 || l[len(l)-1] != e.Phase {
				phases[e.Node] = append(l, e.Phase)
			}
		}
	}
	if err := <-again.done; err != nil {
		t.Fatalf("bootstrap after the reprovision: %v\n%s", err, tail(again.stderr.String(), 30))
	}
	if got := phaseList(phases["w1"]); got != "pending discovered applied configured ready" {
		t.Errorf("w1 went through %q, want it installed again", got)
	}
	if got := phaseList(phases["cp1"]); got != "ready" {
		t.Errorf("cp1 went through %q, want it left alone", got)
	}
}

// TestReprovisionThroughBMC: a worker whose system no longer answers (its
// node process killed, as a hung machine) is reprovisioned through its
// BMC: a one-time network boot and a power cycle. Netbooted over its
// installed disk it comes back configured, not in maintenance mode (as
// Talos does), which the result says; the next bootstrap takes it as
// installed and the cluster is whole again.
func TestReprovisionThroughBMC(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	r, machines := bmcRig(t, ctx, 1, 1, nil, nil)
	p := r.bootstrap()
	defer r.failLogs(p)
	for range p.events {
	}
	if err := <-p.done; err != nil {
		t.Fatalf("bootstrap: %v", err)
	}
	w1 := r.nodes[1]
	_ = w1.cmd.Process.Kill()

	rows, out, err := reprovision(ctx, r, "w1", "--timeout", "15s")
	if err != nil || len(rows) != 1 {
		t.Fatalf("reprovision: %v\n%s", err, out)
	}
	if w := rows[0]; w.How != "bmc" || w.Back || w.Error != "" {
		t.Errorf("w1: %+v, want a BMC power cycle, not back in maintenance mode", w)
	}
	if starts := machines["w1"].Starts(); len(starts) != 2 || starts[1] != "netboot=true" {
		t.Errorf("w1's power-ons: %v, want a second one into a network boot", starts)
	}

	again := r.bootstrap()
	for range again.events {
	}
	if err := <-again.done; err != nil {
		t.Fatalf("bootstrap after the reprovision: %v\n%s", err, tail(again.stderr.String(), 30))
	}
	st, err := state.Open(r.stateDir, "itest")
	if err != nil {
		t.Fatal(err)
	}
	if ph := st.Node("w1").Phase; ph != state.Ready {
		t.Errorf("w1 is %s after the bootstrap, want ready", ph)
	}
}

// reprovision runs `cozyctl node reset ARGS` in the rig's
// namespace and returns its rows, what it printed, and how it exited.
func reprovision(ctx context.Context, r *rackRig, args ...string) ([]bootstrap.Reprovisioned, string, error) {
	cmd := r.ns.Command(ctx, cozyctl.Path(r.t), append([]string{"node", "reset", "--rack", r.rackFile, "--state-dir", r.stateDir, "-o", "json"}, args...)...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	var rows []bootstrap.Reprovisioned
	if jerr := json.Unmarshal(out, &rows); jerr != nil {
		rows = nil
	}
	return rows, string(out) + stderr.String(), err
}

// bootOverride reads a rig machine's boot override through its BMC (the
// BootPXEOnce that reads it reports the one it found).
func bootOverride(ctx context.Context, r *rackRig, host string) (bmc.Boot, error) {
	addr, err := bmc.ParseAddress("redfish+http://" + rigSubnet + ".1:8443/redfish/v1/Systems/" + host)
	if err != nil {
		return bmc.Boot{}, err
	}
	c, err := bmc.Dial(ctx, bmc.Target{Address: addr, Credentials: bmc.Credentials{Username: "root", Password: "calvin-1"}, DialContext: r.ns.DialContext})
	if err != nil {
		return bmc.Boot{}, err
	}
	defer c.Close()
	ch, err := c.BootPXEOnce(ctx)
	return ch.Previous, err
}
