package upgrade

import (
	"strings"
	"testing"

	"github.com/siderolabs/talos/pkg/machinery/config/configloader"
	"github.com/siderolabs/talos/pkg/machinery/config/configpatcher"
	"github.com/siderolabs/talos/pkg/machinery/config/generate"
	"github.com/siderolabs/talos/pkg/machinery/config/machine"

	"cozy.dev/cozy/bootstrap/rack"
)

// TestKubernetesPlanOrder: each control-plane component on every control
// plane, then kube-proxy where it runs, then every kubelet, control
// planes first; what is on the version already says so.
func TestKubernetesPlanOrder(t *testing.T) {
	r := &rack.Rack{Machines: []rack.Machine{
		{Hostname: "w1", Role: rack.RoleWorker}, {Hostname: "cp2", Role: rack.RoleControlPlane},
		{Hostname: "cp1", Role: rack.RoleControlPlane},
	}}
	cp := func(name, kubelet string) nodeConfig {
		return nodeConfig{name: name, controlPlane: true, images: map[string]string{
			APIServer: "registry.k8s.io/kube-apiserver:v1.36.3", ControllerManager: "registry.k8s.io/kube-controller-manager:v1.35.4",
			Scheduler: "registry.k8s.io/kube-scheduler:v1.35.4", KubeProxy: "registry.k8s.io/kube-proxy:v1.35.4", Kubelet: kubelet,
		}}
	}
	nodes := map[string]nodeConfig{
		"cp1": cp("cp1", "ghcr.io/siderolabs/kubelet:v1.35.4"),
		"cp2": cp("cp2", "ghcr.io/siderolabs/kubelet:v1.35.4"),
		"w1":  {name: "w1", images: map[string]string{Kubelet: "ghcr.io/siderolabs/kubelet:v1.35.4"}},
	}
	var got []string
	for _, s := range plan(r, "", nodes, "v1.36.3") {
		got = append(got, s.Component+"/"+s.Node+"/"+s.Result)
	}
	want := []string{
		"kube-apiserver/cp2/already on the version", "kube-apiserver/cp1/already on the version",
		"kube-controller-manager/cp2/to upgrade", "kube-controller-manager/cp1/to upgrade",
		"kube-scheduler/cp2/to upgrade", "kube-scheduler/cp1/to upgrade",
		"kube-proxy/cp2/to upgrade", "kube-proxy/cp1/to upgrade",
		"kubelet/cp2/to upgrade", "kubelet/cp1/to upgrade", "kubelet/w1/to upgrade",
	}
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Errorf("plan:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	// cp2 holds the VIP: it goes last of the control planes, each step.
	got = nil
	for _, s := range plan(r, "cp2", nodes, "v1.36.3") {
		got = append(got, s.Component+"/"+s.Node)
	}
	want = []string{
		"kube-apiserver/cp1", "kube-apiserver/cp2", "kube-controller-manager/cp1", "kube-controller-manager/cp2",
		"kube-scheduler/cp1", "kube-scheduler/cp2", "kube-proxy/cp1", "kube-proxy/cp2",
		"kubelet/cp1", "kubelet/cp2", "kubelet/w1",
	}
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Errorf("plan with the VIP on cp2:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// TestImagePatch: each component's patch, applied as Talos's patcher
// applies it, changes that component's image and nothing else.
func TestImagePatch(t *testing.T) {
	in, err := generate.NewInput("lab", "https://10.0.0.9:6443", "1.35.4")
	if err != nil {
		t.Fatal(err)
	}
	base, err := in.Config(machine.TypeControlPlane)
	if err != nil {
		t.Fatal(err)
	}
	for _, comp := range []string{APIServer, ControllerManager, Scheduler, KubeProxy, Kubelet} {
		p, err := configpatcher.LoadPatch([]byte(imagePatch(comp, "example.org/"+comp+":v1.36.3")))
		if err != nil {
			t.Fatalf("%s: %v", comp, err)
		}
		out, err := configpatcher.Apply(configpatcher.WithConfig(base), []configpatcher.Patch{p})
		if err != nil {
			t.Fatalf("%s: %v", comp, err)
		}
		b, err := out.Bytes()
		if err != nil {
			t.Fatal(err)
		}
		mc, err := configloader.NewFromBytes(b)
		if err != nil {
			t.Fatalf("%s: the patched config does not load: %v", comp, err)
		}
		cl := mc.Cluster()
		got := map[string]string{
			APIServer: cl.APIServer().Image(), ControllerManager: cl.ControllerManager().Image(),
			Scheduler: cl.Scheduler().Image(), KubeProxy: cl.Proxy().Image(), Kubelet: mc.Machine().Kubelet().Image(),
		}
		for c, img := range got {
			want := tagOf(img) == "v1.36.3"
			if (c == comp) != want || c == comp && !strings.HasPrefix(img, "example.org/") {
				t.Errorf("patch of %s: %s is %s", comp, c, img)
			}
		}
	}
}
