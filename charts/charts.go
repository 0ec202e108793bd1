// Package charts holds Cozy's Helm charts, embedded so that cozyctl can
// render them without a checkout: platform (the Flux objects of the
// platform layer, rendered by `cozyctl platform render`), cozy-operator
// (installed by Flux from the rendered repository) and kubevirt-csi-node
// (installed into tenants by cozy-operator, from the same repository).
package charts

import "embed"

// FS holds one folder per chart.
//
//go:embed all:platform all:cozy-operator all:kubevirt-csi-node
var FS embed.FS

// Chart names, the folders of FS.
const (
	Platform        = "platform"
	CozyOperator    = "cozy-operator"
	KubevirtCSINode = "kubevirt-csi-node"
)

// InRepository are the charts `cozyctl platform render` writes into the
// platform's Git repository (under charts/), for Flux to install from
// there.
var InRepository = []string{CozyOperator, KubevirtCSINode}
