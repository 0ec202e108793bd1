package poll

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"
)

// recorder is a testing.TB whose Fatalf records the message and stops the
// goroutine, as the real one does.
type recorder struct {
	testing.TB
	failed string
}

func (r *recorder) Helper() {}
func (r *recorder) Fatalf(format string, args ...any) {
	r.failed = fmt.Sprintf(format, args...)
	panic(r)
}

func run(f func(tb testing.TB)) (failed string) {
	r := &recorder{}
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer func() {
			if p := recover(); p != nil && p != r {
				panic(p)
			}
		}()
		f(r)
	}()
	<-done
	return r.failed
}

func TestUntilReturnsOnceTheCheckPasses(t *testing.T) {
	calls := 0
	failed := run(func(tb testing.TB) {
		Within(tb, time.Minute, time.Millisecond, "the third call", func() error {
			if calls++; calls < 3 {
				return errors.New("not yet")
			}
			return nil
		})
	})
	if failed != "" || calls != 3 {
		t.Fatalf("want success on the third call, got %d calls, failure %q", calls, failed)
	}
}

func TestUntilFailsWithTheLastError(t *testing.T) {
	calls := 0
	failed := run(func(tb testing.TB) {
		Within(tb, 20*time.Millisecond, time.Millisecond, "never", func() error {
			calls++
			return fmt.Errorf("attempt %d", calls)
		})
	})
	want := fmt.Sprintf("waiting for never: attempt %d (%v)", calls, context.DeadlineExceeded)
	if failed != want {
		t.Fatalf("got failure %q, want %q", failed, want)
	}
	if !strings.Contains(failed, "attempt") || calls < 2 {
		t.Fatalf("the check ran %d times", calls)
	}
}
