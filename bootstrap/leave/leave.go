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
	"strings"
	"time"

	"github.com/siderolabs/talos/pkg/machinery/api/machine"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"cozy.dev/cozy/bootstrap/rack"
	"cozy.dev/cozy/bootstrap/rackapi"
)

// Options say which rack and how.
type Options struct {
	Rack *rackapi.Rack
	// Lost says the machine is gone for good: it is not asked for
	// anything; its etcd member is removed through another control plane.
	Lost bool
	// Timeout bounds the drain and the Node's deletion (default 5m).
	Timeout time.Duration
	Log     *slog.Logger
}

func (o Options) withDefaults() Options {
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
	// those whose etcd answered with a leader and without errors.
	Members []string `json:"members,omitempty"`
	Healthy []string `json:"healthy,omitempty"`
	// HasNode says Kubernetes has a Node of that name.
	HasNode bool `json:"hasNode"`

	member rackapi.Member
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
	m, err := o.Rack.Machine(name)
	if err != nil {
		return Plan{}, err
	}
	p := Plan{Node: name, Role: m.Role}
	if !o.Lost {
		if o.Rack.Endpoint(name) == "" {
			return p, fmt.Errorf("%s: the bootstrap in the state dir has no address for it: it never joined; nothing to take out", name)
		}
		if _, err := o.Rack.Version(ctx, name); err != nil {
			return p, fmt.Errorf("%s does not answer at %s (%w): if the machine is gone for good, run again with --lost", name, o.Rack.Endpoint(name), err)
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

// Cluster takes name out of the cluster: Check, then Out.
func Cluster(ctx context.Context, o Options, name string) (Left, error) {
	p, err := Check(ctx, o, name)
	if err != nil {
		return Left{Plan: p}, err
	}
	return Out(ctx, o, p)
}

// Out carries out a plan Check made: cordon and drain the Node, and take
// the node out of etcd.
func Out(ctx context.Context, o Options, p Plan) (Left, error) {
	o = o.withDefaults()
	left := Left{Plan: p}
	var err error
	name := p.Node
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

// etcdView fills in p's etcd membership and checks that etcd keeps its
// quorum without p's node.
func etcdView(ctx context.Context, o Options, p *Plan) error {
	etcd, err := o.Rack.Etcd(ctx)
	if err != nil {
		return err
	}
	p.Members, p.Healthy = etcd.Voters(), etcd.Healthy()
	m, ok := etcd.Member(p.Node)
	if !ok {
		return nil
	}
	p.member = m
	if m.Learner {
		p.Etcd = "learner"
		return nil // a learner does not vote: removing it cannot cost a quorum
	}
	p.Etcd = "voter"
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

// leaveEtcd takes p's node out of etcd: it leaves by itself, or, if it
// is lost, a healthy control plane removes its member.
func leaveEtcd(ctx context.Context, o Options, p Plan) (string, error) {
	if !o.Lost {
		o.Log.Info("leaving etcd", "node", p.Node)
		c, err := o.Rack.Connect(ctx, p.Node)
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
		c, err := o.Rack.Connect(ctx, h)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		err = c.EtcdRemoveMemberByID(ctx, &machine.EtcdRemoveMemberByIDRequest{MemberId: p.member.ID})
		c.Close()
		if err == nil || status.Code(err) == codes.NotFound {
			return "removed through " + h, nil
		}
		errs = append(errs, fmt.Errorf("%s: etcd remove member %016x: %w", h, p.member.ID, err))
	}
	return "", fmt.Errorf("no control plane removed %s's etcd member: %w", p.Node, errors.Join(errs...))
}
