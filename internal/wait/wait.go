// Package wait polls until something holds, for day-2 commands that wait
// on nodes and clusters.
package wait

import (
	"context"
	"fmt"
	"time"
)

// For runs f every second until it returns nil, ctx ends or timeout
// passes; then the error says what was awaited and f's last error.
func For(ctx context.Context, timeout time.Duration, what string, f func() error) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	for {
		err := f()
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for %s: %w (last: %v)", what, ctx.Err(), err)
		case <-time.After(time.Second):
		}
	}
}
