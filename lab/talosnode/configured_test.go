package talosnode_test

import (
	"bytes"
	"context"
	stdx509 "crypto/x509"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cosi-project/runtime/pkg/resource"
	"github.com/cosi-project/runtime/pkg/safe"
	"github.com/cosi-project/runtime/pkg/state"
	"github.com/siderolabs/crypto/x509"
	"github.com/siderolabs/talos/pkg/machinery/api/common"
	"github.com/siderolabs/talos/pkg/machinery/api/machine"
	"github.com/siderolabs/talos/pkg/machinery/client"
	clientconfig "github.com/siderolabs/talos/pkg/machinery/client/config"
	configres "github.com/siderolabs/talos/pkg/machinery/resources/config"
	"github.com/siderolabs/talos/pkg/machinery/resources/network"
	"github.com/siderolabs/talos/pkg/machinery/resources/runtime"
	"github.com/siderolabs/talos/pkg/machinery/version"

	"cozy.dev/cozy/internal/testing/netnstest"
	"cozy.dev/cozy/internal/testing/poll"
	"cozy.dev/cozy/lab/talosnode"
)

// TestApplyConfigurationRefused: whatever a client sends that Talos
// would refuse is refused with Talos's code, and nothing reaches the
// node's disk.
func TestApplyConfigurationRefused(t *testing.T) {
	addr := loopbackAddress(t)
	n := startNode(t, testMachine(t, addr, "52:54:00:00:00:01"))
	cl := newCluster(t, addr)
	valid := string(cl.machineConfig(t, "cp1"))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	waitMaintenance(t, n)

	tests := []struct {
		name    string
		data    []byte
		mode    machine.ApplyConfigurationRequest_Mode
		code    string
		message string
	}{
		{"empty", nil, machine.ApplyConfigurationRequest_REBOOT, "InvalidArgument", "failed to parse config"},
		{"not YAML", []byte("machine: [\n"), machine.ApplyConfigurationRequest_AUTO, "InvalidArgument", "failed to parse config"},
		{"binary", []byte{0x00, 0xff, 0xfe, 0x01, 0x80}, machine.ApplyConfigurationRequest_REBOOT, "InvalidArgument", "failed to parse config"},
		{"a kubeconfig", []byte("apiVersion: v1\nkind: Config\nclusters: []\n"), machine.ApplyConfigurationRequest_REBOOT, "InvalidArgument", "failed to parse config"},
		{"cut mid-line", []byte(valid[:strings.Index(valid, "    kubelet:")+7]), machine.ApplyConfigurationRequest_REBOOT, "InvalidArgument", ""},
		{"no cluster section", []byte(valid[:strings.Index(valid, "\ncluster:")+1]), machine.ApplyConfigurationRequest_REBOOT, "InvalidArgument", "cluster instructions are required"},
		{"no machine section", []byte("version: v1alpha1\ndebug: false\n"), machine.ApplyConfigurationRequest_REBOOT, "InvalidArgument", ""},
		{"unknown machine type", []byte(strings.Replace(valid, "    type: controlplane\n", "    type: toaster\n", 1)), machine.ApplyConfigurationRequest_REBOOT, "InvalidArgument", ""},
		{"install disk selector matches no disk", []byte(strings.Replace(valid, "        disk: /dev/vda\n", "        diskSelector:\n            size: '>= 1TB'\n", 1)),
			machine.ApplyConfigurationRequest_REBOOT, "InvalidArgument", "no disks matched the expression"},
		{"no-reboot is not a maintenance mode", []byte(valid), machine.ApplyConfigurationRequest_NO_REBOOT, "Unimplemented", "apply configuration --mode='no-reboot' is not supported in maintenance mode"},
		{"staged is not a maintenance mode", []byte(valid), machine.ApplyConfigurationRequest_STAGED, "Unimplemented", "not supported in maintenance mode"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := insecureClient(t, n.endpoint())
			_, err := c.ApplyConfiguration(ctx, &machine.ApplyConfigurationRequest{Data: tc.data, Mode: tc.mode})
			if codeOf(err) != tc.code || !strings.Contains(fmt.Sprint(err), tc.message) {
				t.Errorf("ApplyConfiguration: %v; want %s %q", err, tc.code, tc.message)
			}
			if _, err := os.Stat(filepath.Join(n.cfg.StateDir, talosnode.ConfigFile)); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("a config file is on the node's disk after a refused apply (stat: %v)", err)
			}
			if ms := machineStage(ctx, c); ms != runtime.MachineStageMaintenance {
				t.Errorf("machine stage %s after a refused apply, want maintenance", ms)
			}
		})
	}

	t.Run("dry run writes nothing", func(t *testing.T) {
		resp, err := insecureClient(t, n.endpoint()).ApplyConfiguration(ctx, &machine.ApplyConfigurationRequest{Data: []byte(valid), DryRun: true})
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(resp.GetMessages()[0].GetModeDetails(), "Dry run") {
			t.Errorf("mode details %q", resp.GetMessages()[0].GetModeDetails())
		}
		if _, err := os.Stat(filepath.Join(n.cfg.StateDir, talosnode.ConfigFile)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("dry run wrote the config (stat: %v)", err)
		}
	})
}

// TestInstallAndConfiguredMode walks a control plane from maintenance
// through apply-config and its reboot into configured mode, then through
// a process restart, a reboot, a re-apply and a reset.
func TestInstallAndConfiguredMode(t *testing.T) {
	addr := loopbackAddress(t)
	cfg := testMachine(t, addr, "52:54:00:00:00:01")
	n := startNode(t, cfg)
	cl := newCluster(t, addr)
	tc := cl.talosconfig(t)
	data := cl.machineConfig(t, "cp1")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	waitMaintenance(t, n)

	// Watch the machine status as talosctl does while it applies.
	events := make(chan state.Event, 16)
	if err := insecureClient(t, n.endpoint()).COSI.Watch(ctx, runtime.NewMachineStatus().Metadata(), events); err != nil {
		t.Fatalf("watch the machine status: %v", err)
	}
	if s := nextStage(t, events); s != runtime.MachineStageMaintenance {
		t.Errorf("watch starts at stage %s, want maintenance", s)
	}

	resp, err := insecureClient(t, n.endpoint()).ApplyConfiguration(ctx, &machine.ApplyConfigurationRequest{Data: data, Mode: machine.ApplyConfigurationRequest_AUTO})
	if err != nil {
		t.Fatalf("ApplyConfiguration: %v", err)
	}
	if len(resp.GetMessages()) != 1 {
		t.Fatalf("reply has %d messages, want 1", len(resp.GetMessages()))
	}
	if s := nextStage(t, events); s != runtime.MachineStageInstalling {
		t.Errorf("stage %s after the config was applied, want installing", s)
	}

	path := filepath.Join(cfg.StateDir, talosnode.ConfigFile)
	onDisk, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(onDisk, data) {
		t.Error("the config on disk differs from the applied bytes")
	}
	if fi, _ := os.Stat(path); fi.Mode().Perm() != 0o600 {
		t.Errorf("config file mode %v, want 0600", fi.Mode().Perm())
	}

	waitConfigured(t, n, tc)
	assertConfigured(ctx, t, n, tc, "cp1")

	t.Run("a client certificate from another CA is refused", func(t *testing.T) {
		other := newCluster(t, addr).talosconfig(t)
		// Trust the node's CA so that only the server's check of the
		// client certificate can fail.
		other.Contexts[other.Context].CA = tc.Contexts[tc.Context].CA
		_, err := configClient(t, other, n.endpoint()).Version(ctx)
		if codeOf(err) != "Unavailable" {
			t.Errorf("Version with a foreign client certificate: %v, want the connection refused (Unavailable)", err)
		}
	})

	t.Run("control-plane APIs before bootstrap", func(t *testing.T) {
		c := configClient(t, tc, n.endpoint())
		// Talos issues the admin kubeconfig from the config, bootstrapped
		// or not.
		if kc, err := c.Kubeconfig(ctx); err != nil || !bytes.Contains(kc, []byte("current-context: admin@lab")) {
			t.Errorf("Kubeconfig: %v\n%s", err, kc)
		}
		if _, err := c.EtcdMemberList(ctx, &machine.EtcdMemberListRequest{}); codeOf(err) != "Unavailable" {
			t.Errorf("EtcdMemberList before bootstrap: %v, want Unavailable", err)
		}
	})

	t.Run("roles", func(t *testing.T) {
		reader := withRole(t, cl, tc, "os:reader")
		c := configClient(t, reader, n.endpoint())
		if _, err := c.Version(ctx); err != nil {
			t.Errorf("Version as os:reader: %v", err)
		}
		if _, err := c.Kubeconfig(ctx); codeOf(err) != "PermissionDenied" {
			t.Errorf("Kubeconfig as os:reader: %v, want PermissionDenied", err)
		}
		if err := c.Reboot(ctx); codeOf(err) != "PermissionDenied" {
			t.Errorf("Reboot as os:reader: %v, want PermissionDenied", err)
		}
		none := withRole(t, cl, tc, "")
		if _, err := configClient(t, none, n.endpoint()).Version(ctx); codeOf(err) != "PermissionDenied" {
			t.Errorf("Version without a role: %v, want PermissionDenied", err)
		}
		// The running config, with the cluster's keys: os:admin only, as
		// Talos's sensitive resources.
		md := resource.NewMetadata(configres.NamespaceName, configres.MachineConfigType, configres.ActiveID, resource.VersionUndefined)
		if _, err := c.COSI.Get(ctx, md); codeOf(err) != "PermissionDenied" {
			t.Errorf("MachineConfig as os:reader: %v, want PermissionDenied", err)
		}
		res, err := configClient(t, tc, n.endpoint()).COSI.Get(ctx, md)
		if mc, ok := res.(*configres.MachineConfig); err != nil || !ok || mc.Config().Cluster().Name() != "lab" {
			t.Errorf("MachineConfig as os:admin: %T, %v; want the config of cluster lab", res, err)
		}
		// Pre-pulling a Kubernetes image is having a binary of its
		// version; other images the emulation does not pull.
		admin := configClient(t, tc, n.endpoint())
		//lint:ignore SA1019 the call talosctl upgrade-k8s makes
		if err := admin.ImagePull(ctx, common.ContainerdNamespace_NS_CRI, "registry.k8s.io/kube-apiserver:v0.0.1"); codeOf(err) != "NotFound" || !strings.Contains(err.Error(), "has no kube-apiserver of that version") {
			t.Errorf("ImagePull of a version the node has no binary of: %v, want NotFound", err)
		}
		//lint:ignore SA1019 the call talosctl upgrade-k8s makes
		if err := admin.ImagePull(ctx, common.ContainerdNamespace_NS_CRI, "docker.io/library/alpine:3"); codeOf(err) != "Unimplemented" {
			t.Errorf("ImagePull of another image: %v, want Unimplemented", err)
		}
	})

	t.Run("service logs", func(t *testing.T) {
		dir := filepath.Join(cfg.StateDir, talosnode.LogDir)
		if err := os.MkdirAll(dir, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "kubelet.log"), []byte("one\ntwo\nthree\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		reader := configClient(t, withRole(t, cl, tc, "os:reader"), n.endpoint())
		for _, tt := range []struct {
			id, namespace string
			driver        common.ContainerDriver
			tail          int32
			want, code    string
		}{
			{"kubelet", "system", common.ContainerDriver_CONTAINERD, -1, "one\ntwo\nthree\n", "OK"},
			{"kubelet", "system", common.ContainerDriver_CONTAINERD, 2, "two\nthree\n", "OK"},
			{"kubelet", "system", common.ContainerDriver_CONTAINERD, 0, "", "OK"},
			{"kubelet", "system", common.ContainerDriver_CONTAINERD, 9, "one\ntwo\nthree\n", "OK"},
			{"etcd-nope", "system", common.ContainerDriver_CONTAINERD, -1, "", "NotFound"},
			{"../config", "system", common.ContainerDriver_CONTAINERD, -1, "", "InvalidArgument"},
			{"kube-system/coredns", "k8s.io", common.ContainerDriver_CRI, -1, "", "Unimplemented"},
		} {
			got, err := readLogs(ctx, reader, tt.namespace, tt.driver, tt.id, tt.tail)
			if codeOf(err) != tt.code || got != tt.want {
				t.Errorf("logs %s (tail %d): %q, %v; want %q, code %q", tt.id, tt.tail, got, err, tt.want, tt.code)
			}
		}
	})

	t.Run("node metadata", func(t *testing.T) {
		c := configClient(t, tc, n.endpoint())
		if _, err := c.Version(client.WithNode(ctx, addr.String())); err != nil {
			t.Errorf("Version with --nodes naming the node itself: %v", err)
		}
		if _, err := c.Version(client.WithNode(ctx, "192.0.2.1")); codeOf(err) != "Unavailable" {
			t.Errorf("Version with --nodes naming another node: %v, want Unavailable (no proxying)", err)
		}
	})

	parent := t
	t.Run("process restart keeps configured mode", func(t *testing.T) {
		n.stop(t)
		n = startNode(parent, cfg) // runs until the end of the whole test
		waitConfigured(t, n, tc)
		assertConfigured(ctx, t, n, tc, "cp1")
	})

	t.Run("reboot comes back configured", func(t *testing.T) {
		c := configClient(t, tc, n.endpoint())
		if err := c.Reboot(ctx); err != nil {
			t.Fatalf("Reboot: %v", err)
		}
		poll.Within(t, 30*time.Second, 100*time.Millisecond, "node down for the reboot", func() error {
			if _, err := configClient(t, tc, n.endpoint()).Version(ctx); err == nil {
				return errNotYet
			}
			return nil
		})
		waitConfigured(t, n, tc)
	})

	t.Run("re-apply without reboot updates the disk", func(t *testing.T) {
		changed := bytes.Replace(data, []byte("hostname: cp1"), []byte("hostname: cp1-renamed"), 1)
		if bytes.Equal(changed, data) {
			t.Fatal("the config has no hostname: cp1 to change")
		}
		resp, err := configClient(t, tc, n.endpoint()).ApplyConfiguration(ctx, &machine.ApplyConfigurationRequest{Data: changed, Mode: machine.ApplyConfigurationRequest_NO_REBOOT})
		if err != nil {
			t.Fatalf("ApplyConfiguration: %v", err)
		}
		if got := resp.GetMessages()[0].GetModeDetails(); got != "Applied configuration without a reboot" {
			t.Errorf("mode details %q", got)
		}
		if onDisk, _ := os.ReadFile(path); !bytes.Equal(onDisk, changed) {
			t.Error("the config on disk is not the re-applied one")
		}
		hs, err := safe.StateGetByID[*network.HostnameStatus](ctx, configClient(t, tc, n.endpoint()).COSI, network.HostnameID)
		if err != nil || hs.TypedSpec().Hostname != "cp1-renamed" {
			t.Errorf("hostname status after re-apply: %v %v", hs, err)
		}
		bad := bytes.Replace(data, []byte("    type: controlplane\n"), []byte("    type: toaster\n"), 1)
		_, err = configClient(t, tc, n.endpoint()).ApplyConfiguration(ctx, &machine.ApplyConfigurationRequest{Data: bad, Mode: machine.ApplyConfigurationRequest_NO_REBOOT})
		if codeOf(err) != "InvalidArgument" {
			t.Errorf("re-apply of an invalid config: %v, want InvalidArgument", err)
		}
		if onDisk, _ := os.ReadFile(path); !bytes.Equal(onDisk, changed) {
			t.Error("a refused re-apply changed the config on disk")
		}
	})

	t.Run("etcd APIs before a bootstrap", func(t *testing.T) {
		c := configClient(t, tc, n.endpoint())
		services, err := c.ServiceList(ctx)
		if err != nil {
			t.Fatalf("ServiceList: %v", err)
		}
		states := map[string]string{}
		for _, m := range services.GetMessages() {
			for _, s := range m.GetServices() {
				states[s.GetId()] = s.GetState()
			}
		}
		if want := map[string]string{"apid": "Running", "etcd": "Preparing", "trustd": "Running"}; !maps.Equal(states, want) {
			t.Errorf("services %v, want %v", states, want)
		}
		if _, err := c.EtcdStatus(ctx); codeOf(err) != "Unavailable" {
			t.Errorf("EtcdStatus before a bootstrap: %v, want Unavailable", err)
		}
		r, err := c.EtcdSnapshot(ctx, &machine.EtcdSnapshotRequest{})
		if err == nil {
			_, err = io.ReadAll(r)
		}
		if codeOf(err) != "Unavailable" {
			t.Errorf("EtcdSnapshot before a bootstrap: %v, want Unavailable", err)
		}
		err = c.Bootstrap(ctx, &machine.BootstrapRequest{RecoverEtcd: true})
		if codeOf(err) != "FailedPrecondition" || !strings.Contains(err.Error(), "no etcd snapshot to recover from") {
			t.Errorf("Bootstrap from a snapshot never uploaded: %v, want FailedPrecondition", err)
		}
		if err := c.EtcdLeaveCluster(ctx, &machine.EtcdLeaveClusterRequest{}); codeOf(err) != "Unavailable" {
			t.Errorf("EtcdLeaveCluster before a bootstrap: %v, want Unavailable", err)
		}
		if err := c.EtcdRemoveMemberByID(ctx, &machine.EtcdRemoveMemberByIDRequest{MemberId: 1}); codeOf(err) != "Unavailable" {
			t.Errorf("EtcdRemoveMemberByID before a bootstrap: %v, want Unavailable", err)
		}
	})

	t.Run("bad resets are refused", func(t *testing.T) {
		for _, bad := range []struct {
			name string
			req  *machine.ResetRequest
			code string
		}{
			{"unknown volume", &machine.ResetRequest{Reboot: true, SystemPartitionsToWipe: []*machine.ResetPartitionSpec{{Label: "DATA", Wipe: true}}}, "NotFound"},
			{"system volumes with USER_DISKS", &machine.ResetRequest{Reboot: true, Mode: machine.ResetRequest_USER_DISKS, SystemPartitionsToWipe: []*machine.ResetPartitionSpec{{Label: "EPHEMERAL", Wipe: true}}}, "InvalidArgument"},
			{"EPHEMERAL without a reboot", &machine.ResetRequest{SystemPartitionsToWipe: []*machine.ResetPartitionSpec{{Label: "EPHEMERAL", Wipe: true}}}, "Unimplemented"},
		} {
			if err := configClient(t, tc, n.endpoint()).ResetGeneric(ctx, bad.req); codeOf(err) != bad.code {
				t.Errorf("%s: %v, want %s", bad.name, err, bad.code)
			}
		}
	})

	t.Run("an EPHEMERAL reset keeps the config", func(t *testing.T) {
		marker := filepath.Join(cfg.StateDir, talosnode.EtcdDir, "member")
		if err := os.MkdirAll(marker, 0o700); err != nil {
			t.Fatal(err)
		}
		err := configClient(t, tc, n.endpoint()).ResetGeneric(ctx, &machine.ResetRequest{Reboot: true,
			SystemPartitionsToWipe: []*machine.ResetPartitionSpec{{Label: "EPHEMERAL", Wipe: true}}})
		if err != nil {
			t.Fatalf("Reset of EPHEMERAL: %v", err)
		}
		poll.Within(t, 30*time.Second, 100*time.Millisecond, "the etcd data wiped", func() error {
			if _, err := os.Stat(marker); !errors.Is(err, os.ErrNotExist) {
				return fmt.Errorf("stat %s: %v", marker, err)
			}
			return nil
		})
		waitConfigured(t, n, tc)
		if _, err := os.Stat(path); err != nil {
			t.Errorf("the config is gone after an EPHEMERAL reset: %v", err)
		}
	})

	t.Run("reset goes back to maintenance", func(t *testing.T) {
		// A node without node services runs in the host's mount
		// namespace: its reset must leave the host's mounts alone (once it
		// unmounted everything below /run/netns, breaking every other
		// test's network namespace).
		var hostNS *netnstest.NS
		if os.Geteuid() == 0 {
			hostNS = netnstest.New(t, "reset")
		}
		if err := configClient(t, tc, n.endpoint()).Reset(ctx, true, true); err != nil {
			t.Fatalf("Reset: %v", err)
		}
		waitMaintenance(t, n)
		if hostNS != nil {
			if err := hostNS.Do(func() error { return nil }); err != nil {
				t.Errorf("the host's network namespace %s is gone after the node's reset: %v", hostNS.Name, err)
			}
		}
		if _, err := os.Stat(path); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("the config survived the reset (stat: %v)", err)
		}
		if _, err := configClient(t, tc, n.endpoint()).Version(ctx); err == nil {
			t.Error("the talosconfig still works after the reset")
		}
	})
}

// TestWorker: a worker holds no OS CA key, so it gets its API certificate
// from the control plane's trustd; the talosconfig then verifies it like
// any node's. Control-plane APIs are refused as Talos refuses them.
func TestWorker(t *testing.T) {
	cpAddr, workerAddr := loopbackAddress(t), loopbackAddress(t)
	for workerAddr == cpAddr {
		workerAddr = loopbackAddress(t)
	}
	cp := startNode(t, testMachine(t, cpAddr, "52:54:00:00:00:01"))
	worker := startNode(t, testMachine(t, workerAddr, "52:54:00:00:00:02"))
	cl := newCluster(t, cpAddr)
	tc := cl.talosconfig(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	waitMaintenance(t, cp)
	waitMaintenance(t, worker)

	// The worker first: it waits for trustd until the control plane is up.
	for _, apply := range []struct {
		node     *runningNode
		hostname string
	}{{worker, "worker1"}, {cp, "cp1"}} {
		_, err := insecureClient(t, apply.node.endpoint()).ApplyConfiguration(ctx, &machine.ApplyConfigurationRequest{Data: cl.machineConfig(t, apply.hostname)})
		if err != nil {
			t.Fatalf("apply %s: %v", apply.hostname, err)
		}
	}
	waitConfigured(t, worker, tc)
	assertConfigured(ctx, t, worker, tc, "worker1")

	c := configClient(t, tc, worker.endpoint())
	if err := c.Bootstrap(ctx, &machine.BootstrapRequest{}); codeOf(err) != "FailedPrecondition" || !strings.Contains(err.Error(), "bootstrap can only be performed on a control plane node") {
		t.Errorf("Bootstrap on a worker: %v, want FailedPrecondition", err)
	}
	if _, err := c.Kubeconfig(ctx); codeOf(err) != "Unimplemented" {
		t.Errorf("Kubeconfig on a worker: %v, want Unimplemented", err)
	}
	if _, err := c.EtcdMemberList(ctx, &machine.EtcdMemberListRequest{}); codeOf(err) != "Unimplemented" {
		t.Errorf("EtcdMemberList on a worker: %v, want Unimplemented", err)
	}
	if _, err := c.EtcdStatus(ctx); codeOf(err) != "Unimplemented" || !strings.Contains(err.Error(), "etcd status is only available on control plane nodes") {
		t.Errorf("EtcdStatus on a worker: %v, want Talos's Unimplemented", err)
	}
	if _, err := c.EtcdRecover(ctx, strings.NewReader("not a snapshot")); codeOf(err) != "Unimplemented" {
		t.Errorf("EtcdRecover on a worker: %v, want Unimplemented", err)
	}
	if err := c.EtcdLeaveCluster(ctx, &machine.EtcdLeaveClusterRequest{}); codeOf(err) != "Unimplemented" || !strings.Contains(err.Error(), "etcd leave is only available on control plane nodes") {
		t.Errorf("EtcdLeaveCluster on a worker: %v, want Talos's Unimplemented", err)
	}
	if err := c.EtcdRemoveMemberByID(ctx, &machine.EtcdRemoveMemberByIDRequest{MemberId: 1}); codeOf(err) != "Unimplemented" || !strings.Contains(err.Error(), "etcd remove member is only available on control plane nodes") {
		t.Errorf("EtcdRemoveMemberByID on a worker: %v, want Talos's Unimplemented", err)
	}

	// Upgrade: the installer image's tag is the version the node
	// reboots into; a tag that is not a version and a staged upgrade are
	// refused.
	tag := func() string {
		v, err := configClient(t, tc, worker.endpoint()).Version(ctx)
		if err != nil {
			return err.Error()
		}
		return v.GetMessages()[0].GetVersion().GetTag()
	}
	if got := tag(); got != version.Tag {
		t.Fatalf("installed version %s, want the rack's installer's %s", got, version.Tag)
	}
	const installer = "factory.talos.dev/metal-installer/376567988ad370138ad8b2698212367b8edcb69b5fd68c80be1f2ec7d603b4ba"
	//lint:ignore SA1019 the emulated node serves MachineService.Upgrade (see upgrade.go)
	if _, err := c.Upgrade(ctx, installer+":latest", false, false); err == nil || !strings.Contains(err.Error(), `error validating installer image`) {
		t.Errorf("Upgrade to :latest: %v, want refused", err)
	}
	//lint:ignore SA1019 as above
	if _, err := c.Upgrade(ctx, installer+":v1.13.1", true, false); codeOf(err) != "Unimplemented" {
		t.Errorf("a staged Upgrade: %v, want Unimplemented", err)
	}
	up, err := c.Upgrade(ctx, installer+":v1.13.1", false, false) //lint:ignore SA1019 as above
	if err != nil || up.GetMessages()[0].GetAck() != "Upgrade request received" {
		t.Fatalf("Upgrade: %v %v", up, err)
	}
	poll.Within(t, 30*time.Second, 100*time.Millisecond, "the worker back on v1.13.1", func() error {
		if got := tag(); got != "v1.13.1" {
			return fmt.Errorf("version %s", got)
		}
		return nil
	})
	waitConfigured(t, worker, tc)

	if err := c.Shutdown(ctx); err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
	worker.waitPowerOff(t)
	if err := configClient(t, tc, cp.endpoint()).Reset(ctx, false, false); err != nil {
		t.Fatalf("Reset without reboot: %v", err)
	}
	cp.waitPowerOff(t)
	if _, err := os.Stat(filepath.Join(cp.cfg.StateDir, talosnode.ConfigFile)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the config survived the reset (stat: %v)", err)
	}
}

func waitMaintenance(t *testing.T, n node) {
	t.Helper()
	poll.Within(t, 30*time.Second, 100*time.Millisecond, "maintenance mode", func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		c := insecureClient(t, n.endpoint())
		defer c.Close()
		if s := machineStage(ctx, c); s != runtime.MachineStageMaintenance {
			return fmt.Errorf("stage %s", s)
		}
		return nil
	})
}

func waitConfigured(t *testing.T, n node, tc *clientconfig.Config) {
	t.Helper()
	poll.Within(t, 30*time.Second, 100*time.Millisecond, "configured mode", func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		c := configClient(t, tc, n.endpoint())
		defer c.Close()
		if s := machineStage(ctx, c); s != runtime.MachineStageRunning {
			return fmt.Errorf("stage %s", s)
		}
		return nil
	})
}

// nextStage is the stage of the next machine status a watch reports.
func nextStage(t *testing.T, events <-chan state.Event) runtime.MachineStage {
	t.Helper()
	select {
	case ev := <-events:
		ms, ok := ev.Resource.(*runtime.MachineStatus)
		if ev.Type == state.Errored || !ok {
			t.Fatalf("watch event %v: %v", ev.Type, ev.Error)
		}
		return ms.TypedSpec().Stage
	case <-time.After(30 * time.Second):
		t.Fatal("no machine status event within 30s")
	}
	return runtime.MachineStageUnknown
}

func machineStage(ctx context.Context, c *client.Client) runtime.MachineStage {
	ms, err := safe.StateGetByID[*runtime.MachineStatus](ctx, c.COSI, runtime.MachineStatusID)
	if err != nil {
		return runtime.MachineStageUnknown
	}
	return ms.TypedSpec().Stage
}

// assertConfigured checks what a configured node serves, and that the
// maintenance (insecure) client no longer gets in.
func assertConfigured(ctx context.Context, t *testing.T, n node, tc *clientconfig.Config, hostname string) {
	t.Helper()
	c := configClient(t, tc, n.endpoint())
	v, err := c.Version(ctx)
	if err != nil {
		t.Fatalf("Version with the talosconfig: %v", err)
	}
	m := v.GetMessages()[0]
	if m.GetVersion().GetTag() != "v1.13.0" || m.GetPlatform().GetName() != "metal" || m.GetPlatform().GetMode() != "metal" || m.GetVersion().GetArch() != "amd64" {
		t.Errorf("Version: %v", m)
	}
	ms, err := safe.StateGetByID[*runtime.MachineStatus](ctx, c.COSI, runtime.MachineStatusID)
	if err != nil || ms.TypedSpec().Stage != runtime.MachineStageRunning || !ms.TypedSpec().Status.Ready {
		t.Errorf("machine status: %v %v", ms, err)
	}
	hs, err := safe.StateGetByID[*network.HostnameStatus](ctx, c.COSI, network.HostnameID)
	if err != nil || hs.TypedSpec().Hostname != hostname {
		t.Errorf("hostname status: %v %v, want %s", hs, err, hostname)
	}
	if _, err := insecureClient(t, n.endpoint()).Version(ctx); codeOf(err) != "Unavailable" {
		t.Errorf("insecure client against a configured node: %v, want a TLS refusal", err)
	}
	if _, err := safe.StateGetByID[*runtime.MachineStatus](ctx, insecureClient(t, n.endpoint()).COSI, runtime.MachineStatusID); err == nil {
		t.Error("insecure client reads resources of a configured node")
	}
}

// withRole is the talosconfig with a client certificate from the OS CA
// carrying role as its organization (none if empty).
func withRole(t *testing.T, cl *cluster, tc *clientconfig.Config, role string) *clientconfig.Config {
	t.Helper()
	ca, err := x509.NewCertificateAuthorityFromCertificateAndKey(cl.secrets.Certs.OS)
	if err != nil {
		t.Fatal(err)
	}
	opts := []x509.Option{x509.CommonName("someone"), x509.ExtKeyUsage([]stdx509.ExtKeyUsage{stdx509.ExtKeyUsageClientAuth})}
	if role != "" {
		opts = append(opts, x509.Organization(role))
	}
	kp, err := x509.NewKeyPair(ca, opts...)
	if err != nil {
		t.Fatal(err)
	}
	out := *tc
	ctx := *tc.Contexts[tc.Context]
	ctx.Crt = base64.StdEncoding.EncodeToString(kp.CrtPEM)
	ctx.Key = base64.StdEncoding.EncodeToString(kp.KeyPEM)
	out.Contexts = map[string]*clientconfig.Context{tc.Context: &ctx}
	return &out
}

// readLogs reads a whole (not followed) log stream from the Logs API.
func readLogs(ctx context.Context, c *client.Client, namespace string, driver common.ContainerDriver, id string, tail int32) (string, error) {
	stream, err := c.Logs(ctx, namespace, driver, id, false, tail)
	if err != nil {
		return "", err
	}
	var out strings.Builder
	for {
		d, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return out.String(), nil
		}
		if err != nil {
			return out.String(), err
		}
		out.Write(d.GetBytes())
	}
}
