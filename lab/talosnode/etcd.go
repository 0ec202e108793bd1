package talosnode

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"github.com/siderolabs/talos/pkg/machinery/api/common"
	"github.com/siderolabs/talos/pkg/machinery/api/machine"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/etcdutl/v3/snapshot"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/emptypb"

	"cozy.dev/cozy/internal/atomicfile"
	"cozy.dev/cozy/internal/etcdsnapshot"
)

// RecoverySnapshotFile is where EtcdRecover puts an uploaded snapshot,
// in the state dir, for Bootstrap with RecoverEtcd to restore (Talos
// keeps it at /var/lib/etcd.snapshot).
const RecoverySnapshotFile = "etcd.snapshot"

// snapshotChunk is how much of a snapshot one stream message carries.
const snapshotChunk = 64 << 10

// etcdClient opens etcd's own client on the node's etcd, or says why
// there is none: not a control plane (Talos's words), or etcd not running.
func (n *Node) etcdClient(api string) (*clientv3.Client, *controlPlane, error) {
	if !n.runningConfig().Machine().Type().IsControlPlane() {
		return nil, nil, status.Errorf(codes.Unimplemented, "%s is only available on control plane nodes", api)
	}
	n.mu.Lock()
	cp := n.cp
	n.mu.Unlock()
	if cp == nil {
		return nil, nil, status.Error(codes.Unavailable, "etcd is not running: the cluster has not been bootstrapped on this node")
	}
	c, err := clientv3.New(clientv3.Config{
		Endpoints:   []string{cp.etcdURL},
		TLS:         cp.etcdTLS,
		DialTimeout: 5 * time.Second,
		Logger:      zap.NewNop(),
	})
	if err != nil {
		return nil, nil, status.Errorf(codes.Unavailable, "failed to create etcd client: %s", err)
	}
	return c, cp, nil
}

// EtcdSnapshot streams a snapshot of the node's etcd (its bbolt database
// with etcd's hash appended), as Talos's does.
func (s *configuredServer) EtcdSnapshot(_ *machine.EtcdSnapshotRequest, stream grpc.ServerStreamingServer[common.Data]) error {
	c, _, err := s.node.etcdClient("etcd snapshot")
	if err != nil {
		return err
	}
	defer c.Close()
	rd, err := c.Snapshot(stream.Context())
	if err != nil {
		return status.Errorf(codes.Unavailable, "failed reading etcd snapshot: %s", err)
	}
	defer rd.Close()
	buf := make([]byte, snapshotChunk)
	for {
		k, err := io.ReadFull(rd, buf)
		if k > 0 {
			if err := stream.Send(&common.Data{Bytes: buf[:k]}); err != nil {
				return err
			}
		}
		switch {
		case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
			return nil
		case err != nil:
			return status.Errorf(codes.Unavailable, "failed reading etcd snapshot: %s", err)
		}
	}
}

// EtcdStatus reports the node's etcd member: its ID, database size,
// leader and raft indexes.
func (s *configuredServer) EtcdStatus(ctx context.Context, _ *emptypb.Empty) (*machine.EtcdStatusResponse, error) {
	c, cp, err := s.node.etcdClient("etcd status")
	if err != nil {
		return nil, err
	}
	defer c.Close()
	st, err := c.Status(ctx, cp.etcdURL)
	if err != nil {
		return nil, status.Errorf(codes.Unavailable, "failed to query etcd status: %s", err)
	}
	return &machine.EtcdStatusResponse{Messages: []*machine.EtcdStatus{{MemberStatus: &machine.EtcdMemberStatus{
		MemberId:         st.Header.GetMemberId(),
		ProtocolVersion:  st.Version,
		StorageVersion:   st.StorageVersion,
		DbSize:           st.DbSize,
		DbSizeInUse:      st.DbSizeInUse,
		Leader:           st.Leader,
		RaftIndex:        st.RaftIndex,
		RaftTerm:         st.RaftTerm,
		RaftAppliedIndex: st.RaftAppliedIndex,
		Errors:           st.Errors,
		IsLearner:        st.IsLearner,
	}}}}, nil
}

// EtcdRecover takes an uploaded snapshot for a later Bootstrap with
// RecoverEtcd. Unlike Talos, which writes the upload in place, the file
// appears only once the whole upload is on disk: a broken upload leaves
// no half snapshot behind.
func (s *configuredServer) EtcdRecover(stream grpc.ClientStreamingServer[common.Data, machine.EtcdRecoverResponse]) error {
	n := s.node
	if !n.runningConfig().Machine().Type().IsControlPlane() {
		return status.Error(codes.Unimplemented, "etcd recover is only available on control plane nodes")
	}
	f, err := atomicfile.NewReplacement(filepath.Join(n.cfg.StateDir, RecoverySnapshotFile), 0o600)
	if err != nil {
		return status.Errorf(codes.Internal, "error creating etcd recovery snapshot: %s", err)
	}
	defer f.Abort()
	for {
		msg, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return err
		}
		if _, err := f.Write(msg.GetBytes()); err != nil {
			return status.Errorf(codes.Internal, "error writing snapshot: %s", err)
		}
	}
	if err := f.Commit(); err != nil {
		return status.Errorf(codes.Internal, "error writing snapshot: %s", err)
	}
	n.log.Info("etcd recovery snapshot uploaded; Bootstrap with recover-etcd restores it")
	return stream.SendAndClose(&machine.EtcdRecoverResponse{Messages: []*machine.EtcdRecover{{}}})
}

// recoverySnapshot is the path of the uploaded snapshot, if there is one.
func (n *Node) recoverySnapshot() (string, error) {
	path := filepath.Join(n.cfg.StateDir, RecoverySnapshotFile)
	if _, err := os.Stat(path); errors.Is(err, fs.ErrNotExist) {
		return "", status.Error(codes.FailedPrecondition, "no etcd snapshot to recover from: upload one with EtcdRecover first")
	}
	return path, nil
}

// restoreSnapshot makes the uploaded snapshot the node's etcd data: a
// one-member cluster of this node, as Talos's etcd service restores it
// (with etcd's own snapshot package), then deletes the upload.
func (n *Node) restoreSnapshot(hostname string, skipHashCheck bool) error {
	path, err := n.recoverySnapshot()
	if err != nil {
		return err
	}
	if !skipHashCheck {
		// Before etcd's status: bbolt panics on a corrupt database.
		if err := etcdsnapshot.VerifyHash(path); err != nil {
			return status.Errorf(codes.InvalidArgument, "error verifying snapshot: %s", err)
		}
	}
	m := snapshot.NewV3(zap.NewNop())
	st, err := m.Status(path)
	if err != nil {
		return status.Errorf(codes.InvalidArgument, "error verifying snapshot: %s", err)
	}
	n.log.Info("recovering etcd from snapshot", "hash", fmt.Sprintf("%08x", st.Hash), "revision", st.Revision, "keys", st.TotalKey, "size", st.TotalSize)
	dataDir := filepath.Join(n.cfg.StateDir, EtcdDir)
	if err := os.Remove(dataDir); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return status.Errorf(codes.AlreadyExists, "etcd data directory is not empty: %s", err)
	}
	peer := "https://" + n.cfg.hostPort(EtcdPeerPort)
	if err := m.Restore(snapshot.RestoreConfig{
		SnapshotPath:   path,
		Name:           hostname,
		OutputDataDir:  dataDir,
		PeerURLs:       []string{peer},
		InitialCluster: hostname + "=" + peer,
		SkipHashCheck:  skipHashCheck,
	}); err != nil {
		_ = os.RemoveAll(dataDir)
		return status.Errorf(codes.Internal, "error recovering from the snapshot: %s", err)
	}
	if err := os.Remove(path); err != nil {
		return status.Errorf(codes.Internal, "error deleting snapshot: %s", err)
	}
	return nil
}
