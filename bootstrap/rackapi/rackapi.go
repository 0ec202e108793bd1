// Package rackapi reaches the nodes of a bootstrapped rack for day-2
// work: their Talos API through the bootstrap's talosconfig and the
// addresses it recorded, etcd's members and their health through that
// API, and the cluster through the bootstrap's kubeconfig.
package rackapi

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/cosi-project/runtime/pkg/safe"
	"github.com/siderolabs/talos/pkg/machinery/api/machine"
	"github.com/siderolabs/talos/pkg/machinery/client"
	clientconfig "github.com/siderolabs/talos/pkg/machinery/client/config"
	"github.com/siderolabs/talos/pkg/machinery/resources/network"
	"github.com/siderolabs/talos/pkg/machinery/resources/runtime"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"cozy.dev/cozy/bootstrap/rack"
	"cozy.dev/cozy/bootstrap/state"
	"cozy.dev/cozy/bootstrap/talosapi"
)

// Where the bootstrap keeps what day-2 work needs, in its state dir
// (bootstrap.TalosDir holds the talosconfig).
const (
	TalosconfigFile = "talos/talosconfig"
	KubeconfigFile  = "kubeconfig"
)

// Rack is a bootstrapped rack and how to reach its nodes.
type Rack struct {
	Rack *rack.Rack
	// State is the bootstrap's record, as read when the Rack was opened.
	State       state.State
	Talosconfig *clientconfig.Config
	// Kubeconfig is the path of the bootstrap's admin kubeconfig.
	Kubeconfig string
	TalosPort  int
}

// Open reads the bootstrap's state dir for rack r; port 0 is Talos's.
func Open(r *rack.Rack, stateDir string, port int) (*Rack, error) {
	st, err := state.Read(stateDir)
	if err != nil {
		return nil, err
	}
	tc, err := clientconfig.Open(filepath.Join(stateDir, TalosconfigFile))
	if err != nil {
		return nil, fmt.Errorf("the bootstrap's talosconfig: %w", err)
	}
	if port == 0 {
		port = talosapi.Port
	}
	return &Rack{Rack: r, State: st, Talosconfig: tc, Kubeconfig: filepath.Join(stateDir, KubeconfigFile), TalosPort: port}, nil
}

// Machine is the rack's machine of that name, or an error that lists
// the rack's machines.
func (r *Rack) Machine(name string) (*rack.Machine, error) {
	i := slices.IndexFunc(r.Rack.Machines, func(m rack.Machine) bool { return m.Hostname == name })
	if i < 0 {
		var names []string
		for _, m := range r.Rack.Machines {
			names = append(names, m.Hostname)
		}
		return nil, fmt.Errorf("no machine %q in the rack (its machines: %s)", name, strings.Join(names, ", "))
	}
	return &r.Rack.Machines[i], nil
}

// IP is the address the bootstrap recorded for the node (zero if none).
func (r *Rack) IP(name string) netip.Addr {
	if n := r.State.Nodes[name]; n != nil {
		return n.IP
	}
	return netip.Addr{}
}

// Endpoint is the node's Talos API endpoint ("" if it has no address).
func (r *Rack) Endpoint(name string) string {
	ip := r.IP(name)
	if !ip.IsValid() {
		return ""
	}
	return talosapi.Endpoint(ip, r.TalosPort)
}

// Connect opens the node's Talos API (configured mode, the admin
// talosconfig). The connection is made on the first call.
func (r *Rack) Connect(ctx context.Context, name string) (*client.Client, error) {
	ep := r.Endpoint(name)
	if ep == "" {
		return nil, fmt.Errorf("%s: the bootstrap recorded no address for it", name)
	}
	return talosapi.Secure(ctx, r.Talosconfig, ep)
}

// Call connects to the node and runs f on the connection, all within
// timeout.
func (r *Rack) Call(ctx context.Context, name string, timeout time.Duration, f func(context.Context, *client.Client) error) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	c, err := r.Connect(ctx, name)
	if err != nil {
		return err
	}
	defer c.Close()
	return f(ctx, c)
}

// Version asks the node for its Talos version; an error if it does not
// answer within 15 s.
func (r *Rack) Version(ctx context.Context, name string) (string, error) {
	var v string
	err := r.Call(ctx, name, 15*time.Second, func(ctx context.Context, c *client.Client) error {
		resp, err := c.Version(ctx)
		if err != nil {
			return err
		}
		for _, m := range resp.GetMessages() {
			v = m.GetVersion().GetTag()
			return nil
		}
		return errors.New("an empty version reply")
	})
	return v, err
}

// MachineState is what a node says of itself: its Talos version and its
// machine stage (running, upgrading, rebooting, ...).
type MachineState struct {
	Version string
	Stage   runtime.MachineStage
}

// MachineState asks the node for its version and machine stage; an error if it
// does not answer within 15 s.
func (r *Rack) MachineState(ctx context.Context, name string) (MachineState, error) {
	var ms MachineState
	err := r.Call(ctx, name, 15*time.Second, func(ctx context.Context, c *client.Client) error {
		v, err := c.Version(ctx)
		if err != nil {
			return err
		}
		for _, m := range v.GetMessages() {
			ms.Version = m.GetVersion().GetTag()
		}
		st, err := safe.StateGetByID[*runtime.MachineStatus](ctx, c.COSI, runtime.MachineStatusID)
		if err != nil {
			return fmt.Errorf("machine status: %w", err)
		}
		ms.Stage = st.TypedSpec().Stage
		return nil
	})
	return ms, err
}

// VIPHolder is the control plane that has the rack's VIP on a link now,
// as its Talos API lists its addresses (Talos's AddressStatus mirrors
// the kernel's, the VIP among them); "" if the rack has no VIP or no
// control plane that answers holds it. A control plane that does not
// answer (rebooting) is passed over: it cannot hold the VIP.
func (r *Rack) VIPHolder(ctx context.Context) (string, error) {
	if r.Rack.Cluster.VIP == "" {
		return "", nil
	}
	vip, err := netip.ParseAddr(r.Rack.Cluster.VIP)
	if err != nil {
		return "", fmt.Errorf("cluster.vip %q: %w", r.Rack.Cluster.VIP, err)
	}
	for _, name := range r.ControlPlanes() {
		held := false
		err := r.Call(ctx, name, 5*time.Second, func(ctx context.Context, c *client.Client) error {
			addrs, err := safe.StateListAll[*network.AddressStatus](ctx, c.COSI)
			if err != nil {
				return err
			}
			_, held = addrs.Find(func(a *network.AddressStatus) bool { return a.TypedSpec().Address.Addr() == vip })
			return nil
		})
		if err == nil && held {
			return name, nil
		}
	}
	return "", nil
}

// Kube is a client of the cluster through the bootstrap's kubeconfig.
func (r *Rack) Kube() (kubernetes.Interface, error) {
	rc, err := clientcmd.BuildConfigFromFlags("", r.Kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("the bootstrap's kubeconfig: %w", err)
	}
	rc.Timeout = 30 * time.Second
	return kubernetes.NewForConfig(rc)
}

// ControlPlanes are the rack's control planes, in rack order.
func (r *Rack) ControlPlanes() []string {
	var out []string
	for _, m := range r.Rack.Machines {
		if m.Role == rack.RoleControlPlane {
			out = append(out, m.Hostname)
		}
	}
	return out
}

// Member is one etcd member, as a control plane lists it.
type Member struct {
	Name    string `json:"name"`
	ID      uint64 `json:"id"`
	Learner bool   `json:"learner,omitempty"`
	// Healthy says its own node reports its etcd with a leader and
	// without errors.
	Healthy bool `json:"healthy"`
}

// Etcd is etcd's membership and health, as Etcd found it.
type Etcd []Member

// Voters are the voting members' names, sorted.
func (e Etcd) Voters() []string {
	var out []string
	for _, m := range e {
		if !m.Learner {
			out = append(out, m.Name)
		}
	}
	slices.Sort(out)
	return out
}

// Healthy are the healthy voting members' names, sorted.
func (e Etcd) Healthy() []string {
	var out []string
	for _, m := range e {
		if !m.Learner && m.Healthy {
			out = append(out, m.Name)
		}
	}
	slices.Sort(out)
	return out
}

// Member is the member of that name, if there is one.
func (e Etcd) Member(name string) (Member, bool) {
	i := slices.IndexFunc(e, func(m Member) bool { return m.Name == name })
	if i < 0 {
		return Member{}, false
	}
	return e[i], true
}

// Etcd lists etcd's members through the first control plane of the rack
// that answers, and asks each member's own node for its etcd status.
func (r *Rack) Etcd(ctx context.Context) (Etcd, error) {
	var errs []error
	for _, cp := range r.ControlPlanes() {
		if r.Endpoint(cp) == "" {
			continue
		}
		members, err := r.memberList(ctx, cp)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", cp, err))
			continue
		}
		for i := range members {
			members[i].Healthy = r.etcdHealthy(ctx, members[i].Name)
		}
		return members, nil
	}
	return nil, fmt.Errorf("no control plane lists etcd's members: %w", errors.Join(errs...))
}

func (r *Rack) memberList(ctx context.Context, name string) (Etcd, error) {
	var out Etcd
	err := r.Call(ctx, name, 15*time.Second, func(ctx context.Context, c *client.Client) error {
		resp, err := c.EtcdMemberList(ctx, &machine.EtcdMemberListRequest{})
		if err != nil {
			return fmt.Errorf("etcd members: %w", err)
		}
		for _, msg := range resp.GetMessages() {
			for _, m := range msg.GetMembers() {
				out = append(out, Member{Name: m.GetHostname(), ID: m.GetId(), Learner: m.GetIsLearner()})
			}
		}
		return nil
	})
	return out, err
}

func (r *Rack) etcdHealthy(ctx context.Context, name string) bool {
	if r.Endpoint(name) == "" {
		return false
	}
	healthy := false
	_ = r.Call(ctx, name, 10*time.Second, func(ctx context.Context, c *client.Client) error {
		resp, err := c.EtcdStatus(ctx)
		if err != nil {
			return err
		}
		for _, msg := range resp.GetMessages() {
			st := msg.GetMemberStatus()
			healthy = st.GetLeader() != 0 && len(st.GetErrors()) == 0
			break
		}
		return nil
	})
	return healthy
}
