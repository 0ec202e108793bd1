package bootstrap

import (
	"errors"
	"fmt"

	"cozy.dev/cozy/bootstrap/rack"
	"cozy.dev/cozy/bootstrap/state"
)

// ErrNothingToAdd is what NewMachines returns when every machine of the
// rack is in the cluster.
var ErrNothingToAdd = errors.New("every machine of the rack is in the cluster already: add one to the rack file first")

// NewMachines lists the machines of the rack that are not in its cluster
// yet (not Ready in the state dir: new in the rack file, removed before,
// or cut short halfway through an earlier run), for `cozyctl node add`,
// which takes them through the bootstrap's path. The state dir must hold
// a bootstrapped cluster: building one is `cozyctl bootstrap`.
func NewMachines(r *rack.Rack, stateDir string) ([]string, error) {
	st, err := state.Read(stateDir)
	if err != nil {
		return nil, err
	}
	if st.EtcdBootstrapped == "" {
		return nil, fmt.Errorf("%s holds no bootstrapped cluster: cozyctl bootstrap builds it", stateDir)
	}
	if st.Cluster != r.Metadata.Name {
		return nil, fmt.Errorf("%s belongs to cluster %q, not %q: use another --state-dir", stateDir, st.Cluster, r.Metadata.Name)
	}
	var out []string
	for _, m := range r.Machines {
		if n := st.Nodes[m.Hostname]; n == nil || n.Phase != state.Ready {
			out = append(out, m.Hostname)
		}
	}
	if len(out) == 0 {
		return nil, ErrNothingToAdd
	}
	return out, nil
}
