package wait

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"
)

func TestFor(t *testing.T) {
	calls := 0
	if err := For(context.Background(), time.Minute, "the third call", func() error {
		calls++
		if calls < 3 {
			return errors.New("not yet")
		}
		return nil
	}); err != nil || calls != 3 {
		t.Fatalf("err %v after %d calls, want nil after 3", err, calls)
	}
	err := For(context.Background(), 10*time.Millisecond, "never", func() error { return errors.New("still no") })
	if err == nil || !strings.Contains(err.Error(), "waiting for never") || !strings.Contains(err.Error(), "still no") {
		t.Fatalf("got %v, want what was awaited and the last error", err)
	}
}
