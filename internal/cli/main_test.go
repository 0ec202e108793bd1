package cli

import (
	"os"
	"testing"
)

// The test binary doubles as cozyctl, so servers under test run as real
// processes that get real signals: `<test binary> registry serve` with
// COZY_TEST_RUN_CLI=1. No build tag on purpose (see pxe/main_test.go).
func TestMain(m *testing.M) {
	if os.Getenv("COZY_TEST_RUN_CLI") == "1" {
		os.Exit(Execute(os.Args[1:], os.Stdout, os.Stderr))
	}
	os.Exit(m.Run())
}
