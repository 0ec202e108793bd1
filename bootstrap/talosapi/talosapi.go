// Package talosapi is how bootstrap talks to Talos nodes: through the
// machinery's own gRPC client, insecurely in maintenance mode (as Talos
// requires before a node has a config) and with mutual TLS afterwards.
// The same calls work against real Talos and the emulated node in lab/.
package talosapi

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"github.com/cosi-project/runtime/pkg/safe"
	machineapi "github.com/siderolabs/talos/pkg/machinery/api/machine"
	"github.com/siderolabs/talos/pkg/machinery/client"
	clientconfig "github.com/siderolabs/talos/pkg/machinery/client/config"
	"github.com/siderolabs/talos/pkg/machinery/config/configloader"
	"github.com/siderolabs/talos/pkg/machinery/config/types/block/blockhelpers"
	"github.com/siderolabs/talos/pkg/machinery/constants"
	"github.com/siderolabs/talos/pkg/machinery/resources/block"
	"github.com/siderolabs/talos/pkg/machinery/resources/hardware"
	"github.com/siderolabs/talos/pkg/machinery/resources/network"
	"github.com/siderolabs/talos/pkg/machinery/resources/runtime"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Port is where Talos's API (apid) listens.
const Port = constants.ApidPort

// Endpoint is ip:port of a node's Talos API.
func Endpoint(ip netip.Addr, port int) string {
	if port == 0 {
		port = Port
	}
	return net.JoinHostPort(ip.String(), strconv.Itoa(port))
}

// Maintenance connects to a node in maintenance mode. Talos serves a
// self-signed certificate then, so the server is not verified; nothing
// secret must be read back over this connection, only sent.
func Maintenance(ctx context.Context, endpoint string) (*client.Client, error) {
	return client.New(ctx,
		client.WithEndpoints(endpoint),
		//nolint:gosec // Talos maintenance mode has no certificate to verify yet.
		client.WithTLSConfig(&tls.Config{InsecureSkipVerify: true}),
	)
}

// Secure connects to a configured node with the cluster's talosconfig:
// mutual TLS against the cluster's OS CA.
func Secure(ctx context.Context, tc *clientconfig.Config, endpoint string) (*client.Client, error) {
	return client.New(ctx, client.WithConfig(tc), client.WithEndpoints(endpoint))
}

// Facts are what a node tells about its hardware.
type Facts struct {
	// Version is the Talos version; empty in maintenance mode.
	Version string `json:"version,omitempty"`
	// Stage is the machine stage: maintenance, booting, running...
	Stage string `json:"stage"`
	UUID  string `json:"uuid,omitempty"`
	Links []Link `json:"links"`
	Disks []Disk `json:"disks"`
}

// Link is a network link of a node.
type Link struct {
	Name string `json:"name"`
	MAC  string `json:"mac"`
}

// Disk is a block device of a node.
type Disk struct {
	DevPath    string `json:"devPath"`
	Size       uint64 `json:"size"`
	Model      string `json:"model,omitempty"`
	Serial     string `json:"serial,omitempty"`
	Transport  string `json:"transport,omitempty"`
	Rotational bool   `json:"rotational,omitempty"`
}

// ReadFacts reads version and hardware through the Talos API and COSI.
func ReadFacts(ctx context.Context, c *client.Client) (Facts, error) {
	var f Facts
	// Maintenance mode answers Version only to admins (SideroLink), so an
	// insecure client gets Unimplemented: the version is then unknown.
	v, err := c.Version(ctx)
	switch status.Code(err) {
	case codes.OK:
		for _, m := range v.GetMessages() {
			f.Version = m.GetVersion().GetTag()
		}
	case codes.Unimplemented:
	default:
		return f, fmt.Errorf("version: %w", err)
	}
	ms, err := safe.StateGetByID[*runtime.MachineStatus](ctx, c.COSI, runtime.MachineStatusID)
	if err != nil {
		return f, fmt.Errorf("machine status: %w", err)
	}
	f.Stage = ms.TypedSpec().Stage.String()
	if si, err := safe.StateGetByID[*hardware.SystemInformation](ctx, c.COSI, hardware.SystemInformationID); err == nil {
		f.UUID = si.TypedSpec().UUID
	}
	links, err := safe.StateListAll[*network.LinkStatus](ctx, c.COSI)
	if err != nil {
		return f, fmt.Errorf("links: %w", err)
	}
	for l := range links.All() {
		mac := l.TypedSpec().PermanentAddr
		if len(mac) == 0 {
			mac = l.TypedSpec().HardwareAddr
		}
		f.Links = append(f.Links, Link{Name: l.Metadata().ID(), MAC: net.HardwareAddr(mac).String()})
	}
	disks, err := safe.StateListAll[*block.Disk](ctx, c.COSI)
	if err != nil {
		return f, fmt.Errorf("disks: %w", err)
	}
	for d := range disks.All() {
		s := d.TypedSpec()
		f.Disks = append(f.Disks, Disk{DevPath: s.DevPath, Size: s.Size, Model: s.Model, Serial: s.Serial, Transport: s.Transport, Rotational: s.Rotational})
	}
	return f, nil
}

// InstallDisk resolves where config would install Talos on the node: its
// disk, which must exist, or the first disk its selector matches, using
// Talos's own matching. An error says why nothing fits.
func InstallDisk(ctx context.Context, c *client.Client, config []byte) (string, error) {
	cfg, err := configloader.NewFromBytes(config)
	if err != nil {
		return "", err
	}
	inst := cfg.Machine().Install()
	if d := inst.Disk(); d != "" {
		disks, err := safe.StateListAll[*block.Disk](ctx, c.COSI)
		if err != nil {
			return "", err
		}
		var have []string
		for disk := range disks.All() {
			if disk.TypedSpec().DevPath == d {
				return d, nil
			}
			have = append(have, disk.TypedSpec().DevPath)
		}
		return "", fmt.Errorf("install disk %s does not exist; the node has %v", d, have)
	}
	expr, err := inst.DiskMatchExpression()
	if err != nil || expr == nil {
		return "", fmt.Errorf("no install disk or selector in the config: %v", err)
	}
	matched, err := blockhelpers.MatchDisks(ctx, c.COSI, expr)
	if err != nil {
		return "", err
	}
	if len(matched) == 0 {
		return "", fmt.Errorf("no disk matches the install disk selector (%s)", expr.String())
	}
	return matched[0].TypedSpec().DevPath, nil
}

// Apply sends a machine config to a node in maintenance mode; Talos then
// installs itself and reboots into the configured system.
func Apply(ctx context.Context, c *client.Client, config []byte) error {
	_, err := c.ApplyConfiguration(ctx, &machineapi.ApplyConfigurationRequest{
		Data: config,
		Mode: machineapi.ApplyConfigurationRequest_AUTO,
	})
	return err
}

// EtcdMembers lists the hostnames of the voting etcd members a control
// plane knows (learners, still catching up, are left out); zero when etcd
// is not running there. (Calling Bootstrap on a node whose etcd merely is
// down is safe: the node refuses, its data directory not being empty.)
func EtcdMembers(ctx context.Context, c *client.Client) ([]string, error) {
	resp, err := c.EtcdMemberList(ctx, &machineapi.EtcdMemberListRequest{})
	switch status.Code(err) {
	case codes.FailedPrecondition, codes.NotFound, codes.Unavailable:
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var names []string
	for _, m := range resp.GetMessages() {
		for _, member := range m.GetMembers() {
			if !member.GetIsLearner() {
				names = append(names, member.GetHostname())
			}
		}
	}
	return names, nil
}

// Missing lists those of want (hostnames) that members does not hold.
func Missing(members, want []string) []string {
	var out []string
	for _, w := range want {
		if !slices.Contains(members, w) {
			out = append(out, w)
		}
	}
	return out
}

// ErrAlreadyBootstrapped is what Bootstrap returns when the node says etcd
// already has data: it was bootstrapped before.
var ErrAlreadyBootstrapped = errors.New("etcd is already bootstrapped on this node")

// Bootstrap asks a control plane to bootstrap etcd.
func Bootstrap(ctx context.Context, c *client.Client) error {
	err := c.Bootstrap(ctx, &machineapi.BootstrapRequest{})
	msg := status.Convert(err).Message()
	switch {
	case err == nil:
		return nil
	case status.Code(err) == codes.AlreadyExists,
		status.Code(err) == codes.FailedPrecondition && strings.Contains(msg, "not empty"):
		return fmt.Errorf("%w: %s", ErrAlreadyBootstrapped, msg)
	}
	return err
}
