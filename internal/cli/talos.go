package cli

import (
	"sort"

	"github.com/spf13/cobra"

	"cozy.dev/cozy/bootstrap/rack"
	"cozy.dev/cozy/bootstrap/talosconfig"
)

func newTalosCommand(g *Globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "talos",
		Short: "Generate Talos secrets, machine configs and talosconfig for a rack",
	}
	cmd.AddCommand(newTalosGenCommand(g))
	return cmd
}

// genTable lists the files `talos gen` wrote.
type genTable struct{ *talosconfig.Written }

func (t genTable) Header() []string { return []string{"FILE", "WHAT"} }

func (t genTable) Rows() [][]string {
	secrets := "secrets bundle (kept: it already existed)"
	if t.SecretsCreated {
		secrets = "secrets bundle (new: back it up)"
	}
	rows := [][]string{{t.Dir + "/" + talosconfig.SecretsFile, secrets}}
	hosts := make([]string, 0, len(t.Configs))
	for h := range t.Configs {
		hosts = append(hosts, h)
	}
	sort.Strings(hosts)
	for _, h := range hosts {
		rows = append(rows, []string{t.Configs[h], "machine config of " + h})
	}
	rows = append(rows, []string{t.Talosconfig, "talosconfig (admin client)"})
	if t.Schematic != "" {
		rows = append(rows, []string{t.Schematic, "Image Factory schematic " + t.SchematicID})
	}
	return rows
}

func newTalosGenCommand(g *Globals) *cobra.Command {
	var rackFile, out string
	cmd := &cobra.Command{
		Use:   "gen",
		Short: "Write secrets.yaml, talosconfig and one machine config per machine",
		Long: `Generate the rack's Talos secrets bundle, machine configs and talosconfig
with Talos's own machinery. secrets.yaml is generated once and reused
afterwards: it holds the cluster's CAs, so back it up. Every file is 0600.
Each machine config is named by hostname and validated for bare metal.`,
		Example: "  cozyctl talos gen --rack rack.yaml --out _out",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			r, err := rack.Load(rackFile)
			if err != nil {
				return err
			}
			w, err := talosconfig.Write(r, out)
			if err != nil {
				return err
			}
			return g.Print(genTable{w})
		},
	}
	cmd.Flags().StringVar(&rackFile, "rack", "", "the rack file")
	cmd.Flags().StringVar(&out, "out", "", "directory to write into (created 0700 if missing)")
	_ = cmd.MarkFlagRequired("rack")
	_ = cmd.MarkFlagRequired("out")
	_ = cmd.MarkFlagFilename("rack", "yaml", "yml")
	_ = cmd.MarkFlagDirname("out")
	return cmd
}
