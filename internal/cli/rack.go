package cli

import (
	"errors"
	"fmt"
	"strconv"

	"github.com/spf13/cobra"

	"cozy.dev/cozy/bootstrap/rack"
	"cozy.dev/cozy/internal/output"
)

func newRackCommand(g *Globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "rack",
		Short: "Write and check rack files",
	}
	cmd.AddCommand(newRackInitCommand(g), newRackValidateCommand(g))
	return cmd
}

func newRackInitCommand(g *Globals) *cobra.Command {
	name := "lab"
	cmd := &cobra.Command{
		Use:   "init",
		Short: "Print a complete, commented example rack file",
		Long: `Print a complete, commented example rack file to stdout. Every default is
written out (commented); edit the machines and networks and check the
result with 'cozyctl rack validate'.`,
		Example: "  cozyctl rack init --name prod > rack.yaml",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			data, err := rack.Example(name)
			if err != nil {
				return err
			}
			_, err = g.stdout.Write(data)
			return err
		},
	}
	cmd.Flags().StringVar(&name, "name", name, "the cluster's name")
	return cmd
}

// rackReport is what `rack validate` prints.
type rackReport struct {
	File     string         `json:"file"`
	Valid    bool           `json:"valid"`
	Problems []rack.Problem `json:"problems,omitempty"`
	// Summary of a valid rack.
	Cluster       string `json:"cluster,omitempty"`
	ControlPlanes int    `json:"controlPlanes,omitempty"`
	Workers       int    `json:"workers,omitempty"`
	Talos         string `json:"talosVersion,omitempty"`
	Kubernetes    string `json:"kubernetesVersion,omitempty"`
	Endpoint      string `json:"endpoint,omitempty"`
}

func (r rackReport) Header() []string {
	if r.Valid {
		return []string{"FILE", "CLUSTER", "CONTROL PLANES", "WORKERS", "TALOS", "KUBERNETES", "ENDPOINT"}
	}
	return []string{"LINE", "FIELD", "PROBLEM"}
}

func (r rackReport) Rows() [][]string {
	if r.Valid {
		return [][]string{{r.File, r.Cluster, strconv.Itoa(r.ControlPlanes), strconv.Itoa(r.Workers), r.Talos, r.Kubernetes, r.Endpoint}}
	}
	var rows [][]string
	for _, p := range r.Problems {
		line := "-"
		if p.Line > 0 {
			line = strconv.Itoa(p.Line)
		}
		rows = append(rows, []string{line, dash(p.Path), p.Message})
	}
	return rows
}

func newRackValidateCommand(g *Globals) *cobra.Command {
	return &cobra.Command{
		Use:   "validate FILE",
		Short: "Check a rack file and print every problem with its field and line",
		Long: `Check a rack file. A valid rack prints a one-line summary; an invalid one
prints every problem with its field path and line, and exits 1.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			r, err := rack.Load(args[0])
			var ps *rack.Problems
			switch {
			case errors.As(err, &ps):
				if err := g.Print(rackReport{File: args[0], Problems: ps.List}); err != nil {
					return err
				}
				return fmt.Errorf("%s is not a valid rack: %d problem(s)", args[0], len(ps.List))
			case err != nil:
				return err
			}
			return g.Print(rackReport{
				File: args[0], Valid: true, Cluster: r.Metadata.Name,
				ControlPlanes: len(r.ControlPlanes()), Workers: len(r.Workers()),
				Talos: r.Talos.Version, Kubernetes: r.Cluster.KubernetesVersion, Endpoint: r.Cluster.Endpoint,
			})
		},
	}
}

var _ output.Tabular = rackReport{}
