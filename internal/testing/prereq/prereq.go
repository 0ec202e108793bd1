// Package prereq decides what a test does when something it needs from the
// machine (envtest binaries, QEMU, root) is missing: under CI=true it fails,
// so CI can never pass by silently skipping; elsewhere it skips with a
// message that says how to get the missing piece.
package prereq

import (
	"fmt"
	"os"
	"testing"
)

// InCI reports whether the tests run under CI (CI=true, as .ci/run sets).
func InCI() bool { return os.Getenv("CI") == "true" }

// Missing stops the test because a prerequisite is missing.
func Missing(t testing.TB, format string, args ...any) {
	t.Helper()
	msg := fmt.Sprintf(format, args...)
	if InCI() {
		t.Fatalf("missing prerequisite (CI=true, so this fails instead of skipping): %s", msg)
		return
	}
	t.Skipf("missing prerequisite: %s", msg)
}
