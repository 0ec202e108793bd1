package cli

import (
	"github.com/spf13/cobra"

	"cozy.dev/cozy/internal/version"
)

func newVersionCommand(g *Globals) *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the cozyctl version and the Talos and Kubernetes versions it installs",
		Args:  cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			return g.Print(versionTable(version.Get()))
		},
	}
}

// versionTable shows version.Info as FIELD/VALUE rows; JSON and YAML use
// the struct's own tags.
type versionTable version.Info

func (v versionTable) Header() []string { return []string{"FIELD", "VALUE"} }

func (v versionTable) Rows() [][]string {
	return [][]string{
		{"Version", v.Version},
		{"Commit", v.Commit},
		{"Go", v.GoVersion},
		{"Platform", v.Platform},
		{"Talos", v.TalosVersion},
		{"Kubernetes", v.KubernetesVersion},
	}
}
