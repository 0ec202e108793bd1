package cli

import (
	"errors"
	"fmt"
	"os"

	"github.com/spf13/cobra"

	"cozy.dev/cozy/bootstrap/rack"
	"cozy.dev/cozy/internal/output"
	"cozy.dev/cozy/platform/render"
)

func newPlatformCommand(g *Globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "platform",
		Short: "Render the Flux-reconciled platform layer for a rack",
	}
	cmd.AddCommand(newPlatformRenderCommand(g))
	return cmd
}

// renderTable lists the files `platform render` wrote.
type renderTable struct {
	Dir   string   `json:"dir"`
	Files []string `json:"files"`
}

func (t renderTable) Header() []string { return []string{"FILE"} }

func (t renderTable) Rows() [][]string {
	rows := make([][]string, 0, len(t.Files))
	for _, f := range t.Files {
		rows = append(rows, []string{f})
	}
	return rows
}

var _ output.Tabular = renderTable{}

func newPlatformRenderCommand(g *Globals) *cobra.Command {
	var rackFile, out string
	var check bool
	cmd := &cobra.Command{
		Use:   "render",
		Short: "Write the Git layout Flux reconciles for the rack's cluster",
		Long: `Render the platform for the rack's cluster into OUT: the Flux objects of
every component in OUT/<platform.git.path> (clusters/<name> by default),
with the values derived from the rack in its values.yaml, and Cozy's own
charts the layout installs in OUT/charts/. Commit OUT to the repository
Flux reads. The output depends only on the rack and this cozyctl: render
again after changing the rack, and review the diff.

With --check nothing is written: the command fails if OUT does not hold
exactly what it would write.`,
		Example: `  cozyctl platform render --rack rack.yaml --out ~/src/platform-repo
  cozyctl platform render --rack rack.yaml --out . --check`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			r, err := rack.Load(rackFile)
			if err != nil {
				return err
			}
			layout, err := render.Render(r)
			if err != nil {
				return fmt.Errorf("render the platform for %s: %w", rackFile, err)
			}
			if check {
				diff, err := layout.Diff(out)
				if err != nil {
					return err
				}
				if len(diff) > 0 {
					for _, d := range diff {
						fmt.Fprintln(g.stderr, d)
					}
					return fmt.Errorf("%s is not what the rack renders (%d file(s)); run cozyctl platform render without --check", out, len(diff))
				}
				g.Logger().Info("layout is up to date", "dir", out)
				return nil
			}
			if fi, err := os.Stat(out); err == nil && !fi.IsDir() {
				return fmt.Errorf("--out %s is a file, not a folder", out)
			} else if err != nil && !errors.Is(err, os.ErrNotExist) {
				return err
			}
			if err := layout.Write(out); err != nil {
				return err
			}
			return g.Print(renderTable{Dir: out, Files: layout.Paths()})
		},
	}
	cmd.Flags().StringVar(&rackFile, "rack", "", "the rack file")
	cmd.Flags().StringVar(&out, "out", "", "root of the Git repository to write into")
	cmd.Flags().BoolVar(&check, "check", false, "write nothing; fail if --out differs from the rendering")
	_ = cmd.MarkFlagRequired("rack")
	_ = cmd.MarkFlagRequired("out")
	_ = cmd.MarkFlagFilename("rack", "yaml", "yml")
	_ = cmd.MarkFlagDirname("out")
	return cmd
}
