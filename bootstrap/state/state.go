// Package state is the bootstrap's memory between runs: which phase each
// node reached and whether etcd was bootstrapped, in one JSON file that is
// replaced atomically after every change. A killed `cozyctl bootstrap`
// rerun from this file skips what is done and never bootstraps etcd twice.
package state

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net/netip"
	"os"
	"path/filepath"
	"sync"
	"time"

	"cozy.dev/cozy/internal/atomicfile"
)

// File is the state file's name in the state dir.
const File = "state.json"

// Phase is how far a node got.
type Phase string

// Node phases, in order.
const (
	Pending    Phase = "pending"    // in the rack, not seen yet
	Discovered Phase = "discovered" // netbooted, answers in maintenance mode
	Applied    Phase = "applied"    // took its config; installing and rebooting
	Configured Phase = "configured" // answers with mutual TLS: Talos is installed
	Bootstrap  Phase = "etcd"       // the control plane that bootstrapped etcd
	Ready      Phase = "ready"      // the cluster's API answers; nothing left to do

	// Phases of a node taken out (cozyctl node remove), outside the
	// bootstrap's order: a rack that still lists a removed node has the
	// bootstrap wait for it as for a new one.
	Leaving   Phase = "leaving"   // being drained and taken out of etcd
	Resetting Phase = "resetting" // asked to wipe its disk and power off
	Removed   Phase = "removed"   // wiped and off; its Node deleted
)

var order = map[Phase]int{"": 0, Pending: 0, Discovered: 1, Applied: 2, Configured: 3, Bootstrap: 4, Ready: 5}

// AtLeast reports whether p is at or past q.
func (p Phase) AtLeast(q Phase) bool { return order[p] >= order[q] }

// Node is one machine's record.
type Node struct {
	Hostname string     `json:"hostname"`
	Role     string     `json:"role"`
	MAC      string     `json:"mac,omitempty"`
	UUID     string     `json:"uuid,omitempty"`
	IP       netip.Addr `json:"ip,omitzero"`
	Phase    Phase      `json:"phase"`
	Since    time.Time  `json:"since"`
	// Error is the last failure, cleared when the node moves on.
	Error string `json:"error,omitempty"`
}

// State is the whole file.
type State struct {
	Cluster string `json:"cluster"`
	// EtcdBootstrapped names the node etcd was bootstrapped on, once done.
	EtcdBootstrapped string           `json:"etcdBootstrapped,omitempty"`
	Kubeconfig       string           `json:"kubeconfig,omitempty"`
	Nodes            map[string]*Node `json:"nodes"`
	Started          time.Time        `json:"started"`
	Finished         time.Time        `json:"finished,omitzero"`
}

// Store is the state file; its methods are safe for concurrent use.
type Store struct {
	path string
	mu   sync.Mutex
	s    State
}

// Open loads the state in dir, or starts an empty one for cluster.
func Open(dir, cluster string) (*Store, error) {
	s, found, err := read(dir)
	if err != nil {
		return nil, err
	}
	st := &Store{path: filepath.Join(dir, File), s: s}
	if !found {
		st.s.Cluster = cluster
		return st, nil
	}
	if s.Cluster != cluster {
		return nil, fmt.Errorf("%s belongs to cluster %q, not %q: use another --state-dir", st.path, s.Cluster, cluster)
	}
	return st, nil
}

// Read loads the state in dir to look at it (lab status): an empty State
// when there is none yet, an error when it cannot be read.
func Read(dir string) (State, error) {
	s, _, err := read(dir)
	return s, err
}

// read loads the state in dir, and says whether there was one.
func read(dir string) (State, bool, error) {
	path := filepath.Join(dir, File)
	s := State{Nodes: map[string]*Node{}}
	data, err := os.ReadFile(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return s, false, nil
	case err != nil:
		return State{}, false, err
	}
	if err := json.Unmarshal(data, &s); err != nil {
		return State{}, false, fmt.Errorf("%s is damaged (%v): fix or remove it; the secrets bundle next to it is what matters", path, err)
	}
	if s.Nodes == nil {
		s.Nodes = map[string]*Node{}
	}
	return s, true, nil
}

// Snapshot returns a deep copy of the state.
func (st *Store) Snapshot() State {
	st.mu.Lock()
	defer st.mu.Unlock()
	c := st.s
	c.Nodes = make(map[string]*Node, len(st.s.Nodes))
	for k, n := range st.s.Nodes {
		nc := *n
		c.Nodes[k] = &nc
	}
	return c
}

// Node returns a copy of one node's record (zero if absent).
func (st *Store) Node(hostname string) Node {
	st.mu.Lock()
	defer st.mu.Unlock()
	if n, ok := st.s.Nodes[hostname]; ok {
		return *n
	}
	return Node{}
}

// Update changes the state with f and saves it before returning.
func (st *Store) Update(f func(*State)) error {
	st.mu.Lock()
	defer st.mu.Unlock()
	f(&st.s)
	return st.saveLocked()
}

func (st *Store) saveLocked() error {
	data, err := json.MarshalIndent(st.s, "", "  ")
	if err != nil {
		return err
	}
	if err := atomicfile.Write(st.path, append(data, '\n'), 0o600); err != nil {
		return fmt.Errorf("save state: %w", err)
	}
	return nil
}
