package bootstrap_test

import (
	"os"
	"testing"

	"cozy.dev/cozy/lab/talosnode"
)

// The test binary doubles as the emulated Talos node
// (COZY_TEST_RUN_TALOS_NODE=1), so nodes run as real processes inside the
// test's network namespace. No build tag on purpose: under any tags a
// re-executed binary must never run the tests again.
func TestMain(m *testing.M) {
	if os.Getenv("COZY_TEST_RUN_TALOS_NODE") == "1" {
		os.Exit(talosnode.Main(append(os.Args[1:], "--debug"), os.Stderr))
	}
	os.Exit(m.Run())
}
