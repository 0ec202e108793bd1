package lab_test

import (
	"os"
	"testing"

	"cozy.dev/cozy/internal/cli"
)

// The test binary doubles as cozyctl (COZY_TEST_RUN_CLI=1): the lab runs
// `cozyctl bootstrap` inside its namespace. No build tag on purpose: under
// any tags a re-executed binary must never run the tests again.
func TestMain(m *testing.M) {
	if os.Getenv("COZY_TEST_RUN_CLI") == "1" {
		os.Exit(cli.Execute(os.Args[1:], os.Stdout, os.Stderr))
	}
	os.Exit(m.Run())
}
