package talosnode

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/siderolabs/talos/pkg/machinery/api/machine"
	coreconfig "github.com/siderolabs/talos/pkg/machinery/config"
	"github.com/siderolabs/talos/pkg/machinery/resources/runtime"
	"github.com/siderolabs/talos/pkg/machinery/version"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"golang.org/x/mod/semver"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"cozy.dev/cozy/internal/imageref"
)

// VersionFile holds, on the node's disk (STATE), the Talos version the
// node runs: the tag of the installer image it was installed or last
// upgraded from. The emulation runs the same binaries whatever it says.
const VersionFile = "talos-version"

// Upgrade installs the version of the installer image and reboots into
// it, as Talos's does, after Talos's own check on a control plane (unless
// forced): etcd must not have two members, and every member must be
// started and healthy. The emulated node takes the version from the
// image's tag (it pulls nothing and runs the same binaries after the
// reboot); a staged upgrade is not emulated.
func (s *configuredServer) Upgrade(ctx context.Context, req *machine.UpgradeRequest) (*machine.UpgradeResponse, error) {
	n := s.node
	if req.GetStage() {
		return nil, status.Error(codes.Unimplemented, "a staged upgrade is not emulated")
	}
	v, err := imageVersion(req.GetImage())
	if err != nil {
		return nil, fmt.Errorf("error validating installer image %q: %w", req.GetImage(), err)
	}
	mc := n.runningConfig()
	if mc.Machine().Type().IsControlPlane() && !req.GetForce() && !req.GetPreserve() {
		if err := n.validateEtcdForUpgrade(ctx); err != nil {
			return nil, fmt.Errorf("error validating etcd for upgrade: %w", err)
		}
	}
	n.log.Info("upgrade request received", "image", req.GetImage(), "version", v, "force", req.GetForce())
	st := n.currentState() // not inside transition, which holds the lock
	err = n.transition(reboot, func() error {
		if err := writeFileAtomic(filepath.Join(n.cfg.StateDir, VersionFile), []byte(v+"\n"), 0o600); err != nil {
			return status.Errorf(codes.Internal, "write the new version to disk: %s", err)
		}
		return put(ctx, st, machineStatus(runtime.MachineStageUpgrading, false))
	})
	if err != nil {
		return nil, err
	}
	return &machine.UpgradeResponse{Messages: []*machine.Upgrade{{Ack: "Upgrade request received", ActorId: actorID()}}}, nil
}

// imageVersion is the Talos version an installer image's tag names.
func imageVersion(image string) (string, error) {
	ref, err := imageref.Parse(image)
	if err != nil {
		return "", err
	}
	if !semver.IsValid(ref.Tag) || semver.Canonical(ref.Tag) != ref.Tag {
		return "", fmt.Errorf("the emulated node takes the Talos version from the image's tag, and %q is not one", ref.Tag)
	}
	return ref.Tag, nil
}

// installedVersion is the version an install from mc puts on the disk:
// its install image's, or the emulation's own when that has none.
func installedVersion(mc coreconfig.Provider) string {
	if mc != nil && mc.Machine() != nil && mc.Machine().Install() != nil {
		if v, err := imageVersion(mc.Machine().Install().Image()); err == nil {
			return v
		}
	}
	return version.Tag
}

// diskVersion is the version on the node's disk; the emulation's own for
// a disk from before versions were kept, or with none (maintenance).
func (n *Node) diskVersion() string {
	b, err := os.ReadFile(filepath.Join(n.cfg.StateDir, VersionFile))
	if err != nil {
		if !errors.Is(err, fs.ErrNotExist) {
			n.log.Warn("read the version on disk", "err", err)
		}
		return version.Tag
	}
	return strings.TrimSpace(string(b))
}

// validateEtcdForUpgrade is Talos's ValidateForUpgrade: an upgrade of a
// control plane must not start while etcd has two members (losing one
// loses the quorum) or while a member is not started or not healthy.
func (n *Node) validateEtcdForUpgrade(ctx context.Context) error {
	c, cp, err := n.etcdClient("upgrade")
	if err != nil {
		return err
	}
	defer c.Close()
	resp, err := c.MemberList(ctx)
	if err != nil {
		return err
	}
	if len(resp.Members) == 2 {
		return fmt.Errorf("etcd member count(%d) is insufficient to maintain quorum if upgrade commences", len(resp.Members))
	}
	for _, m := range resp.Members {
		if m.GetName() == "" {
			return fmt.Errorf("etcd member %016x is not started, all members must be running to perform an upgrade", m.GetID())
		}
		if err := memberHealthy(ctx, cp, m.GetClientURLs()); err != nil {
			return fmt.Errorf("etcd member %016x is not healthy; all members must be healthy to perform an upgrade: %w", m.GetID(), err)
		}
	}
	return nil
}

// memberHealthy reads a key through the member: an answer needs quorum.
func memberHealthy(ctx context.Context, cp *controlPlane, urls []string) error {
	c, err := clientv3.New(clientv3.Config{Endpoints: urls, TLS: cp.etcdTLS, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		return fmt.Errorf("failed to create client to member: %w", err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	_, err = c.Get(ctx, "health")
	return err
}
