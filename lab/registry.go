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
// up finds them), and waits until it answers.
func (c *Config) startRegistry(ctx context.Context, cozyctl string) error {
	dir := filepath.Join(c.Dir, "registry")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	addr := net.JoinHostPort(ServerIP.String(), strconv.Itoa(RegistryPort))
	hc := &http.Client{Transport: &http.Transport{DialContext: netns.Dialer(Namespace(c.Name))}, Timeout: 2 * time.Second}
	ready := func(context.Context) error {
		resp, err := hc.Get("http://" + addr + "/v2/")
		if err != nil {
			return err
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("/v2/ answered %s", resp.Status)
		}
		return nil
	}
	return c.startDaemon(ctx, "the registry on "+addr, cozyctl, "registry.log", 0o644, ready, "registry", "serve", "--listen", addr, "--dir", dir)
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
