// Package verdict states a benchmark's result against its goal, one line
// per goal, in a form `make bench` gathers into its closing table
// (hack/bench.sh):
//
//	verdict | DHCP leases/s without loss, cozy / Kea | 1.62 | ≥ 1.50 | PASS
//	verdict | HTTP boot fan-out, cozy / nginx | 0.85 | ≥ 0.90 | MISS: 0.85 vs ≥ 0.90
package verdict

import (
	"fmt"
	"io"
	"os"
	"strings"
)

// Out is where verdicts go: standard output, where `go test -v` passes
// them through unindented.
var Out io.Writer = os.Stdout

// Prefix starts every verdict line.
const Prefix = "verdict | "

// Report states one goal: what was measured, the goal, and whether it was
// met.
func Report(name, measured, goal string, met bool) {
	v := "PASS"
	if !met {
		v = "MISS: " + measured + " vs " + goal
	}
	clean := func(s string) string { return strings.ReplaceAll(s, "|", "/") }
	fmt.Fprintf(Out, "%s%s | %s | %s | %s\n", Prefix, clean(name), clean(measured), clean(goal), clean(v))
}

// AtLeast states a goal of got ≥ goal, both printed with format.
func AtLeast(name string, got, goal float64, format string) {
	Report(name, fmt.Sprintf(format, got), "≥ "+fmt.Sprintf(format, goal), got >= goal)
}

// AtMost states a goal of got ≤ goal, both printed with format.
func AtMost(name string, got, goal float64, format string) {
	Report(name, fmt.Sprintf(format, got), "≤ "+fmt.Sprintf(format, goal), got <= goal)
}
