// Package charts holds Cozy's Helm charts, embedded so that cozyctl can
// render them without a checkout: platform (the Flux objects of the
// platform layer, rendered by `cozyctl platform render`) and cozy-operator
// (installed by Flux from the rendered repository).
package charts

import "embed"

// FS holds one folder per chart: platform/ and cozy-operator/.
//
//go:embed all:platform all:cozy-operator
var FS embed.FS

// Chart names, the folders of FS.
const (
	Platform     = "platform"
	CozyOperator = "cozy-operator"
)
