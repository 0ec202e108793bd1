package pxe_test

import (
	"os"
	"testing"

	"cozy.dev/cozy/internal/cli"
)

// The test binary doubles as cozyctl, so servers under test run as real
// processes inside their namespaces: `ip netns exec NS <test binary> pxe
// serve`. This file has no build tag on purpose: under any set of tags the
// re-executed binary must be cozyctl, never the tests again (which would
// start servers that start tests, without end).
func TestMain(m *testing.M) {
	if os.Getenv("COZY_TEST_RUN_CLI") == "1" {
		os.Exit(cli.Execute(os.Args[1:], os.Stdout, os.Stderr))
	}
	os.Exit(m.Run())
}
