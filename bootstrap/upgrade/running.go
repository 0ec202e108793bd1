package upgrade

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"

	"cozy.dev/cozy/bootstrap/rack"
	"cozy.dev/cozy/bootstrap/rackapi"
)

// Running compares the rack file's versions with what its nodes run, as
// the upgrades will: each problem is a step an upgrade would refuse (a
// downgrade, a skipped minor version), at the rack's talos.version or
// cluster.kubernetesVersion, or a node that does not answer, at its
// machine. `cozyctl rack validate --against-cluster` prints them.
func Running(ctx context.Context, r *rackapi.Rack) []rack.Problem {
	rk := r.Rack
	k8s := "v" + strings.TrimPrefix(rk.Cluster.KubernetesVersion, "v")
	var ps []rack.Problem
	for i, m := range rk.Machines {
		at := fmt.Sprintf("machines[%d]", i)
		ms, err := r.MachineState(ctx, m.Hostname)
		if err != nil {
			ps = append(ps, rk.ProblemAt(at, fmt.Sprintf("%s does not answer (%v): what it runs is not checked", m.Hostname, err)))
			continue
		}
		if err := checkStep("Talos", ms.Version, rk.Talos.Version); err != nil {
			ps = append(ps, rk.ProblemAt("talos.version", m.Hostname+": "+err.Error()))
		}
		mc, err := r.MachineConfig(ctx, m.Hostname)
		if err != nil {
			ps = append(ps, rk.ProblemAt(at, fmt.Sprintf("%s: %v: its Kubernetes is not checked", m.Hostname, err)))
			continue
		}
		// One problem per node and reason, naming its components.
		images := imagesOf(mc)
		var reasons []string
		comps := map[string][]string{}
		for _, comp := range slices.Sorted(maps.Keys(images)) {
			if err := checkStep("Kubernetes", tagOf(images[comp]), k8s); err != nil {
				if _, ok := comps[err.Error()]; !ok {
					reasons = append(reasons, err.Error())
				}
				comps[err.Error()] = append(comps[err.Error()], comp)
			}
		}
		for _, why := range reasons {
			ps = append(ps, rk.ProblemAt("cluster.kubernetesVersion", fmt.Sprintf("%s (%s): %s", m.Hostname, strings.Join(comps[why], ", "), why)))
		}
	}
	return ps
}
