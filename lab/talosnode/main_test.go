package talosnode_test

import (
	"os"
	"testing"

	"cozy.dev/cozy/lab/talosnode"
)

// runNodeEnv makes the test binary run as cozy-talos-node, with the same
// flags, so tests can kill a node's process outright.
const runNodeEnv = "COZY_TEST_RUN_TALOS_NODE"

func TestMain(m *testing.M) {
	if os.Getenv(runNodeEnv) == "1" {
		os.Exit(talosnode.Main(append(os.Args[1:], "--debug"), os.Stderr))
	}
	os.Exit(m.Run())
}
