package lab

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"cozy.dev/cozy/internal/netns"
)

// RegistryPort is where the lab's registry mirror listens, on ServerIP:
// every image the nodes pull comes from there (the rack's
// registries.mirror), as on an air-gapped rack.
const RegistryPort = 5000

// RegistryURL is the lab's mirror, as the rack names it.
func RegistryURL() string {
	return "http://" + net.JoinHostPort(ServerIP.String(), strconv.Itoa(RegistryPort))
}

// startRegistry runs `cozyctl registry serve` in the lab's namespace, its
// storage in the lab's dir (so images survive lab down and the next lab
// up finds them), and waits until it answers. deleteNetwork ends it with
// the rest of the namespace.
func (c *Config) startRegistry(ctx context.Context, cozyctl string) error {
	dir := filepath.Join(c.Dir, "registry")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	logf, err := os.OpenFile(filepath.Join(c.Dir, "registry.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer logf.Close()
	addr := net.JoinHostPort(ServerIP.String(), strconv.Itoa(RegistryPort))
	cmd := exec.Command("ip", "netns", "exec", Namespace(c.Name), cozyctl, "registry", "serve", "--listen", addr, "--dir", dir)
	cmd.Stdout, cmd.Stderr = logf, logf
	// Its own session: it outlives this command, as the lab does.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start the registry: %w", err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	hc := &http.Client{Transport: &http.Transport{DialContext: netns.Dialer(Namespace(c.Name))}, Timeout: 2 * time.Second}
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := hc.Get("http://" + addr + "/v2/")
		if err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		select {
		case err := <-exited:
			return fmt.Errorf("the registry exited: %v (log: %s)", err, filepath.Join(c.Dir, "registry.log"))
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the registry does not answer on %s (log: %s)", addr, filepath.Join(c.Dir, "registry.log"))
		}
	}
}

// mirrorImages copies the images of an OCI layout into the lab's
// registry with `cozyctl images mirror`, inside the namespace; a second
// lab up copies only what is missing.
func (c *Config) mirrorImages(ctx context.Context, cozyctl, layout string, progress io.Writer) error {
	cmd := exec.CommandContext(ctx, "ip", "netns", "exec", Namespace(c.Name), cozyctl, "images", "mirror",
		"--from", layout, "--to", net.JoinHostPort(ServerIP.String(), strconv.Itoa(RegistryPort)), "--insecure")
	cmd.Stdout, cmd.Stderr = progress, progress
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("cozyctl images mirror: %w", err)
	}
	return nil
}
