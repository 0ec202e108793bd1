package talosnode

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os/exec"
	"strconv"
	"time"

	"github.com/cosi-project/runtime/pkg/state"
	"github.com/mdlayher/packet"
	coreconfig "github.com/siderolabs/talos/pkg/machinery/config"
	"github.com/siderolabs/talos/pkg/machinery/config/config"
	"github.com/siderolabs/talos/pkg/machinery/nethelpers"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// vipLeaseTTL is the etcd lease (seconds) behind a VIP: when its holder
// dies, another control plane takes the VIP over within this time; when
// it lets go (a reboot, a shutdown), as soon as the others, watching its
// key in etcd, see it deleted.
const (
	vipLeaseTTL = 10
	vipLook     = 200 * time.Millisecond
	// vipWatch bounds a wait for the VIP's holder to let go: then the key
	// is read again.
	vipWatch = 5 * time.Second
)

// layer2VIP is the shared address of the config's Layer2VIPConfig, if any.
func layer2VIP(mc coreconfig.Provider) (netip.Addr, bool) {
	for _, d := range mc.Documents() {
		if v, ok := d.(config.NetworkLayer2VIPConfig); ok && v.VIP().IsValid() {
			return v.VIP(), true
		}
	}
	return netip.Addr{}, false
}

// runVIP holds the control planes' shared address while this node wins
// the election for it in etcd, as Talos's VIP controller does: a key
// under a lease, kept alive while this node's etcd is up. The holder puts
// the address on the NIC whose subnet holds it and announces it with
// gratuitous ARP; the address goes when the lease is lost or ctx ends.
func (n *Node) runVIP(ctx context.Context, vip netip.Addr, hostname string) {
	v := &vipHolder{node: n, vip: vip, key: "/cozy-talos-node/vip/" + vip.String(), hostname: hostname}
	defer v.release()
	for {
		err := v.campaign(ctx)
		if ctx.Err() != nil {
			return
		}
		if err != nil && !errors.Is(err, errNotLeader) && !errors.Is(err, errResigned) {
			n.log.Debug("vip: election", "vip", vip, "err", err)
		}
		v.release()
		// Another holder: wait for it to let go, as Talos's election
		// observes the key, so that the VIP moves as soon as it is free.
		// Resigned: long enough for the others to take it. An error:
		// back off.
		switch {
		case errors.Is(err, errNotLeader):
			v.waitFree(ctx, vipWatch)
		case !sleep(ctx, 2*time.Second):
			return
		}
	}
}

var (
	errNotLeader = errors.New("another control plane holds the VIP")
	errResigned  = errors.New("let the VIP go")
)

// waitFree returns once the VIP's key is deleted after the revision
// campaign saw it held (its holder let go, or its lease expired), after
// at most max, or at once after vipLook if etcd cannot be watched.
func (v *vipHolder) waitFree(ctx context.Context, max time.Duration) {
	v.node.mu.Lock()
	cp := v.node.cp
	v.node.mu.Unlock()
	if cp == nil || v.seen == 0 {
		sleep(ctx, vipLook)
		return
	}
	c, err := clientv3.New(clientv3.Config{Endpoints: []string{cp.etcdURL}, TLS: cp.etcdTLS, DialTimeout: 2 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		sleep(ctx, vipLook)
		return
	}
	defer c.Close()
	wctx, cancel := context.WithTimeout(ctx, max)
	defer cancel()
	for resp := range c.Watch(wctx, v.key, clientv3.WithRev(v.seen+1), clientv3.WithFilterPut()) {
		if resp.Err() != nil {
			sleep(ctx, vipLook)
			return
		}
		if len(resp.Events) > 0 {
			return
		}
	}
}

type vipHolder struct {
	node     *Node
	vip      netip.Addr
	key      string
	hostname string
	link     string // set while the address is on it
	seen     int64  // etcd's revision when campaign last found the key held
}

// campaign wins the key once it is free and holds the VIP until the lease
// cannot be kept alive.
func (v *vipHolder) campaign(ctx context.Context) error {
	v.node.mu.Lock()
	cp := v.node.cp
	v.node.mu.Unlock()
	if cp == nil {
		return errNotLeader // no local etcd (yet)
	}
	key := base64.StdEncoding.EncodeToString([]byte(v.key))
	var held struct {
		Count  string
		Header struct{ Revision string }
	}
	if err := etcdCall(ctx, cp.etcd, cp.etcdURL, "/v3/kv/range", map[string]any{"key": key, "count_only": true}, &held); err != nil {
		return err
	}
	if held.Count != "" && held.Count != "0" {
		v.seen, _ = strconv.ParseInt(held.Header.Revision, 10, 64)
		return errNotLeader
	}
	var lease struct{ ID string }
	if err := etcdCall(ctx, cp.etcd, cp.etcdURL, "/v3/lease/grant", map[string]any{"TTL": vipLeaseTTL}, &lease); err != nil {
		return err
	}
	var txn struct{ Succeeded bool }
	if err := etcdCall(ctx, cp.etcd, cp.etcdURL, "/v3/kv/txn", map[string]any{
		"compare": []any{map[string]any{"key": key, "target": "CREATE", "result": "EQUAL", "create_revision": "0"}},
		"success": []any{map[string]any{"request_put": map[string]any{
			"key": key, "value": base64.StdEncoding.EncodeToString([]byte(v.hostname)), "lease": lease.ID}}},
	}, &txn); err != nil {
		return err
	}
	if !txn.Succeeded {
		_ = etcdCall(ctx, cp.etcd, cp.etcdURL, "/v3/lease/revoke", map[string]any{"ID": lease.ID}, nil)
		return errNotLeader
	}
	// A restart before this node held the VIP is no reason to let it go.
	select {
	case <-cp.apiRestarts:
	default:
	}
	if err := v.acquire(); err != nil {
		_ = etcdCall(context.WithoutCancel(ctx), cp.etcd, cp.etcdURL, "/v3/lease/revoke", map[string]any{"ID": lease.ID}, nil)
		return err
	}
	// The lease is kept alive beside the loop, as etcd's session does
	// beside Talos's VIP operator: a keepalive that a busy etcd answers
	// late must not hold up letting the VIP go when kube-apiserver
	// restarts (the API behind the VIP refuses connections meanwhile).
	tick := time.NewTicker(vipLeaseTTL * time.Second / 3)
	defer tick.Stop()
	kept := make(chan error, 1)
	keeping := false
	for {
		select {
		case <-ctx.Done():
			_ = etcdCall(context.WithoutCancel(ctx), cp.etcd, cp.etcdURL, "/v3/lease/revoke", map[string]any{"ID": lease.ID}, nil)
			return ctx.Err()
		case <-cp.apiRestarts:
			// As Talos's VIP operator when its kube-apiserver static pod
			// goes away: another control plane's serves meanwhile.
			v.node.log.Info("vip: kube-apiserver restarting: letting the VIP go", "vip", v.vip)
			_ = etcdCall(context.WithoutCancel(ctx), cp.etcd, cp.etcdURL, "/v3/lease/revoke", map[string]any{"ID": lease.ID}, nil)
			return errResigned
		case <-tick.C:
			if !keeping {
				keeping = true
				go func() { kept <- keepAlive(ctx, cp, lease.ID) }()
			}
		case err := <-kept:
			keeping = false
			if err != nil {
				v.node.log.Warn("vip: lost the election", "vip", v.vip, "err", err)
				return err
			}
		}
	}
}

// keepAlive renews the VIP's lease once.
func keepAlive(ctx context.Context, cp *controlPlane, id string) error {
	var alive struct {
		Result struct{ TTL string }
	}
	err := etcdCall(ctx, cp.etcd, cp.etcdURL, "/v3/lease/keepalive", map[string]any{"ID": id}, &alive)
	if err == nil && (alive.Result.TTL == "" || alive.Result.TTL == "0") {
		err = errors.New("the lease expired")
	}
	return err
}

// acquire puts the VIP on the NIC whose subnet holds it.
func (v *vipHolder) acquire() error {
	link, err := linkFor(v.vip)
	if err != nil {
		return err
	}
	if out, err := exec.Command("ip", "addr", "replace", v.vip.String()+"/32", "dev", link).CombinedOutput(); err != nil {
		return fmt.Errorf("vip: ip addr add %s dev %s: %v: %s", v.vip, link, err, bytes.TrimSpace(out))
	}
	v.link = link
	v.published(true)
	// Tell the link's neighbours at once, as Talos does: until they
	// hear, they send to the MAC of the previous holder, for as long as
	// their ARP entry lives (tens of seconds).
	if err := gratuitousARP(link, v.vip); err != nil {
		v.node.log.Warn("vip: gratuitous ARP", "vip", v.vip, "link", link, "err", err)
	}
	v.node.log.Info("vip: this node holds the shared address", "vip", v.vip, "link", link)
	return nil
}

// gratuitousARP broadcasts an ARP request for ip from ip on the link
// (RFC 5227's announcement): every neighbour updates its entry for ip to
// this link's MAC.
func gratuitousARP(link string, ip netip.Addr) error {
	ifi, err := net.InterfaceByName(link)
	if err != nil {
		return err
	}
	const etherTypeARP = 0x0806
	conn, err := packet.Listen(ifi, packet.Raw, etherTypeARP, nil)
	if err != nil {
		return err
	}
	defer conn.Close()
	broadcast := net.HardwareAddr{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}
	frame := make([]byte, 0, 42)
	frame = append(frame, broadcast...)
	frame = append(frame, ifi.HardwareAddr...)
	frame = binary.BigEndian.AppendUint16(frame, etherTypeARP)
	frame = binary.BigEndian.AppendUint16(frame, 1)      // hardware: Ethernet
	frame = binary.BigEndian.AppendUint16(frame, 0x0800) // protocol: IPv4
	frame = append(frame, 6, 4)
	frame = binary.BigEndian.AppendUint16(frame, 1) // request
	addr := ip.As4()
	frame = append(frame, ifi.HardwareAddr...)
	frame = append(frame, addr[:]...)
	frame = append(frame, 0, 0, 0, 0, 0, 0)
	frame = append(frame, addr[:]...)
	_, err = conn.WriteTo(frame, &packet.Addr{HardwareAddr: broadcast})
	return err
}

func (v *vipHolder) release() {
	if v.link == "" {
		return
	}
	_ = exec.Command("ip", "addr", "del", v.vip.String()+"/32", "dev", v.link).Run()
	v.published(false)
	v.node.log.Info("vip: released the shared address", "vip", v.vip, "link", v.link)
	v.link = ""
}

// published lists the VIP among the node's addresses (AddressStatus), or
// takes it off, as Talos's list follows the kernel's: clients learn from
// it which control plane holds the VIP (cozyctl upgrade takes that one
// last).
func (v *vipHolder) published(held bool) {
	v.node.mu.Lock()
	st := v.node.state
	v.node.mu.Unlock()
	if st == nil {
		return
	}
	a := address(linkName(0), 2, netip.PrefixFrom(v.vip, v.vip.BitLen()), nethelpers.ScopeGlobal)
	ctx := context.Background()
	var err error
	if held {
		err = put(ctx, st, a)
	} else if err = st.Destroy(ctx, a.Metadata()); state.IsNotFoundError(err) {
		err = nil
	}
	if err != nil {
		v.node.log.Warn("vip: the address list", "vip", v.vip, "held", held, "err", err)
	}
}

// linkFor is the interface with an address in a subnet holding ip.
func linkFor(ip netip.Addr) (string, error) {
	ifaces, err := net.Interfaces()
	if err != nil {
		return "", err
	}
	for _, ifc := range ifaces {
		addrs, _ := ifc.Addrs()
		for _, a := range addrs {
			p, err := netip.ParsePrefix(a.String())
			if err == nil && p.Bits() < p.Addr().BitLen() && p.Masked().Contains(ip) {
				return ifc.Name, nil
			}
		}
	}
	return "", fmt.Errorf("vip %s: no interface has an address in its subnet", ip)
}

// etcdCall POSTs a request to etcd's v3 JSON gateway.
func etcdCall(ctx context.Context, hc *http.Client, clientURL, path string, req, resp any) error {
	body, err := json.Marshal(req)
	if err != nil {
		return err
	}
	r, err := http.NewRequestWithContext(ctx, http.MethodPost, clientURL+path, bytes.NewReader(body))
	if err != nil {
		return err
	}
	r.Header.Set("Content-Type", "application/json")
	res, err := hc.Do(r)
	if err != nil {
		return fmt.Errorf("etcd %s: %w", path, err)
	}
	defer res.Body.Close()
	data, err := io.ReadAll(io.LimitReader(res.Body, 1<<20))
	if err != nil {
		return fmt.Errorf("etcd %s: %w", path, err)
	}
	if res.StatusCode != http.StatusOK {
		return fmt.Errorf("etcd %s at %s: %s: %s", path, clientURL, res.Status, bytes.TrimSpace(data))
	}
	if resp == nil {
		return nil
	}
	// IDs and TTLs are int64s, which the gateway writes as strings or
	// numbers depending on the field; read them all as text.
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	var raw any
	if err := dec.Decode(&raw); err != nil {
		return fmt.Errorf("etcd %s: %w", path, err)
	}
	norm, _ := json.Marshal(numbersAsText(raw))
	return json.Unmarshal(norm, resp)
}

// numbersAsText turns every number into a string.
func numbersAsText(v any) any {
	switch v := v.(type) {
	case map[string]any:
		for k, x := range v {
			v[k] = numbersAsText(x)
		}
	case []any:
		for i := range v {
			v[i] = numbersAsText(v[i])
		}
	case json.Number:
		return v.String()
	}
	return v
}
