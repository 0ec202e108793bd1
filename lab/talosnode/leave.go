package talosnode

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/siderolabs/talos/pkg/machinery/api/machine"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// leaveRetry bounds how long a leave retries while etcd says it cannot
// remove the member yet (unhealthy: the others are not all connected),
// as Talos's LeaveCluster does.
const leaveRetry = 5 * time.Minute

// EtcdLeaveCluster takes this control plane out of etcd, as Talos's does:
// it removes its own member through its etcd, stops etcd, and empties
// etcd's data directory. kube-apiserver, which talks to the local etcd
// only, stops with it. At the next boot the node joins etcd again, as a
// Talos control plane with an empty etcd directory does.
func (s *configuredServer) EtcdLeaveCluster(ctx context.Context, _ *machine.EtcdLeaveClusterRequest) (*machine.EtcdLeaveClusterResponse, error) {
	if err := s.node.leaveEtcd(ctx); err != nil {
		return nil, err
	}
	return &machine.EtcdLeaveClusterResponse{Messages: []*machine.EtcdLeaveCluster{{}}}, nil
}

// EtcdRemoveMemberByID removes another member from etcd through this
// control plane's etcd: the way out for a control plane that is gone.
func (s *configuredServer) EtcdRemoveMemberByID(ctx context.Context, req *machine.EtcdRemoveMemberByIDRequest) (*machine.EtcdRemoveMemberByIDResponse, error) {
	c, _, err := s.node.etcdClient("etcd remove member")
	if err != nil {
		return nil, err
	}
	defer c.Close()
	if _, err := c.MemberRemove(clientv3.WithRequireLeader(ctx), req.GetMemberId()); err != nil {
		err = fmt.Errorf("failed to remove member %d: %w", req.GetMemberId(), err)
		if errors.Is(err, rpctypes.ErrMemberNotFound) {
			return nil, status.Error(codes.NotFound, err.Error())
		}
		return nil, fmt.Errorf("failed to remove member: %w", err)
	}
	s.node.log.Info("etcd member removed", "member", fmt.Sprintf("%016x", req.GetMemberId()))
	return &machine.EtcdRemoveMemberByIDResponse{Messages: []*machine.EtcdRemoveMemberByID{{}}}, nil
}

// leaveEtcd removes this node's member from etcd (retrying while etcd
// calls the cluster unhealthy; a member already gone is fine), then stops
// etcd and kube-apiserver and wipes etcd's data. The removal goes through
// the other members, as Talos's client of every control plane does: a
// member that removes itself stops before it answers.
func (n *Node) leaveEtcd(ctx context.Context) error {
	c, cp, err := n.etcdClient("etcd leave")
	if err != nil {
		return err
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(clientv3.WithRequireLeader(ctx), leaveRetry)
	defer cancel()
	st, err := c.Status(ctx, cp.etcdURL)
	if err != nil {
		return fmt.Errorf("failed to leave cluster: %w", err)
	}
	id := st.Header.GetMemberId()
	others, err := n.otherMembers(ctx, c, cp, id)
	if err != nil {
		return fmt.Errorf("failed to leave cluster: %w", err)
	}
	defer others.Close()
	for {
		_, err := others.MemberRemove(ctx, id)
		if err == nil || errors.Is(err, rpctypes.ErrMemberNotFound) {
			break
		}
		if !errors.Is(err, rpctypes.ErrUnhealthy) && !errors.Is(err, rpctypes.ErrStopped) {
			return fmt.Errorf("failed to leave cluster: failed to remove member %d: %w", id, err)
		}
		n.log.Info("etcd leave: etcd cannot remove this member yet; retrying", "err", err)
		select {
		case <-ctx.Done():
			return fmt.Errorf("failed to leave cluster: failed to remove member %d: %w", id, err)
		case <-time.After(time.Second):
		}
	}
	n.stopControlPlane()
	n.mu.Lock()
	n.etcdLeft = true
	n.mu.Unlock()
	for _, name := range []string{EtcdDir, BootstrappedFile} {
		if err := os.RemoveAll(filepath.Join(n.cfg.StateDir, name)); err != nil {
			return fmt.Errorf("failed to remove %s: %w", name, err)
		}
	}
	n.log.Info("left etcd: member removed, etcd and kube-apiserver stopped, etcd data wiped", "member", fmt.Sprintf("%016x", id))
	return nil
}

// otherMembers is an etcd client of the members other than self (of
// self alone when it is the only one: etcd then refuses the removal).
func (n *Node) otherMembers(ctx context.Context, c *clientv3.Client, cp *controlPlane, self uint64) (*clientv3.Client, error) {
	list, err := c.MemberList(ctx)
	if err != nil {
		return nil, err
	}
	var endpoints []string
	for _, m := range list.Members {
		if m.GetID() != self && !m.GetIsLearner() {
			endpoints = append(endpoints, m.GetClientURLs()...)
		}
	}
	if len(endpoints) == 0 {
		endpoints = []string{cp.etcdURL}
	}
	return clientv3.New(clientv3.Config{Endpoints: endpoints, TLS: cp.etcdTLS, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
}

// leaveIfMember leaves etcd if this is a control plane whose etcd runs,
// as Talos's graceful reset does (its leaveEtcd task).
func (n *Node) leaveIfMember(ctx context.Context) error {
	n.mu.Lock()
	running := n.cp != nil
	n.mu.Unlock()
	if !running || !n.runningConfig().Machine().Type().IsControlPlane() {
		return nil
	}
	return n.leaveEtcd(ctx)
}
