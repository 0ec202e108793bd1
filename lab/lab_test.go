package lab

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"cozy.dev/cozy/bootstrap"
	"cozy.dev/cozy/bootstrap/imagefactory/factorytest"
	"cozy.dev/cozy/bootstrap/rack"
	"cozy.dev/cozy/bootstrap/talosconfig"
	"cozy.dev/cozy/internal/kernelimage"
	"cozy.dev/cozy/lab/nodeimage"
	"cozy.dev/cozy/platform/flux"
	"cozy.dev/cozy/platform/render"
)

func TestMachines(t *testing.T) {
	c := Config{Name: "t", Nodes: 5, ControlPlanes: 3, Firmware: FirmwareMixed}
	ms := c.Machines()
	var got []string
	for _, m := range ms {
		got = append(got, m.Name+"/"+m.Role+"/"+m.Firmware+"/"+m.IP.String()+"/"+m.Tap)
	}
	want := []string{
		"cp1/controlplane/bios/192.168.77.11/tap0",
		"cp2/controlplane/uefi/192.168.77.12/tap1",
		"cp3/controlplane/bios/192.168.77.13/tap2",
		"w1/worker/uefi/192.168.77.14/tap3",
		"w2/worker/bios/192.168.77.15/tap4",
	}
	if !slices.Equal(got, want) {
		t.Errorf("machines:\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	again := c.Machines()
	other := (&Config{Name: "u", Nodes: 5, ControlPlanes: 3}).Machines()
	for i := range ms {
		if ms[i].MACText != again[i].MACText || ms[i].UUID != again[i].UUID {
			t.Errorf("machine %d is not the same on a rebuild", i)
		}
		if ms[i].MACText == other[i].MACText || ms[i].UUID == other[i].UUID {
			t.Errorf("machine %d of two labs share a MAC or UUID", i)
		}
	}
}

// The rack a lab writes is valid and describes its machines; three
// control planes share a VIP as their endpoint, one is the endpoint.
func TestRackValidates(t *testing.T) {
	for _, tc := range []struct {
		fw            string
		controlPlanes int
		endpoint      string
	}{
		{FirmwareBIOS, 3, "https://192.168.77.10:6443"},
		{FirmwareUEFI, 3, "https://192.168.77.10:6443"},
		{FirmwareMixed, 3, "https://192.168.77.10:6443"},
		{FirmwareMixed, 1, "https://192.168.77.11:6443"},
	} {
		c := Config{Name: "lab-" + tc.fw, Nodes: 4, ControlPlanes: tc.controlPlanes, Firmware: tc.fw, Dir: t.TempDir()}
		c, err := c.WithDefaults()
		if err != nil {
			t.Fatal(err)
		}
		r := labRack(t, &c)
		for i, m := range r.Machines {
			target, err := m.BMCTarget()
			if err != nil || target.Address.String() != "redfish+https://"+c.Machines()[i].BMC.String()+"/redfish/v1/Systems/"+c.Machines()[i].UUID || !target.InsecureSkipVerify {
				t.Errorf("%s's BMC: %+v, %v", m.Hostname, target.Address, err)
			}
		}
		if len(r.ControlPlanes()) != tc.controlPlanes || len(r.Workers()) != 4-tc.controlPlanes || r.Network.DHCP.Mode != "full" || r.Cluster.Endpoint != tc.endpoint {
			t.Errorf("%s, %d control planes: endpoint %s, %d control planes, %d workers, DHCP %s", tc.fw, tc.controlPlanes,
				r.Cluster.Endpoint, len(r.ControlPlanes()), len(r.Workers()), r.Network.DHCP.Mode)
		}
	}
}

// labRack writes the lab's BMC account, as lab up does, and parses its
// rack.
func labRack(t *testing.T, c *Config) *rack.Rack {
	t.Helper()
	if err := c.writeBMCCredentials(); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(filepath.Join(c.Dir, BMCCredentialsFile)); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("the BMC account: %v, %v; want mode 0600", fi, err)
	}
	r, err := rack.Parse(c.Rack(), "rack.yaml", c.Dir)
	if err != nil {
		t.Fatalf("%v\n%s", err, c.Rack())
	}
	return r
}

// The emulated lab's control planes get leader leases long enough for a
// VM without KVM; every node's kubelet gives the runtime 10 minutes.
func TestRackSlowLeases(t *testing.T) {
	c := Config{Name: "leases", Nodes: 2, ControlPlanes: 1, Dir: t.TempDir()}
	c, err := c.WithDefaults()
	if err != nil {
		t.Fatal(err)
	}
	r := labRack(t, &c)
	w, err := talosconfig.Write(r, filepath.Join(c.Dir, "configs"))
	if err != nil {
		t.Fatal(err)
	}
	for host, want := range map[string]bool{"cp1": true, "w1": false} {
		data, err := os.ReadFile(w.Configs[host])
		if err != nil {
			t.Fatal(err)
		}
		for _, arg := range []string{"leader-elect-lease-duration: 60s", "leader-elect-renew-deadline: 40s", "leader-elect-retry-period: 10s"} {
			if n := strings.Count(string(data), arg); (n == 2) != want || n%2 != 0 {
				t.Errorf("%s's config has %q %d times; want it for the controller-manager and the scheduler of control planes only", host, arg, n)
			}
		}
		if !strings.Contains(string(data), "runtimeRequestTimeout: 10m") {
			t.Errorf("%s's kubelet has not the lab's runtimeRequestTimeout", host)
		}
	}
}

func TestWithDefaults(t *testing.T) {
	tests := []struct {
		c       Config
		wantErr string
	}{
		{Config{}, ""},
		{Config{Name: "Bad_Name"}, "lab name"},
		{Config{ControlPlanes: 2}, "--controlplanes 2"},
		{Config{Nodes: 2, ControlPlanes: 3}, "--nodes 2"},
		{Config{Firmware: "coreboot"}, "--firmware"},
		{Config{Image: "talos"}, "add --internet"},
		{Config{Image: "talos", Internet: true}, ""},
		{Config{Factory: "factory.example.com"}, "--factory"},
		{Config{Accel: "hvf"}, "--accel"},
		{Config{MemoryMiB: 128}, "--memory"},
		{Config{NodeServices: "sometimes"}, "--node-services"},
		{Config{NodeServices: "off"}, ""},
		{Config{Image: "talos", Internet: true, NodeServices: "on"}, "--node-services is for the emulated nodes"},
	}
	for _, tt := range tests {
		_, err := tt.c.WithDefaults()
		if (tt.wantErr == "") != (err == nil) || err != nil && !strings.Contains(err.Error(), tt.wantErr) {
			t.Errorf("%+v: %v, want %q", tt.c, err, tt.wantErr)
		}
	}
	c := Config{}
	c, _ = c.WithDefaults()
	if c.Name != "cozy" || c.Nodes != 3 || c.Firmware != "mixed" || c.Accel != "auto" || c.NodeServices != "auto" || !strings.HasSuffix(c.Dir, "cozy/labs/cozy") {
		t.Errorf("defaults: %+v", c)
	}
}

// Node services: auto runs them only under KVM; on and off say so
// whatever the accelerator; real Talos is never switched.
func TestRunsNodeServices(t *testing.T) {
	for _, tc := range []struct {
		image, services, accel string
		want                   bool
	}{
		{"emulated", NodeServicesAuto, "kvm", true},
		{"emulated", NodeServicesAuto, "tcg", false},
		{"emulated", NodeServicesOn, "tcg", true},
		{"emulated", NodeServicesOff, "kvm", false},
		{"talos", NodeServicesAuto, "kvm", false},
	} {
		c := Config{Image: tc.image, NodeServices: tc.services}
		if got := c.runsNodeServices(tc.accel); got != tc.want {
			t.Errorf("%s image, --node-services %s, %s: %v, want %v", tc.image, tc.services, tc.accel, got, tc.want)
		}
	}
}

func TestQEMUArgs(t *testing.T) {
	c := Config{Name: "q", Nodes: 2, ControlPlanes: 1, Firmware: FirmwareMixed, MemoryMiB: 1024, Dir: "/labs/q"}
	ms := c.Machines()
	tests := []struct {
		m         Machine
		want, not []string
	}{
		{ms[0], []string{"-machine pc", "-accel tcg", "-m 1024", "mac=" + ms[0].MACText, "ifname=tap0", ",bootindex=1",
			"file=/labs/q/vms/cp1/disk.qcow2,format=qcow2,if=none,id=disk0,cache=unsafe", "virtio-blk-pci,drive=disk0,bootindex=2", "-serial file:/labs/q/vms/cp1/serial.log", "-uuid " + ms[0].UUID}, []string{"pflash", "romfile="}},
		{ms[1], []string{"-machine q35", ",romfile=", "file=" + OVMFCode, "file=/labs/q/vms/w1/OVMF_VARS.fd"}, nil},
	}
	for _, tt := range tests {
		line := strings.Join(c.qemuArgs(tt.m, "tcg", true), " ")
		for _, w := range tt.want {
			if !strings.Contains(line, w) {
				t.Errorf("%s: %q missing from\n%s", tt.m.Name, w, line)
			}
		}
		for _, n := range tt.not {
			if strings.Contains(line, n) {
				t.Errorf("%s: %q should not be in\n%s", tt.m.Name, n, line)
			}
		}
	}
	args := strings.Join(c.BootstrapArgs(kernelimage.Image{Kernel: "/k", Initrds: []string{"/i"}, Cmdline: "console=ttyS0"}), " ")
	if args != "bootstrap --rack /labs/q/rack.yaml --state-dir /labs/q/state --kernel /k --server-ip 192.168.77.1 --initrd /i --cmdline console=ttyS0" {
		t.Errorf("bootstrap args: %s", args)
	}
}

func TestNodeCmdline(t *testing.T) {
	tests := []struct {
		name, image, accel string
		nodeServices       bool
		want               string
	}{
		{"kvm with node services", "", "kvm", true, "console=ttyS0 panic=-1"},
		{"tcg with node services: the TSC, no PTI", "", "tcg", true, "console=ttyS0 panic=-1 tsc=reliable pti=off"},
		{"tcg without: the TSC and the API only", "", "tcg", false, "console=ttyS0 panic=-1 tsc=reliable pti=off cozy.api_only"},
		{"kvm without", "", "kvm", false, "console=ttyS0 panic=-1 cozy.api_only"},
		{"Talos under tcg: its own services, the TSC", "talos", "tcg", false, "console=ttyS0 panic=-1 tsc=reliable pti=off"},
	}
	for _, tt := range tests {
		c := &Config{Image: tt.image}
		if got := c.nodeCmdline(nodeimage.Cmdline, tt.accel, tt.nodeServices); got != tt.want {
			t.Errorf("%s: %q, want %q", tt.name, got, tt.want)
		}
	}
}

func TestMilestones(t *testing.T) {
	ev := func(sec int, node, phase string) string {
		return fmt.Sprintf(`{"v":1,"time":"2026-11-30T00:00:00Z","node":%q,"phase":%q,"elapsed":%d}`+"\n", node, phase, time.Duration(sec)*time.Second)
	}
	events := ev(0, "cp1", "pending") + ev(0, "w1", "pending") +
		ev(40, "w1", "discovered") + ev(45, "cp1", "discovered") +
		ev(46, "cp1", "applied") + ev(50, "w1", "applied") +
		ev(100, "cp1", "configured") + ev(101, "cp1", "etcd") +
		ev(130, "w1", "configured") +
		fmt.Sprintf(`{"v":1,"phase":"etcd","elapsed":%d,"message":%q}`+"\n", 150*time.Second, bootstrap.MessageAPIAnswers) +
		ev(190, "cp1", "ready") + ev(190, "w1", "ready") + ev(190, "", "ready")
	got, err := milestones(strings.NewReader(events), 2*time.Second, 2)
	if err != nil {
		t.Fatal(err)
	}
	want := []Milestone{
		{"all machines in maintenance mode", 47 * time.Second},
		{"all configs applied", 52 * time.Second},
		{"etcd bootstrapped", 103 * time.Second},
		{"all machines installed", 132 * time.Second},
		{"the API answers", 152 * time.Second},
		{"bootstrap done", 192 * time.Second},
	}
	if !slices.Equal(got, want) {
		t.Errorf("milestones:\n got %v\nwant %v", got, want)
	}

	// A run that stopped early reports what every machine reached, and
	// output that is not events ends the list without an error.
	got, err = milestones(strings.NewReader(ev(40, "w1", "discovered")+ev(45, "cp1", "discovered")+ev(50, "w1", "applied")+"panic: oops\n"), 0, 2)
	if want := []Milestone{{"all machines in maintenance mode", 45 * time.Second}}; err != nil || !slices.Equal(got, want) {
		t.Errorf("partial run: got %v, %v; want %v", got, err, want)
	}

	// Events of another version (here, before versions) are refused.
	_, err = milestones(strings.NewReader(`{"time":"2026-11-30T00:00:00Z","node":"cp1","phase":"pending","elapsed":0}`+"\n"), 0, 1)
	if err == nil || !strings.Contains(err.Error(), "events of version 0, this lab reads version 1") {
		t.Errorf("unversioned events: %v, want a version error", err)
	}
}

// TestTalosImage: --image talos registers the lab rack's schematic with
// the factory the lab names and fetches its kernel and initramfs into the
// cache; the rack the bootstrap reads names the same factory.
func TestTalosImage(t *testing.T) {
	f := factorytest.Start(t)
	c := Config{Name: "t", Dir: t.TempDir(), Image: "talos", Internet: true, Factory: f.URL}
	c, err := c.WithDefaults()
	if err != nil {
		t.Fatal(err)
	}
	r := labRack(t, &c)
	cache := t.TempDir()
	img, err := TalosImage(context.Background(), &c, f.HTTP, cache)
	if err != nil {
		t.Fatal(err)
	}
	id, _ := r.Talos.Schematic.SchematicID()
	if r.Network.Gateway != ServerIP.String() || len(r.Network.DNS) == 0 {
		t.Errorf("with --internet the rack's network has gateway %q and DNS %v; want the netboot server's address and resolvers", r.Network.Gateway, r.Network.DNS)
	}
	if r.Talos.Factory != f.URL {
		t.Errorf("the rack's factory is %s, want the lab's %s", r.Talos.Factory, f.URL)
	}
	want := filepath.Join(cache, "talos", id, r.Talos.Version)
	if img.Kernel != filepath.Join(want, "kernel-amd64") || len(img.Initrds) != 1 || img.Initrds[0] != filepath.Join(want, "initramfs-amd64.xz") {
		t.Errorf("image %+v, want the assets under %s", img, want)
	}
	kernel, err := os.ReadFile(img.Kernel)
	if err != nil || !bytes.Equal(kernel, factorytest.Kernel()) {
		t.Errorf("kernel: %v", err)
	}
}

// A lab with --platform: its rack points Flux at the lab's Git server and
// the charts at its registry, with a load-balancer pool on the bridge
// past the DHCP range, and renders with only the components whose images
// Cozy builds on (networking off: flannel stays the lab's network).
func TestRackPlatform(t *testing.T) {
	c := Config{Name: "plat", Nodes: 2, ControlPlanes: 1, Dir: t.TempDir(), Platform: true}
	c, err := c.WithDefaults()
	if err != nil {
		t.Fatal(err)
	}
	r := labRack(t, &c)
	if r.Platform.Git.URL != "http://192.168.77.1:3000/platform.git" || r.Platform.Git.Branch != "main" || r.Platform.Mirror != "http://192.168.77.1:5000/charts" {
		t.Errorf("git %q, mirror %q", r.Platform.Git.URL, r.Platform.Mirror)
	}
	if !slices.Equal(r.Platform.LoadBalancerPool, []string{PoolFrom + "-" + PoolTo}) || r.Cluster.CNI != rack.CNIFlannel {
		t.Errorf("pool %v, cni %s", r.Platform.LoadBalancerPool, r.Cluster.CNI)
	}
	objs := mustObjects(t, r)
	var on []string
	for _, o := range objs {
		if o.GetKind() == "Kustomization" && o.GetAPIVersion() == "kustomize.toolkit.fluxcd.io/v1" {
			on = append(on, o.GetName())
		}
	}
	if !slices.Equal(on, PlatformComponents) {
		t.Errorf("components on: %v, want %v", on, PlatformComponents)
	}
	// MetalLB's probes wait for a VM without KVM, through its HelmRelease;
	// its speakers run on the worker only; every component waits
	// FluxTimeout, and so do the Deployments Helm installs.
	var probe any
	for _, o := range objs {
		if o.GetKind() == "HelmRelease" && o.GetName() == "metallb" {
			probe, _, _ = unstructured.NestedFieldNoCopy(o.Object, "spec", "values", "controller", "livenessProbe", "initialDelaySeconds")
			if frr, found, _ := unstructured.NestedBool(o.Object, "spec", "values", "speaker", "frr", "enabled"); !found || frr {
				t.Error("the lab's overrides dropped the speaker's frr.enabled: false")
			}
			terms, _, _ := unstructured.NestedSlice(o.Object, "spec", "values", "speaker", "affinity", "nodeAffinity",
				"requiredDuringSchedulingIgnoredDuringExecution", "nodeSelectorTerms")
			if got := fmt.Sprint(terms); got != "[map[matchExpressions:[map[key:node-role.kubernetes.io/control-plane operator:DoesNotExist]]]]" {
				t.Errorf("speaker's node affinity %s, want no control planes with a worker", got)
			}
			if _, found, _ := unstructured.NestedFieldNoCopy(o.Object, "spec", "values", "speaker", "ignoreExcludeLB"); found {
				t.Error("with a worker, the speaker need not ignore the control planes' exclude label")
			}
		}
		if k := o.GetKind(); k == "HelmRelease" || k == "Kustomization" && o.GetAPIVersion() == "kustomize.toolkit.fluxcd.io/v1" {
			if got, _, _ := unstructured.NestedString(o.Object, "spec", "timeout"); got != "40m" {
				t.Errorf("%s %s: timeout %q, want the lab's %s", k, o.GetName(), got, FluxTimeout)
			}
		}
		if o.GetKind() == "HelmRelease" {
			prs, _, _ := unstructured.NestedSlice(o.Object, "spec", "postRenderers")
			if !strings.Contains(fmt.Sprint(prs), "progressDeadlineSeconds\n  value: 2400") {
				t.Errorf("HelmRelease %s: post-renderers %v, want Deployments' progress deadline at FluxTimeout", o.GetName(), prs)
			}
		}
	}
	if fmt.Sprint(probe) != "900" {
		t.Errorf("MetalLB controller's liveness probe delay %v (%T), want 900", probe, probe)
	}

	// A lab of one control plane keeps its speaker there: someone has to
	// announce the pool.
	one := c
	one.Nodes = 1
	for _, o := range mustObjects(t, labRack(t, &one)) {
		if o.GetKind() == "HelmRelease" && o.GetName() == "metallb" {
			if _, found, _ := unstructured.NestedFieldNoCopy(o.Object, "spec", "values", "speaker", "affinity"); found {
				t.Error("a one-node lab keeps its speaker off its only node")
			}
			// ... and lets it announce from a node Talos labels
			// exclude-from-external-load-balancers.
			if ignore, _, _ := unstructured.NestedBool(o.Object, "spec", "values", "speaker", "ignoreExcludeLB"); !ignore {
				t.Error("a one-node lab's speaker honours its control plane's exclude-from-external-load-balancers label: nobody announces")
			}
		}
	}

	// Without --platform the rack has no platform section at all.
	c.Platform = false
	if r := labRack(t, &c); r.Platform.Git.URL != "" || len(r.Platform.Components) != 0 {
		t.Errorf("a lab without --platform: %+v", r.Platform)
	}
}

// mustObjects renders the platform for r.
func mustObjects(t *testing.T, r *rack.Rack) []render.Object {
	t.Helper()
	l, err := render.Render(r)
	if err != nil {
		t.Fatal(err)
	}
	objs, err := l.Objects()
	if err != nil {
		t.Fatal(err)
	}
	return objs
}

// The Flux the lab installs gives its controllers five minutes before
// their liveness probes count and long leader leases, and is otherwise the
// manifests given.
func TestFluxManifestsPatched(t *testing.T) {
	c := Config{Dir: t.TempDir()}
	src := filepath.Join(t.TempDir(), "install.yaml")
	const install = `apiVersion: v1
kind: Namespace
metadata: {name: flux-system}
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: source-controller, namespace: flux-system}
spec:
  template:
    spec:
      containers:
      - name: manager
        image: ghcr.io/fluxcd/source-controller:v1.9.6
        args: [--enable-leader-election, --storage-path=/data]
        livenessProbe: {httpGet: {port: healthz, path: /healthz}}
        readinessProbe: {httpGet: {port: healthz, path: /readyz}}
`
	crds := ""
	for _, n := range []string{"gitrepositories.source", "helmrepositories.source", "ocirepositories.source", "helmcharts.source",
		"kustomizations.kustomize", "helmreleases.helm"} {
		crds += "---\napiVersion: apiextensions.k8s.io/v1\nkind: CustomResourceDefinition\nmetadata: {name: " + n + ".toolkit.fluxcd.io}\n"
	}
	if err := os.WriteFile(src, []byte(install+crds), 0o644); err != nil {
		t.Fatal(err)
	}
	dir, err := c.fluxManifests(src)
	if err != nil {
		t.Fatal(err)
	}
	objs, err := flux.Load(context.Background(), dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(objs) != 8 {
		t.Fatalf("%d objects, want the 8 given", len(objs))
	}
	for _, o := range objs {
		if o.GetKind() != "Deployment" {
			continue
		}
		cs, _, _ := unstructured.NestedSlice(o.Object, "spec", "template", "spec", "containers")
		probe := cs[0].(map[string]any)["livenessProbe"].(map[string]any)
		if fmt.Sprint(probe["initialDelaySeconds"], probe["timeoutSeconds"], probe["failureThreshold"]) != "300 10 6" || probe["httpGet"] == nil {
			t.Errorf("liveness probe %v, want the given one with initialDelaySeconds 300, timeoutSeconds 10, failureThreshold 6", probe)
		}
		if ready := cs[0].(map[string]any)["readinessProbe"].(map[string]any); fmt.Sprint(ready["timeoutSeconds"]) != "10" || ready["httpGet"] == nil {
			t.Errorf("readiness probe %v, want the given one with timeoutSeconds 10", ready)
		}
		want := "[--enable-leader-election --storage-path=/data --leader-election-lease-duration=120s --leader-election-renew-deadline=90s --leader-election-retry-period=20s]"
		if got := fmt.Sprint(cs[0].(map[string]any)["args"]); got != want {
			t.Errorf("args %s, want the given ones and the lab's leases: %s", got, want)
		}
	}
}
