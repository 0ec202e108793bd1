package talosnode

import (
	"bytes"
	"context"
	"crypto/tls"
	stdx509 "crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/siderolabs/talos/pkg/machinery/config/config"
)

// joinRetry is how long a control plane waits between tries to join etcd.
const joinRetry = 2 * time.Second

// joinEtcd makes a control plane that was not bootstrapped a member of the
// cluster's etcd, as Talos's etcd service does on every control plane but
// the first: it finds the other control planes in the kubernetes
// EndpointSlice through the cluster endpoint, adds itself as a learner
// through one of their etcds, starts its own etcd with the cluster's
// members, and promotes itself once it has caught up. kube-apiserver
// starts once the local etcd answers. It tries until ctx ends.
func (n *Node) joinEtcd(ctx context.Context, mc config.Config, hostname string) {
	pki := controlPlaneFiles{filepath.Join(n.cfg.StateDir, PKIDir)}
	// Under the node's lock, as Bootstrap writes the same files under it:
	// written at once by both, etcd got one's certificate with the
	// other's key ("tls: private key does not match public key").
	n.mu.Lock()
	if n.cp != nil {
		n.mu.Unlock()
		return
	}
	clientCert, err := writePKI(pki, n.cfg, mc, hostname)
	n.mu.Unlock()
	if err != nil {
		n.log.Error("join etcd: control plane certificates", "err", err)
		return
	}
	j := &joiner{
		self:     "https://" + n.cfg.hostPort(EtcdPeerPort),
		hostname: hostname,
		etcd:     etcdHTTPClient(mc, clientCert),
	}
	var initial string
	for attempt := 0; ; attempt++ {
		n.mu.Lock()
		done := n.cp != nil // bootstrapped through the API meanwhile
		n.mu.Unlock()
		if done {
			return
		}
		peers, err := controlPlaneAddresses(ctx, mc)
		if err == nil {
			initial, err = j.addLearner(ctx, withoutAddr(peers, n.cfg.Address))
		}
		if err == nil {
			break
		}
		if attempt%15 == 0 {
			n.log.Info("join etcd: waiting for the cluster's etcd", "err", err)
		} else {
			n.log.Debug("join etcd: waiting for the cluster's etcd", "err", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(joinRetry):
		}
	}
	n.log.Info("join etcd: added as a learner", "initial-cluster", initial)
	n.mu.Lock()
	if n.cp != nil {
		n.mu.Unlock()
		return
	}
	cp, err := startControlPlane(n.cfg, mc, hostname, n.spawn, initial)
	if err != nil {
		n.mu.Unlock()
		n.log.Error("join etcd: start etcd and kube-apiserver", "err", err)
		return
	}
	n.cp = cp
	n.mu.Unlock()
	for attempt := 0; ; attempt++ {
		err := j.promote(ctx)
		if err == nil {
			n.log.Info("join etcd: promoted to a voting member; etcd and kube-apiserver started", "logs", filepath.Join(n.cfg.StateDir, LogDir))
			return
		}
		if attempt%15 == 0 {
			n.log.Info("join etcd: waiting to catch up with the leader", "err", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(joinRetry / 2):
		}
	}
}

// joiner talks to the cluster's etcd members over etcd's v3 JSON gateway.
type joiner struct {
	self     string // this node's peer URL
	hostname string
	etcd     *http.Client
	// Set by addLearner:
	peer string // a member's client URL
	id   string // this node's member ID
}

type etcdMember struct {
	ID         string   `json:"ID"`
	Name       string   `json:"name"`
	PeerURLs   []string `json:"peerURLs"`
	ClientURLs []string `json:"clientURLs"`
	IsLearner  bool     `json:"isLearner"`
}

// addLearner adds this node to etcd as a learner through the first peer
// that answers, unless a previous boot did, and returns the initial
// cluster to start etcd with.
func (j *joiner) addLearner(ctx context.Context, peers []netip.Addr) (string, error) {
	if len(peers) == 0 {
		return "", errors.New("no other control plane is in the kubernetes EndpointSlice yet")
	}
	var errs []error
	for _, p := range peers {
		url := "https://" + netip.AddrPortFrom(p, EtcdClientPort).String()
		var list struct{ Members []etcdMember }
		if err := j.call(ctx, url, "member/list", struct{}{}, &list); err != nil {
			errs = append(errs, err)
			continue
		}
		members := list.Members
		if !slices.ContainsFunc(members, j.isSelf) {
			var added struct {
				Member  etcdMember
				Members []etcdMember
			}
			req := map[string]any{"peerURLs": []string{j.self}, "isLearner": true}
			if err := j.call(ctx, url, "member/add", req, &added); err != nil {
				errs = append(errs, err)
				continue
			}
			members = added.Members
		}
		var initial []string
		for _, m := range members {
			name := m.Name
			if j.isSelf(m) {
				name, j.id = j.hostname, m.ID
			}
			for _, u := range m.PeerURLs {
				initial = append(initial, name+"="+u)
			}
		}
		if j.id == "" {
			return "", fmt.Errorf("etcd at %s added this node but does not list it", url)
		}
		j.peer = url
		return strings.Join(initial, ","), nil
	}
	return "", errors.Join(errs...)
}

func (j *joiner) isSelf(m etcdMember) bool { return slices.Contains(m.PeerURLs, j.self) }

// promote makes this node a voting member; etcd refuses until the learner
// has caught up with the leader.
func (j *joiner) promote(ctx context.Context) error {
	err := j.call(ctx, j.peer, "member/promote", map[string]string{"ID": j.id}, nil)
	if err != nil && strings.Contains(err.Error(), "not a learner") {
		return nil // promoted before (a reboot in between)
	}
	return err
}

// call POSTs a request to etcd's cluster service.
func (j *joiner) call(ctx context.Context, clientURL, method string, req, resp any) error {
	return etcdCall(ctx, j.etcd, clientURL, "/v3/cluster/"+method, req, resp)
}

// etcdHTTPClient talks to etcd with the node's etcd client certificate.
func etcdHTTPClient(mc config.Config, client tls.Certificate) *http.Client {
	return &http.Client{
		Timeout:   10 * time.Second,
		Transport: &http.Transport{TLSClientConfig: etcdClientTLS(mc, client)},
	}
}

// etcdClientTLS trusts the cluster's etcd CA and presents client.
func etcdClientTLS(mc config.Config, client tls.Certificate) *tls.Config {
	ca := stdx509.NewCertPool()
	ca.AppendCertsFromPEM(mc.Cluster().Etcd().CA().Crt)
	return &tls.Config{
		RootCAs:      ca,
		Certificates: []tls.Certificate{client},
		MinVersion:   tls.VersionTLS12,
	}
}

// controlPlaneAddresses reads the API servers' addresses from the
// kubernetes EndpointSlice through the cluster endpoint, with an admin
// certificate issued from the cluster CA (a control plane holds its key).
func controlPlaneAddresses(ctx context.Context, mc config.Config) ([]netip.Addr, error) {
	cl := mc.Cluster()
	kp, err := clusterClientCert(cl, "talos:etcd-join", "system:masters", time.Hour)
	if err != nil {
		return nil, err
	}
	roots := stdx509.NewCertPool()
	roots.AppendCertsFromPEM(cl.IssuingCA().Crt)
	hc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{
		RootCAs: roots, Certificates: []tls.Certificate{*kp.Certificate}, MinVersion: tls.VersionTLS12,
	}}}
	url := strings.TrimSuffix(cl.Endpoint().String(), "/") + "/apis/discovery.k8s.io/v1/namespaces/default/endpointslices/kubernetes"
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	res, err := hc.Do(req)
	if err != nil {
		return nil, fmt.Errorf("the cluster's API: %w", err)
	}
	defer res.Body.Close()
	data, err := io.ReadAll(io.LimitReader(res.Body, 1<<20))
	if err != nil {
		return nil, err
	}
	if res.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s: %s: %s", url, res.Status, bytes.TrimSpace(data))
	}
	var slice struct {
		Endpoints []struct {
			Addresses []string `json:"addresses"`
		} `json:"endpoints"`
	}
	if err := json.Unmarshal(data, &slice); err != nil {
		return nil, fmt.Errorf("the kubernetes EndpointSlice: %w", err)
	}
	var out []netip.Addr
	for _, e := range slice.Endpoints {
		for _, a := range e.Addresses {
			if ip, err := netip.ParseAddr(a); err == nil {
				out = append(out, ip)
			}
		}
	}
	return out, nil
}

func withoutAddr(addrs []netip.Addr, self netip.Addr) []netip.Addr {
	return slices.DeleteFunc(slices.Clone(addrs), func(a netip.Addr) bool { return a == self })
}
