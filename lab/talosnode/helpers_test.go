package talosnode_test

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/netip"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/siderolabs/talos/pkg/machinery/client"
	clientconfig "github.com/siderolabs/talos/pkg/machinery/client/config"
	"github.com/siderolabs/talos/pkg/machinery/config/generate/secrets"

	"cozy.dev/cozy/bootstrap/rack"
	"cozy.dev/cozy/bootstrap/talosconfig"
	"cozy.dev/cozy/internal/testing/syncbuf"
	"cozy.dev/cozy/lab/talosnode"
)

// nodePorts are every port an emulated node may listen on.
var nodePorts = []int{talosnode.DefaultAPIPort, talosnode.TrustdPort, talosnode.EtcdClientPort, talosnode.EtcdPeerPort, 6443}

// loopbackAddress picks an address 127.0.0.N whose node ports are all
// free, so each emulated node has its own address and tests (and test
// processes) running at once do not collide. Only loopback is ever used.
func loopbackAddress(t testing.TB) netip.Addr {
	t.Helper()
	for range 200 {
		a := netip.AddrFrom4([4]byte{127, 0, 0, byte(2 + rand.IntN(250))})
		free := true
		for _, p := range nodePorts {
			l, err := net.Listen("tcp", net.JoinHostPort(a.String(), strconv.Itoa(p)))
			if err != nil {
				free = false
				break
			}
			l.Close()
		}
		if free {
			return a
		}
	}
	t.Fatal("no free loopback address 127.0.0.N for an emulated node")
	return netip.Addr{}
}

// nodeLogger collects a node's log and prints it if the test fails;
// nodes log from goroutines that may outlive a t.Log call's test.
func nodeLogger(t testing.TB, name string) *slog.Logger {
	l := &syncbuf.Buffer{}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("log of node %s:\n%s", name, l)
		}
	})
	return slog.New(slog.NewTextHandler(l, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

// testMachine is the hardware of an emulated node under test.
func testMachine(t testing.TB, addr netip.Addr, mac string) talosnode.Config {
	t.Helper()
	hw, err := net.ParseMAC(mac)
	if err != nil {
		t.Fatal(err)
	}
	return talosnode.Config{
		Address:     addr,
		StateDir:    t.TempDir(),
		MACs:        []net.HardwareAddr{hw, {0x52, 0x54, 0x00, 0xff, 0x00, hw[5]}},
		UUID:        fmt.Sprintf("4c4c4544-0000-1000-8000-%012x", hw[5]),
		Disks:       []talosnode.Disk{{Name: "vda", Size: 20 << 30, Model: "QEMU HARDDISK", Serial: "disk-" + mac[len(mac)-2:], Transport: "virtio"}},
		RebootDelay: 100 * time.Millisecond,
		Logger:      nodeLogger(t, addr.String()),
	}
}

// node is an emulated node under test, in this process or its own.
type node interface{ endpoint() string }

// runningNode is a node running in the test process.
type runningNode struct {
	cfg    talosnode.Config
	cancel context.CancelFunc
	done   chan error
}

// startNode runs a node until stop or the end of the test.
func startNode(t testing.TB, cfg talosnode.Config) *runningNode {
	t.Helper()
	n, err := talosnode.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	rn := &runningNode{cfg: cfg, cancel: cancel, done: make(chan error, 1)}
	go func() { rn.done <- n.Run(ctx) }()
	t.Cleanup(func() { rn.stop(t) })
	return rn
}

// stop ends the node's Run, as if its process were stopped, and checks
// that Run returned cleanly.
func (rn *runningNode) stop(t testing.TB) {
	t.Helper()
	if rn.cancel == nil {
		return
	}
	rn.cancel()
	rn.cancel = nil
	select {
	case err := <-rn.done:
		if err != nil {
			t.Errorf("node Run: %v", err)
		}
	case <-time.After(time.Minute):
		t.Errorf("node Run did not return within a minute of its context ending")
	}
}

// waitPowerOff waits for Run to return on its own, as it does when the
// machine is shut down through the API.
func (rn *runningNode) waitPowerOff(t testing.TB) {
	t.Helper()
	select {
	case err := <-rn.done:
		if err != nil {
			t.Errorf("node Run: %v", err)
		}
		rn.cancel()
		rn.cancel = nil
	case <-time.After(30 * time.Second):
		t.Fatal("the node did not power off")
	}
}

// endpoint is the node's machine API address.
func (rn *runningNode) endpoint() string {
	return net.JoinHostPort(rn.cfg.Address.String(), strconv.Itoa(talosnode.DefaultAPIPort))
}

// insecureClient connects as talosctl --insecure does to a maintenance
// node.
func insecureClient(t testing.TB, endpoint string) *client.Client {
	t.Helper()
	c, err := client.New(context.Background(), client.WithEndpoints(endpoint),
		client.WithTLSConfig(&tls.Config{InsecureSkipVerify: true}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// configClient connects with a talosconfig, as talosctl does to a
// configured node: mutual TLS with the OS CA.
func configClient(t testing.TB, tc *clientconfig.Config, endpoint string) *client.Client {
	t.Helper()
	cfg := *tc
	ctx := *cfg.Contexts[cfg.Context]
	ctx.Endpoints = []string{endpoint}
	cfg.Contexts = map[string]*clientconfig.Context{cfg.Context: &ctx}
	c, err := client.New(context.Background(), client.WithConfig(&cfg))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// Tests wait with poll.Within(t, timeout, 100*time.Millisecond, …). Each
// attempt should make its own connection: gRPC's reconnect backoff would
// otherwise hide a node that came back.

// cluster is a rack of emulated machines and its generated configs.
type cluster struct {
	rack    *rack.Rack
	gen     *talosconfig.Generator
	secrets *secrets.Bundle
}

// newCluster builds a rack whose control plane is cpAddr (the endpoint
// https://cpAddr:6443) plus one DHCP worker, with a fresh secrets bundle.
func newCluster(t testing.TB, cpAddr netip.Addr) *cluster {
	t.Helper()
	doc := fmt.Sprintf(`apiVersion: cozy.dev/v1alpha1
kind: Rack
metadata:
  name: lab
cluster:
  endpoint: https://%[1]s:6443
network:
  interface: eth1
  subnet: 127.0.0.0/8
machines:
  - hostname: cp1
    role: controlplane
    mac: 52:54:00:00:00:01
    install: {disk: /dev/vda}
    interfaces:
      - mac: 52:54:00:00:00:01
        addresses: [%[1]s/8]
  - hostname: worker1
    role: worker
    mac: 52:54:00:00:00:02
    install: {disk: /dev/vda}
`, cpAddr)
	r, err := rack.Parse([]byte(doc), "lab.yaml", t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	b, _, err := talosconfig.LoadOrCreateSecrets(filepath.Join(t.TempDir(), talosconfig.SecretsFile), nil)
	if err != nil {
		t.Fatal(err)
	}
	return &cluster{rack: r, gen: &talosconfig.Generator{Rack: r, Secrets: b}, secrets: b}
}

func (c *cluster) machineConfig(t testing.TB, hostname string) []byte {
	t.Helper()
	for i := range c.rack.Machines {
		if m := &c.rack.Machines[i]; m.Hostname == hostname {
			data, err := c.gen.MachineConfig(m)
			if err != nil {
				t.Fatal(err)
			}
			return data
		}
	}
	t.Fatalf("no machine %s in the rack", hostname)
	return nil
}

func (c *cluster) talosconfig(t testing.TB) *clientconfig.Config {
	t.Helper()
	tc, err := c.gen.Talosconfig()
	if err != nil {
		t.Fatal(err)
	}
	return tc
}

// codeOf is the gRPC code of err, as Talos's client reads it.
func codeOf(err error) string {
	if err == nil {
		return "OK"
	}
	return client.StatusCode(err).String()
}

var errNotYet = errors.New("not yet")
