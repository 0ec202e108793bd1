package talosnode

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/url"
	"strconv"
	"sync"
	"time"

	"github.com/siderolabs/talos/pkg/machinery/config/config"
)

// KubePrism is Talos's in-node load balancer for the Kubernetes API: a
// TCP proxy on 127.0.0.1:<machine.features.kubePrism.port> that every
// node's kubelet, controller-manager, scheduler and host-network pods
// (flannel, kube-proxy) use, so they reach the API whichever control
// plane is up. Upstreams, in order: the cluster endpoint, then on a
// control plane its own API server; a connection goes to the first that
// accepts it.

// kubePrism returns the listen address and upstreams of the node's
// KubePrism, and false when the config turns it off.
func kubePrism(mc config.Config) (listen string, upstreams []string, ok bool) {
	kp := mc.Machine().Features().KubePrism()
	if kp == nil || !kp.Enabled() {
		return "", nil, false
	}
	listen = net.JoinHostPort("127.0.0.1", strconv.Itoa(kp.Port()))
	upstreams = append(upstreams, hostPortOf(mc.Cluster().Endpoint()))
	if mc.Machine().Type().IsControlPlane() {
		upstreams = append(upstreams, net.JoinHostPort("localhost", strconv.Itoa(apiServerPort(mc))))
	}
	return listen, upstreams, true
}

// localAPIEndpoint is the API server address node services use: KubePrism
// when it is on, else on a control plane its own API server, else the
// cluster endpoint, as Talos writes the kubelet's and the components'
// kubeconfigs.
func localAPIEndpoint(mc config.Config) string {
	if kp := mc.Machine().Features().KubePrism(); kp != nil && kp.Enabled() {
		return "https://" + net.JoinHostPort("127.0.0.1", strconv.Itoa(kp.Port()))
	}
	if mc.Machine().Type().IsControlPlane() {
		return "https://" + net.JoinHostPort("localhost", strconv.Itoa(apiServerPort(mc)))
	}
	return mc.Cluster().Endpoint().String()
}

func apiServerPort(mc config.Config) int {
	if p := mc.Cluster().LocalAPIServerPort(); p != 0 {
		return p
	}
	return 6443
}

func hostPortOf(u *url.URL) string {
	if u.Port() != "" {
		return u.Host
	}
	return net.JoinHostPort(u.Hostname(), "443")
}

// runKubePrism proxies connections on listen to the first upstream that
// accepts them, until ctx ends.
func runKubePrism(ctx context.Context, log *slog.Logger, listen string, upstreams []string) error {
	lis, err := net.Listen("tcp", listen)
	if err != nil {
		return err
	}
	var wg sync.WaitGroup
	defer wg.Wait()
	go func() {
		<-ctx.Done()
		lis.Close()
	}()
	log.Info("KubePrism listening", "address", listen, "upstreams", upstreams)
	for {
		c, err := lis.Accept()
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, net.ErrClosed) {
				return nil
			}
			return err
		}
		wg.Go(func() { proxy(ctx, c, upstreams) })
	}
}

func proxy(ctx context.Context, c net.Conn, upstreams []string) {
	defer c.Close()
	d := net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}
	var up net.Conn
	for _, u := range upstreams {
		var err error
		if up, err = d.DialContext(ctx, "tcp", u); err == nil {
			break
		}
	}
	if up == nil {
		return
	}
	defer up.Close()
	done := make(chan struct{}, 2)
	go func() { _, _ = io.Copy(up, c); closeWrite(up); done <- struct{}{} }()
	go func() { _, _ = io.Copy(c, up); closeWrite(c); done <- struct{}{} }()
	select {
	case <-done:
		<-done
	case <-ctx.Done():
	}
}

func closeWrite(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.CloseWrite()
	}
}
