package lab

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"time"
)

// startDaemon runs `cozyctl ARGS` in the lab's namespace, in its own
// session (it outlives lab up, as the lab does), its output in the lab's
// dir as logName, and waits up to 30 s for ready to succeed. deleteNetwork
// ends it with the rest of the namespace.
func (c *Config) startDaemon(ctx context.Context, what, cozyctl, logName string, logMode os.FileMode, ready func(context.Context) error, args ...string) error {
	logPath := filepath.Join(c.Dir, logName)
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, logMode)
	if err != nil {
		return err
	}
	defer logf.Close()
	cmd := exec.Command("ip", append([]string{"netns", "exec", Namespace(c.Name), cozyctl}, args...)...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start %s: %w", what, err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	deadline := time.Now().Add(30 * time.Second)
	for {
		err := ready(ctx)
		if err == nil {
			return nil
		}
		select {
		case werr := <-exited:
			return fmt.Errorf("%s exited: %v (log: %s)", what, werr, logPath)
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s does not answer: %v (log: %s)", what, err, logPath)
		}
	}
}
