package cli

import (
	"errors"
	"fmt"
	"path/filepath"
	"strconv"

	"github.com/spf13/cobra"

	"cozy.dev/cozy/bmc"
	"cozy.dev/cozy/bootstrap/power"
	"cozy.dev/cozy/bootstrap/rack"
	"cozy.dev/cozy/bootstrap/rackapi"
	"cozy.dev/cozy/bootstrap/upgrade"
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
	var (
		fromBMC       []string
		bmcCreds      rack.BMC
		controlPlanes int
		opts          power.Options
	)
	cmd := &cobra.Command{
		Use:   "init",
		Short: "Print a complete, commented example rack file, or one of the machines behind BMCs",
		Long: `Print a complete, commented example rack file to stdout. Every default is
written out (commented); edit the machines and networks and check the
result with 'cozyctl rack validate'.

With --from-bmc, the machines are those behind the BMCs given (Redfish
addresses, one machine each, all with the account in --bmc-credentials):
each machine's SMBIOS UUID, the MAC of its first NIC with a link, its BMC,
and as comments every NIC and disk the BMC reports. The first
--controlplanes are control planes (cp1..), the rest workers (w1..).
Check each mac (the NIC it netboots from) and install disk: a BMC cannot
tell which.`,
		Example: `  cozyctl rack init --name prod > rack.yaml
  cozyctl rack init --name prod --bmc-credentials bmc.yaml --bmc-insecure \
      --from-bmc redfish+https://10.0.0.11,redfish+https://10.0.0.12,redfish+https://10.0.0.13 > rack.yaml`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var found []rack.FoundMachine
			if len(fromBMC) > 0 {
				opts.Log = g.Logger()
				var rows []power.Row
				var err error
				found, rows, err = power.Discover(cmd.Context(), fromBMC, bmcCreds, controlPlanes, opts)
				for _, r := range rows {
					if r.Error != "" {
						fmt.Fprintf(g.stderr, "%s: %s\n", r.BMC, r.Error)
					}
				}
				if err != nil {
					return fmt.Errorf("--from-bmc: %w: no rack written", err)
				}
			}
			data, err := rack.ExampleWith(name, found)
			if err != nil {
				return err
			}
			_, err = g.stdout.Write(data)
			return err
		},
	}
	f := cmd.Flags()
	f.StringVar(&name, "name", name, "the cluster's name")
	f.StringSliceVar(&fromBMC, "from-bmc", nil, "BMC addresses (redfish+https://HOST[:PORT][/redfish/v1/Systems/ID]) whose machines make the rack")
	f.StringVar(&bmcCreds.CredentialsFile, "bmc-credentials", "", "the BMCs' account: YAML with username and password, mode 0600 (written into the rack as given)")
	f.BoolVar(&bmcCreds.InsecureSkipVerify, "bmc-insecure", false, "accept the BMCs' self-signed TLS certificates (written into the rack)")
	f.IntVar(&controlPlanes, "controlplanes", 0, "how many of the machines are control planes (default 3 with at least 3 BMCs, else 1)")
	f.DurationVar(&opts.Timeout, "timeout", bmc.DefaultTimeout, "bound on each request to a BMC")
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
	var (
		against  bool
		stateDir string
	)
	cmd := &cobra.Command{
		Use:   "validate FILE",
		Short: "Check a rack file and print every problem with its field and line",
		Long: `Check a rack file. A valid rack prints a one-line summary; an invalid one
prints every problem with its field path and line, and exits 1.

With --against-cluster it also reads what the bootstrapped rack's nodes run
(through the bootstrap's state dir) and refuses what the upgrades would: a
talos.version or cluster.kubernetesVersion older than a node runs, or more
than one minor version ahead of it; and a node that does not answer.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			r, err := rack.Load(args[0])
			if err == nil {
				// The BMC secrets too: what `bootstrap` and `machine` will read.
				if ps := r.CheckBMCCredentials(); len(ps) > 0 {
					err = &rack.Problems{File: filepath.Base(args[0]), List: ps}
				}
			}
			if err == nil && against {
				ra, oerr := rackapi.Open(r, defaultStateDir(stateDir, args[0], r), 0)
				if oerr != nil {
					return fmt.Errorf("--against-cluster: %w", oerr)
				}
				if ps := upgrade.Running(cmd.Context(), ra); len(ps) > 0 {
					err = &rack.Problems{File: filepath.Base(args[0]), List: ps}
				}
			}
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
	cmd.Flags().BoolVar(&against, "against-cluster", false, "also compare the rack's versions with what its bootstrapped nodes run")
	cmd.Flags().StringVar(&stateDir, "state-dir", "", "the bootstrap's state dir, for --against-cluster (default: <rack dir>/<cluster name>)")
	return cmd
}

var _ output.Tabular = rackReport{}
