// Package poll is the tests' one way to wait for something: call a check
// every interval until it passes, and fail the test with the check's last
// error when the time is up.
package poll

import (
	"context"
	"testing"
	"time"
)

// Until calls f every interval until it returns nil. If ctx ends first,
// the test fails with what, f's last error and why ctx ended.
func Until(t testing.TB, ctx context.Context, interval time.Duration, what string, f func() error) {
	t.Helper()
	for {
		err := f()
		if err == nil {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("waiting for %s: %v (%v)", what, err, context.Cause(ctx))
		case <-time.After(interval):
		}
	}
}

// Within is Until with timeout from now.
func Within(t testing.TB, timeout, interval time.Duration, what string, f func() error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	Until(t, ctx, interval, what, f)
}
