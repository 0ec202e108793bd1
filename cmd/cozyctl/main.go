// Command cozyctl is Cozy's command-line tool: netboot, bootstrap, platform
// and lab. The command tree lives in cozy.dev/cozy/internal/cli.
package main

import (
	"os"

	"cozy.dev/cozy/internal/cli"
)

func main() {
	os.Exit(cli.Execute(os.Args[1:], os.Stdout, os.Stderr))
}
