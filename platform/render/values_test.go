package render_test

import (
	"strings"
	"testing"

	"cozy.dev/cozy/platform/render"
)

// TestValuesRejectRacks lists valid racks the platform still cannot serve,
// each with the rack field and the fix the error must name.
func TestValuesRejectRacks(t *testing.T) {
	for _, tc := range []struct {
		name  string
		edits []string
		want  []string
	}{
		{"IPv6-only pod network",
			[]string{"# podSubnets: [10.244.0.0/16]", "podSubnets: [fd00:10:244::/64]", "# serviceSubnets: [10.96.0.0/16]", "serviceSubnets: [fd00:10:96::/112]"},
			[]string{"cluster.podSubnets [fd00:10:244::/64] has no IPv4 network", "add one such as 10.244.0.0/16"}},
		{"pod network overlapping Kube-OVN's join network",
			[]string{"# podSubnets: [10.244.0.0/16]", "podSubnets: [100.64.0.0/16]"},
			[]string{"cluster.podSubnets 100.64.0.0/16 overlaps Kube-OVN's join network 100.64.0.0/16", "platform.values.network.joinCIDR"}},
		{"load balancer pool inside the service network",
			[]string{"loadBalancerPool: [192.168.100.200-192.168.100.250]", "loadBalancerPool: [10.96.0.0/28]"},
			[]string{"platform.loadBalancerPool[0] 10.96.0.0/28 is inside cluster.serviceSubnets 10.96.0.0/16"}},
		{"values the schema refuses",
			[]string{"platform:                       # what the platform layer (Flux) reads", "platform:\n  values: {storage: {replicas: 9}}"},
			[]string{"at '/storage/replicas': maximum: got 9, want 5"}},
		{"Git path outside the repository",
			[]string{"  # git:\n  #   url: https://git.example.com/ops/platform.git\n  #   branch: main\n  #   path: clusters/prod", "  git:\n    path: ../prod"},
			[]string{`platform.git.path "../prod" must be a folder inside the repository`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := render.Render(exampleRack(t, "prod", tc.edits...))
			if err == nil {
				t.Fatal("rendered; want an error")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error lacks %q:\n%v", w, err)
				}
			}
		})
	}
}
