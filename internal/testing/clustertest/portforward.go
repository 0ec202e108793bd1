package clustertest

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"

	"cozy.dev/cozy/internal/testing/poll"
	"cozy.dev/cozy/internal/testing/syncbuf"
)

// KubectlCommand makes (does not start) a kubectl command with args
// against the cluster under test, for kubectl that keeps running
// (port-forward).
type KubectlCommand func(ctx context.Context, args ...string) *exec.Cmd

// Dial connects where kubectl runs (the host, or the lab's namespace).
type Dial func(ctx context.Context, network, addr string) (net.Conn, error)

// forwarding is kubectl port-forward's line naming the local port.
var forwarding = regexp.MustCompile(`^Forwarding from (127\.0\.0\.1:\d+) -> \d+`)

// CheckPortForward runs `kubectl port-forward` to each probe pod's web
// server and reads its page through the local port: the API server
// streams to the pod's kubelet and on to the runtime's port forwarder.
func CheckPortForward(t *testing.T, kubectl KubectlCommand, dial Dial, pods []Pod) {
	t.Helper()
	for _, p := range pods {
		t.Run("port-forward to "+p.Node, func(t *testing.T) {
			poll.Within(t, 2*time.Minute, time.Second, "port-forward", func() error { return portForward(kubectl, dial, p) })
		})
	}
}

func portForward(kubectl KubectlCommand, dial Dial, p Pod) error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := kubectl(ctx, "port-forward", "pod/"+p.Name, "--address", "127.0.0.1", ":8080")
	var stderr syncbuf.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	if err := cmd.Start(); err != nil {
		return err
	}
	defer func() {
		cancel()
		_ = cmd.Wait()
	}()
	var addr string
	lines := bufio.NewScanner(out)
	for addr == "" && lines.Scan() {
		if m := forwarding.FindStringSubmatch(lines.Text()); m != nil {
			addr = m[1]
		}
	}
	if addr == "" {
		return fmt.Errorf("kubectl port-forward named no local port: %s", stderr.String())
	}
	go func() { _, _ = io.Copy(io.Discard, out) }() // "Handling connection ..." lines
	conn, err := dial(ctx, "tcp", addr)
	if err != nil {
		return err
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(30 * time.Second))
	if _, err := io.WriteString(conn, "GET / HTTP/1.0\r\n\r\n"); err != nil {
		return err
	}
	page, err := io.ReadAll(conn)
	if !strings.Contains(string(page), "probe on "+p.Node) {
		return fmt.Errorf("through %s: %q (%v; kubectl: %s)", addr, page, err, stderr.String())
	}
	return nil
}
