// Package leave takes one node out of a running cluster, in the order
// that keeps the cluster whole: a control plane only while etcd keeps its
// quorum through the removal; then its Node cordoned and drained; then
// its etcd member removed (the node leaves etcd itself, Talos's
// EtcdLeaveCluster, or, for a machine gone for good, another control
// plane removes it). The caller resets the machine after that and then
// deletes the Node (DeleteNode): `cozyctl node remove` and `cozyctl node
// reset`.
//
// Every step looks before it acts, so a run cut short is run again.
package leave

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/siderolabs/talos/pkg/machinery/api/machine"
	"github.com/siderolabs/talos/pkg/machinery/client"
	clientconfig "github.com/siderolabs/talos/pkg/machinery/client/config"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"cozy.dev/cozy/bootstrap/rack"
	"cozy.dev/cozy/bootstrap/state"
	"cozy.dev/cozy/bootstrap/talosapi"
)

// Options say where the rack's nodes are and how to reach them.
type Options struct {
	Rack *rack.Rack
	// State is the bootstrap's record: the nodes' addresses.
	State       state.State
	Talosconfig *clientconfig.Config
	// Kubeconfig is the path of the bootstrap's admin kubeconfig.
	Kubeconfig string
	TalosPort  int
	// Lost says the machine is gone for good: it is not asked for
	// anything; its etcd member is removed through another control plane.
	Lost bool
	// Timeout bounds the drain (default 5m).
	Timeout time.Duration
	Log     *slog.Logger
}

func (o Options) withDefaults() Options {
	if o.TalosPort == 0 {
		o.TalosPort = talosapi.Port
	}
	if o.Timeout == 0 {
		o.Timeout = 5 * time.Minute
	}
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	return o
}

// Plan is what taking a node out will do, as Check found the cluster.
type Plan struct {
	Node string `json:"node"`
	Role string `json:"role"`
	// Answers says the node's Talos API answered.
	Answers bool `json:"answers"`
	// Etcd is its etcd membership: "voter", "learner" or "" (none).
	Etcd string `json:"etcd,omitempty"`
	// Members are etcd's voting members before the removal, and Healthy
	// those whose etcd answered without errors.
	Members []string `json:"members,omitempty"`
	Healthy []string `json:"healthy,omitempty"`
	// HasNode says Kubernetes has a Node of that name.
	HasNode bool `json:"hasNode"`

	endpoint string
	memberID uint64
}

// Left is what Cluster did.
type Left struct {
	Plan
	Cordoned bool     `json:"cordoned,omitempty"`
	Evicted  []string `json:"evicted,omitempty"`
	// EtcdLeft is how the member went: "left" (the node itself),
	// "removed through NODE", or "" (it was not a member).
	EtcdLeft string `json:"etcdLeft,omitempty"`
}

// ErrQuorum is what Check returns when removing a control plane would
// cost etcd its quorum.
var ErrQuorum = errors.New("etcd would lose its quorum")

// Check looks at the cluster and says what taking name out does, or why
// it must not: a name not in the rack, a node that does not answer
// (unless Lost), or a control plane whose removal etcd could not commit
// without it.
func Check(ctx context.Context, o Options, name string) (Plan, error) {
	o = o.withDefaults()
	m, err := machineOf(o.Rack, name)
	if err != nil {
		return Plan{}, err
	}
	p := Plan{Node: name, Role: m.Role}
	ip := nodeIP(o.State, name)
	if ip.IsValid() {
		p.endpoint = talosapi.Endpoint(ip, o.TalosPort)
	}
	if !o.Lost {
		if !ip.IsValid() {
			return p, fmt.Errorf("%s: the bootstrap in the state dir has no address for it: it never joined; nothing to take out", name)
		}
		if err := answers(ctx, o, p.endpoint); err != nil {
			return p, fmt.Errorf("%s does not answer at %s (%w): if the machine is gone for good, run again with --lost", name, p.endpoint, err)
		}
		p.Answers = true
	}
	if m.Role == rack.RoleControlPlane {
		if err := etcdView(ctx, o, &p); err != nil {
			return p, err
		}
	}
	hasNode, err := hasNode(ctx, o, name)
	if err != nil {
		return p, err
	}
	p.HasNode = hasNode
	return p, nil
}

// Cluster takes name out of the cluster: Check, cordon and drain its
// Node, and take it out of etcd.
func Cluster(ctx context.Context, o Options, name string) (Left, error) {
	o = o.withDefaults()
	p, err := Check(ctx, o, name)
	left := Left{Plan: p}
	if err != nil {
		return left, err
	}
	if p.HasNode {
		if left.Cordoned, left.Evicted, err = drain(ctx, o, name); err != nil {
			return left, err
		}
	}
	if p.Etcd != "" {
		if left.EtcdLeft, err = leaveEtcd(ctx, o, p); err != nil {
			return left, err
		}
	}
	return left, nil
}

func machineOf(r *rack.Rack, name string) (*rack.Machine, error) {
	i := slices.IndexFunc(r.Machines, func(m rack.Machine) bool { return m.Hostname == name })
	if i < 0 {
		var names []string
		for _, m := range r.Machines {
			names = append(names, m.Hostname)
		}
		return nil, fmt.Errorf("no machine %q in the rack (its machines: %s)", name, strings.Join(names, ", "))
	}
	return &r.Machines[i], nil
}

func nodeIP(st state.State, name string) netip.Addr {
	if n := st.Nodes[name]; n != nil {
		return n.IP
	}
	return netip.Addr{}
}

// connect opens a node's Talos API, with a deadline for the dial.
func connect(ctx context.Context, o Options, endpoint string) (*client.Client, error) {
	return talosapi.Secure(ctx, o.Talosconfig, endpoint)
}

// answers checks that the node's configured Talos API answers.
func answers(ctx context.Context, o Options, endpoint string) error {
	ctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	c, err := connect(ctx, o, endpoint)
	if err != nil {
		return err
	}
	defer c.Close()
	_, err = c.Version(ctx)
	return err
}

// member is one etcd member, as a control plane lists it.
type member struct {
	name    string
	id      uint64
	learner bool
	healthy bool
}

// etcdView fills in p's etcd membership and checks that etcd keeps its
// quorum without p's node.
func etcdView(ctx context.Context, o Options, p *Plan) error {
	members, err := etcdMembers(ctx, o)
	if err != nil {
		return err
	}
	for _, m := range members {
		if m.learner {
			if m.name == p.Node {
				p.Etcd, p.memberID = "learner", m.id
			}
			continue
		}
		p.Members = append(p.Members, m.name)
		if m.healthy {
			p.Healthy = append(p.Healthy, m.name)
		}
		if m.name == p.Node {
			p.Etcd, p.memberID = "voter", m.id
		}
	}
	slices.Sort(p.Members)
	slices.Sort(p.Healthy)
	if p.Etcd != "voter" {
		return nil // a learner does not vote: removing it cannot cost a quorum
	}
	return quorumWithout(p.Members, p.Healthy, p.Node)
}

// quorumWithout says whether etcd can remove name from members without
// it: etcd commits the removal with a quorum of the current members, so
// the healthy others must be a quorum on their own, or a failure of the
// leaving node halfway leaves the cluster without one. (This is why the
// second control plane of three is refused: 1 of 2 is not a quorum.)
func quorumWithout(members, healthy []string, name string) error {
	need := len(members)/2 + 1
	var others []string
	for _, h := range healthy {
		if h != name {
			others = append(others, h)
		}
	}
	if len(others) >= need {
		return nil
	}
	list := "none"
	if len(others) > 0 {
		list = strings.Join(others, ", ")
	}
	return fmt.Errorf("%w: removing %s needs %d of the %d etcd members (%s) healthy without it, and %d are (%s): add a control plane first, or bring the unhealthy ones back",
		ErrQuorum, name, need, len(members), strings.Join(members, ", "), len(others), list)
}

// etcdMembers lists etcd's members through the first control plane of
// the rack that answers, each marked healthy if its own node reports its
// etcd without errors and with a leader.
func etcdMembers(ctx context.Context, o Options) ([]member, error) {
	var errs []error
	for _, m := range o.Rack.Machines {
		if m.Role != rack.RoleControlPlane {
			continue
		}
		ip := nodeIP(o.State, m.Hostname)
		if !ip.IsValid() {
			continue
		}
		members, err := memberList(ctx, o, talosapi.Endpoint(ip, o.TalosPort))
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", m.Hostname, err))
			continue
		}
		for i := range members {
			members[i].healthy = etcdHealthy(ctx, o, members[i].name)
		}
		return members, nil
	}
	return nil, fmt.Errorf("no control plane lists etcd's members: %w", errors.Join(errs...))
}

func memberList(ctx context.Context, o Options, endpoint string) ([]member, error) {
	ctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	c, err := connect(ctx, o, endpoint)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	resp, err := c.EtcdMemberList(ctx, &machine.EtcdMemberListRequest{})
	if err != nil {
		return nil, fmt.Errorf("etcd members: %w", err)
	}
	var out []member
	for _, msg := range resp.GetMessages() {
		for _, m := range msg.GetMembers() {
			out = append(out, member{name: m.GetHostname(), id: m.GetId(), learner: m.GetIsLearner()})
		}
	}
	return out, nil
}

// etcdHealthy asks the member's own node for its etcd status.
func etcdHealthy(ctx context.Context, o Options, name string) bool {
	ip := nodeIP(o.State, name)
	if !ip.IsValid() {
		return false
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	c, err := connect(ctx, o, talosapi.Endpoint(ip, o.TalosPort))
	if err != nil {
		return false
	}
	defer c.Close()
	resp, err := c.EtcdStatus(ctx)
	if err != nil {
		return false
	}
	for _, msg := range resp.GetMessages() {
		st := msg.GetMemberStatus()
		return st.GetLeader() != 0 && len(st.GetErrors()) == 0
	}
	return false
}

// leaveEtcd takes p's node out of etcd: it leaves by itself, or, if it
// is lost, a healthy control plane removes its member.
func leaveEtcd(ctx context.Context, o Options, p Plan) (string, error) {
	if !o.Lost {
		o.Log.Info("leaving etcd", "node", p.Node)
		c, err := connect(ctx, o, p.endpoint)
		if err != nil {
			return "", err
		}
		defer c.Close()
		if err := c.EtcdLeaveCluster(ctx, &machine.EtcdLeaveClusterRequest{}); err != nil {
			return "", fmt.Errorf("%s: etcd leave: %w", p.Node, err)
		}
		return "left", nil
	}
	var errs []error
	for _, h := range p.Healthy {
		if h == p.Node {
			continue
		}
		o.Log.Info("removing the lost node's etcd member", "node", p.Node, "through", h)
		c, err := connect(ctx, o, talosapi.Endpoint(nodeIP(o.State, h), o.TalosPort))
		if err != nil {
			errs = append(errs, err)
			continue
		}
		err = c.EtcdRemoveMemberByID(ctx, &machine.EtcdRemoveMemberByIDRequest{MemberId: p.memberID})
		c.Close()
		if err == nil || status.Code(err) == codes.NotFound {
			return "removed through " + h, nil
		}
		errs = append(errs, fmt.Errorf("%s: etcd remove member %016x: %w", h, p.memberID, err))
	}
	return "", fmt.Errorf("no control plane removed %s's etcd member: %w", p.Node, errors.Join(errs...))
}
