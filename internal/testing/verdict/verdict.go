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
	"strconv"
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
	Report(name, show(format, got, goal), "≥ "+fmt.Sprintf(format, goal), got >= goal)
}

// AtMost states a goal of got ≤ goal, both printed with format.
func AtMost(name string, got, goal float64, format string) {
	Report(name, show(format, got, goal), "≤ "+fmt.Sprintf(format, goal), got <= goal)
}

// show prints got with format, or with as many more decimals as it takes
// to tell it from goal when format would print both alike: a miss by
// 0.004 must not read "MISS: 0.90 vs ≥ 0.90".
func show(format string, got, goal float64) string {
	s := fmt.Sprintf(format, got)
	if got == goal || s != fmt.Sprintf(format, goal) {
		return s
	}
	for prec := 0; prec < 10; prec++ {
		if s := strconv.FormatFloat(got, 'f', prec, 64); s != strconv.FormatFloat(goal, 'f', prec, 64) {
			return s
		}
	}
	return strconv.FormatFloat(got, 'g', -1, 64)
}
