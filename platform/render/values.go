package render

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"net/netip"
	"net/url"
	"path"
	"strings"

	"helm.sh/helm/v3/pkg/chartutil"

	"cozy.dev/cozy/bootstrap/rack"
	"cozy.dev/cozy/internal/imageref"
)

// DefaultJoinCIDR is Kube-OVN's node-to-pod network unless the rack's
// platform.values say otherwise.
const DefaultJoinCIDR = "100.64.0.0/16"

// Values returns the platform chart's values for a loaded (defaulted and
// validated) rack: what the rack says about the cluster, its networks,
// load-balancer pool, storage and Git path, with the rack's
// platform.values merged over them. It fails, naming the rack field, when
// the rack asks for something the platform cannot do.
func Values(r *rack.Rack) (map[string]any, error) {
	pod, err := firstIPv4(r.Cluster.PodSubnets, "cluster.podSubnets")
	if err != nil {
		return nil, err
	}
	svc, err := firstIPv4(r.Cluster.ServiceSubnets, "cluster.serviceSubnets")
	if err != nil {
		return nil, err
	}
	gitPath, err := cleanGitPath(r.Platform.Git.Path)
	if err != nil {
		return nil, err
	}

	var cps []any
	for _, m := range r.ControlPlanes() {
		if a := m.StaticAddress(); a.Is4() {
			cps = append(cps, a.String())
		}
	}
	if len(cps) != len(r.ControlPlanes()) {
		cps = nil // Kube-OVN finds them by label instead
	}
	generated := map[string]any{
		"cluster": map[string]any{
			"name":   r.Metadata.Name,
			"domain": r.Cluster.DNSDomain,
			"cni":    r.Cluster.CNI,
		},
		"network": map[string]any{
			"podCIDR":               pod.String(),
			"podGateway":            pod.Addr().Next().String(),
			"serviceCIDR":           svc.String(),
			"controlPlaneAddresses": orEmpty(cps),
		},
		"git": map[string]any{"path": gitPath},
		"metallb": map[string]any{
			"addresses": strings2any(r.Platform.LoadBalancerPool),
		},
		"storage": map[string]any{
			"backend": r.Platform.Storage.Backend,
			"devices": strings2any(r.Platform.Storage.Devices),
		},
	}

	if len(r.Platform.Components) > 0 {
		comps := map[string]any{}
		for name, c := range r.Platform.Components {
			m := map[string]any{}
			if c.Enabled != nil {
				m["enabled"] = *c.Enabled
			}
			if len(c.Values) > 0 {
				v, err := deepCopy(map[string]any{"values": c.Values})
				if err != nil {
					return nil, fmt.Errorf("platform.components.%s.values: %w", name, err)
				}
				m["values"] = v["values"]
			}
			comps[name] = m
		}
		generated["components"] = comps
	}
	workerImage := map[string]any{}
	if r.Registries.Mirror != "" {
		// Validated by the rack: http(s)://HOST[:PORT].
		u, err := url.Parse(r.Registries.Mirror)
		if err != nil {
			return nil, fmt.Errorf("registries.mirror: %w", err)
		}
		workerImage["repository"] = u.Host + "/" + imageref.WorkerImage
		workerImage["insecure"] = u.Scheme == "http"
		workerImage["mirror"] = strings.TrimSuffix(r.Registries.Mirror, "/")
	}
	if len(r.Registries.Mirrors) > 0 {
		mirrors := map[string]any{}
		for host, endpoints := range r.Registries.Mirrors {
			eps := make([]any, len(endpoints))
			for i, ep := range endpoints {
				eps[i] = ep
			}
			mirrors[host] = eps
		}
		workerImage["mirrors"] = mirrors
	}
	if len(workerImage) > 0 {
		generated["cozyOperator"] = map[string]any{"workerImage": workerImage}
	}
	if r.Platform.Mirror != "" {
		m, err := rack.ParseChartMirror(r.Platform.Mirror)
		if err != nil {
			return nil, fmt.Errorf("platform.mirror: %w", err)
		}
		generated["charts"] = map[string]any{"mirror": map[string]any{"url": m.URL(), "insecure": m.Insecure}}
	}

	// The rack's platform.values win over what Cozy derives from the rack.
	overrides, err := deepCopy(r.Platform.Values)
	if err != nil {
		return nil, fmt.Errorf("platform.values: %w", err)
	}
	values := chartutil.MergeTables(overrides, generated)

	if err := checkNetworks(values, r); err != nil {
		return nil, err
	}
	return values, nil
}

// checkNetworks catches overlaps the schema cannot see: Kube-OVN's join
// network against the rack's networks, and the MetalLB pool against the
// pod and service networks.
func checkNetworks(values map[string]any, r *rack.Rack) error {
	join := DefaultJoinCIDR
	if n, ok := values["network"].(map[string]any); ok {
		if j, ok := n["joinCIDR"].(string); ok {
			join = j
		}
	}
	joinPrefix, err := netip.ParsePrefix(join)
	if err != nil {
		return nil // the schema reports it, with its path
	}
	named := map[string][]string{
		"cluster.podSubnets":     r.Cluster.PodSubnets,
		"cluster.serviceSubnets": r.Cluster.ServiceSubnets,
		"network.subnet":         {r.Network.Subnet},
	}
	for _, field := range sortedKeys(named) {
		for _, s := range named[field] {
			if p, err := netip.ParsePrefix(s); err == nil && p.Overlaps(joinPrefix) {
				return fmt.Errorf("%s %s overlaps Kube-OVN's join network %s: set platform.values.network.joinCIDR to a free range", field, p, joinPrefix)
			}
		}
	}
	for i, a := range r.Platform.LoadBalancerPool {
		first, last, ok := rangeOf(a)
		if !ok {
			continue
		}
		for _, field := range []string{"cluster.podSubnets", "cluster.serviceSubnets"} {
			for _, s := range named[field] {
				if p, err := netip.ParsePrefix(s); err == nil && (p.Contains(first) || p.Contains(last)) {
					return fmt.Errorf("platform.loadBalancerPool[%d] %s is inside %s %s: load balancer addresses must be reachable from outside the cluster", i, a, field, p)
				}
			}
		}
	}
	return nil
}

// rangeOf returns the first and last address of a CIDR or FROM-TO range.
func rangeOf(s string) (netip.Addr, netip.Addr, bool) {
	if from, to, ok := strings.Cut(s, "-"); ok {
		a, err1 := netip.ParseAddr(strings.TrimSpace(from))
		b, err2 := netip.ParseAddr(strings.TrimSpace(to))
		return a, b, err1 == nil && err2 == nil
	}
	p, err := netip.ParsePrefix(s)
	if err != nil || !p.Addr().Is4() {
		return netip.Addr{}, netip.Addr{}, false
	}
	p = p.Masked()
	a := p.Addr().As4()
	n := uint64(binary.BigEndian.Uint32(a[:])) | (uint64(1)<<(32-p.Bits()) - 1)
	var last [4]byte
	binary.BigEndian.PutUint32(last[:], uint32(n))
	return p.Addr(), netip.AddrFrom4(last), true
}

func firstIPv4(subnets []string, field string) (netip.Prefix, error) {
	for _, s := range subnets {
		if p, err := netip.ParsePrefix(s); err == nil && p.Addr().Is4() {
			return p.Masked(), nil
		}
	}
	return netip.Prefix{}, fmt.Errorf("%s %v has no IPv4 network: the platform's Kube-OVN runs IPv4 (add one such as 10.244.0.0/16)", field, subnets)
}

// cleanGitPath is the rack's platform.git.path as a clean relative path.
func cleanGitPath(p string) (string, error) {
	clean := path.Clean(strings.TrimPrefix(p, "./"))
	if p == "" || path.IsAbs(p) || clean == "." || clean == ".." || strings.HasPrefix(clean, "../") {
		return "", fmt.Errorf("platform.git.path %q must be a folder inside the repository, such as clusters/lab", p)
	}
	return clean, nil
}

func strings2any(s []string) []any {
	out := make([]any, 0, len(s))
	for _, v := range s {
		out = append(out, v)
	}
	return out
}

func orEmpty(s []any) []any {
	if s == nil {
		return []any{}
	}
	return s
}

// deepCopy copies free-form values through JSON, which also turns YAML's
// map[any]any and integer types into what the schema validator expects.
func deepCopy(m map[string]any) (map[string]any, error) {
	if m == nil {
		return map[string]any{}, nil
	}
	data, err := json.Marshal(m)
	if err != nil {
		return nil, err
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	var out map[string]any
	if err := dec.Decode(&out); err != nil {
		return nil, err
	}
	return out, nil
}
