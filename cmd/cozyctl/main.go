// Command cozyctl is Cozy's command-line tool: netboot, bootstrap, platform
// and lab. The command tree lives in cozy.dev/cozy/internal/cli.
package main

import (
	"os"

	"github.com/go-logr/logr"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"cozy.dev/cozy/internal/cli"
)

func main() {
	// cozyctl reports through its own log; controller-runtime's client,
	// which it uses to read the cluster, would otherwise print a stack
	// trace about a logger never set, 30 s into a long command (lab up).
	ctrllog.SetLogger(logr.Discard())
	os.Exit(cli.Execute(os.Args[1:], os.Stdout, os.Stderr))
}
