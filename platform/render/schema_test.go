package render_test

import (
	"errors"
	"strings"
	"testing"

	"cozy.dev/cozy/charts"
	"cozy.dev/cozy/platform/render"
)

// valid is the least the platform chart needs; each case changes one thing.
func valid() map[string]any {
	return map[string]any{
		"cluster": map[string]any{"name": "lab"},
		"git":     map[string]any{"path": "clusters/lab"},
	}
}

func with(path string, v any) map[string]any {
	vals := valid()
	keys := strings.Split(path, ".")
	m := vals
	for _, k := range keys[:len(keys)-1] {
		next, ok := m[k].(map[string]any)
		if !ok {
			next = map[string]any{}
			m[k] = next
		}
		m = next
	}
	m[keys[len(keys)-1]] = v
	return vals
}

// TestPlatformSchemaRejects lists values the platform chart must refuse,
// each with the path and the reason the message must name.
func TestPlatformSchemaRejects(t *testing.T) {
	for _, tc := range []struct {
		name   string
		values map[string]any
		want   []string
	}{
		{"no cluster name", with("cluster.name", ""), []string{"at '/cluster/name': '' is not a DNS label"}},
		{"upper-case cluster name", with("cluster.name", "Lab"), []string{"at '/cluster/name': 'Lab' is not a DNS label: lower-case letters, digits and '-'"}},
		{"no git path", with("git.path", ""), []string{"/git/path"}},
		{"git path leaves the repository", with("git.path", "../elsewhere"), []string{"/git/path"}},
		{"absolute git path", with("git.path", "/clusters/lab"), []string{"/git/path"}},
		{"pod CIDR with host bits out of range", with("network.podCIDR", "10.244.0.0/33"), []string{"at '/network/podCIDR': '10.244.0.0/33' is not an IPv4 CIDR such as 10.244.0.0/16"}},
		{"pod gateway not an address", with("network.podGateway", "10.244.0"), []string{"/network/podGateway"}},
		{"IPv6 service CIDR", with("network.serviceCIDR", "fd00::/108"), []string{"/network/serviceCIDR"}},
		{"load balancer pool entry", with("metallb.addresses", []any{"192.168.1.10..20"}), []string{"at '/metallb/addresses/0': '192.168.1.10..20' is not an IPv4 range such as 192.168.100.200-192.168.100.250"}},
		{"storage backend", with("storage.backend", "ceph"), []string{"/storage/backend", "value must be one of 'lvm-thin', 'zfs'"}},
		{"storage device not under /dev", with("storage.devices", []any{"sdb"}), []string{"at '/storage/devices/0': 'sdb' is not a device path under /dev/"}},
		{"zero replicas", with("storage.replicas", 0), []string{"/storage/replicas", "minimum"}},
		{"misspelt section", with("metalb", map[string]any{"addresses": []any{}}), []string{"additional properties 'metalb' not allowed"}},
		{"misspelt field", with("storage.device", []any{"/dev/sdb"}), []string{"/storage", "additional properties 'device' not allowed"}},
		{"version range instead of a pin", with("versions.cilium", "~1.20"), []string{"at '/versions/cilium': '~1.20' is not an exact chart version such as 1.2.3 (no ranges: versions are pinned)"}},
		{"release without its v", with("versions.kubevirt", "1.9.0"), []string{"/versions/kubevirt"}},
		{"interval in words", with("flux.interval", "ten minutes"), []string{"/flux/interval"}},
		{"timeout in words", with("flux.timeout", "an hour"), []string{"/flux/timeout"}},
		{"progress deadline in words", with("flux.progressDeadlineSeconds", "40m"), []string{"/flux/progressDeadlineSeconds"}},
		{"negative progress deadline", with("flux.progressDeadlineSeconds", -1), []string{"/flux/progressDeadlineSeconds", "minimum"}},
		{"feature gate spelling", with("kubevirt.featureGates", []any{"live-migration"}), []string{"/kubevirt/featureGates/0"}},
		{"emulation not a boolean", with("kubevirt.useEmulation", "yes"), []string{"/kubevirt/useEmulation", "want boolean"}},
		{"PCI device without its vendor selector", with("kubevirt.permittedHostDevices", map[string]any{"pciHostDevices": []any{map[string]any{"resourceName": "nvidia.com/A10"}}}), []string{"/kubevirt/permittedHostDevices/pciHostDevices/0", "missing property 'pciVendorSelector'"}},
		{"PCI device resource without a vendor", with("kubevirt.permittedHostDevices", map[string]any{"pciHostDevices": []any{map[string]any{"pciVendorSelector": "10de:2236", "resourceName": "A10"}}}), []string{"/kubevirt/permittedHostDevices/pciHostDevices/0/resourceName"}},
		{"USB devices (not offered)", with("kubevirt.permittedHostDevices", map[string]any{"usb": []any{}}), []string{"additional properties 'usb' not allowed"}},
		{"worker image with a tag", with("cozyOperator.workerImage", map[string]any{"repository": "10.0.0.1:5000/cozy.dev/tenant-worker:v1.36.3"}), []string{"/cozyOperator/workerImage/repository"}},
		{"worker image without a host", with("cozyOperator.workerImage", map[string]any{"repository": "tenant-worker"}), []string{"/cozyOperator/workerImage/repository"}},
		{"worker mirror without a scheme", with("cozyOperator.workerImage", map[string]any{"mirror": "10.0.0.1:5000"}), []string{"/cozyOperator/workerImage/mirror"}},
		{"worker mirrors for an upper-case host", with("cozyOperator.workerImage", map[string]any{"mirrors": map[string]any{"Docker.io": []any{"http://10.0.0.1:5000"}}}), []string{"/cozyOperator/workerImage/mirrors", "additional properties 'Docker.io' not allowed"}},
		{"worker mirrors without endpoints", with("cozyOperator.workerImage", map[string]any{"mirrors": map[string]any{"docker.io": []any{}}}), []string{"/cozyOperator/workerImage/mirrors/docker.io", "minItems"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := render.RenderValues(tc.values, "")
			wantSchemaError(t, err, tc.want...)
		})
	}
}

func TestPlatformSchemaAcceptsValid(t *testing.T) {
	if _, err := render.RenderValues(valid(), ""); err != nil {
		t.Fatal(err)
	}
}

func TestOperatorSchemaRejects(t *testing.T) {
	c, err := render.LoadChart(charts.CozyOperator)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name   string
		values map[string]any
		want   []string
	}{
		{"no replicas", map[string]any{"replicas": 0}, []string{"/replicas", "minimum"}},
		{"log level", map[string]any{"logLevel": "verbose"}, []string{"/logLevel", "value must be one of"}},
		{"privileged metrics port", map[string]any{"metrics": map[string]any{"port": 80}}, []string{"/metrics/port", "minimum"}},
		{"image with tag in repository", map[string]any{"image": map[string]any{"repository": "Ghcr.io/Cozy"}}, []string{"/image/repository"}},
		{"several replicas without leader election", map[string]any{"replicas": 2, "leaderElection": map[string]any{"enabled": false}}, []string{"at '/replicas': maximum: got 2, want 1"}},
		{"misspelt field", map[string]any{"replica": 2}, []string{"additional properties 'replica' not allowed"}},
		{"add-on chart from an OCI repository", map[string]any{"addons": map[string]any{"charts": map[string]any{"cilium": map[string]any{
			"sourceRef": map[string]any{"kind": "OCIRepository", "namespace": "a", "name": "b"}, "chart": "cilium"}}}}, []string{"/addons/charts/cilium/sourceRef/kind"}},
		{"add-on chart source in a bad namespace", map[string]any{"addons": map[string]any{"charts": map[string]any{"metrics-server": map[string]any{
			"sourceRef": map[string]any{"namespace": "Cozy_Addons"}}}}}, []string{"/addons/charts/metrics-server/sourceRef/namespace"}},
		{"chart for an unknown add-on", map[string]any{"addons": map[string]any{"charts": map[string]any{"calico": map[string]any{}}}}, []string{"additional properties 'calico' not allowed"}},
		{"unknown add-on image", map[string]any{"addons": map[string]any{"images": map[string]any{"cilium": "x"}}}, []string{"additional properties 'cilium' not allowed"}},
		{"permitted GPU not a resource name", map[string]any{"permittedGPUs": []any{"A10"}}, []string{"/permittedGPUs/0"}},
		{"worker image with a tag", map[string]any{"workerImage": map[string]any{"repository": "10.0.0.1:5000/cozy.dev/tenant-worker:v1.36.3"}}, []string{"/workerImage/repository"}},
		{"worker image insecure not a boolean", map[string]any{"workerImage": map[string]any{"insecure": "yes"}}, []string{"/workerImage/insecure"}},
		{"worker mirror with a path", map[string]any{"workerImage": map[string]any{"mirror": "http://10.0.0.1:5000/v2/docker.io"}}, []string{"/workerImage/mirror"}},
		{"worker mirrors endpoint without a scheme", map[string]any{"workerImage": map[string]any{"mirrors": map[string]any{"docker.io": []any{"10.0.0.1:5000"}}}}, []string{"/workerImage/mirrors/docker.io/0"}},
		{"worker mirrors for a path", map[string]any{"workerImage": map[string]any{"mirrors": map[string]any{"docker.io/library": []any{"http://10.0.0.1:5000"}}}}, []string{"/workerImage/mirrors"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := render.Chart(c, tc.values, "cozy-operator", "cozy-system", "")
			wantSchemaError(t, err, tc.want...)
		})
	}
}

// wantSchemaError fails unless err is a schema error saying each of want.
func wantSchemaError(t *testing.T, err error, want ...string) {
	t.Helper()
	var se *render.SchemaError
	if !errors.As(err, &se) {
		t.Fatalf("got %v, want a schema error", err)
	}
	for _, w := range want {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("error lacks %q:\n%v", w, err)
		}
	}
}
