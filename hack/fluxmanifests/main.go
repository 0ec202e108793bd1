// Command fluxmanifests writes the install manifests of Flux's
// controllers, built from their Go modules (platform/flux.ModuleManifests),
// for sites where the release's install.yaml cannot be downloaded, such
// as the lab. hack/flux-controllers.sh runs it beside the binaries it
// builds:
//
//	fluxmanifests -o install.yaml NAME@VERSION=MODULE_DIR...
package main

import (
	"flag"
	"fmt"
	"os"
	"strings"

	"cozy.dev/cozy/platform/flux"
)

func main() {
	out := flag.String("o", "", "file to write (required)")
	flag.Parse()
	if err := run(*out, flag.Args()); err != nil {
		fmt.Fprintln(os.Stderr, "fluxmanifests:", err)
		os.Exit(1)
	}
}

func run(out string, args []string) error {
	if out == "" || len(args) == 0 {
		return fmt.Errorf("usage: fluxmanifests -o FILE NAME@VERSION=DIR [NAME@VERSION=DIR ...]")
	}
	var cs []flux.ModuleController
	for _, a := range args {
		nv, dir, ok := strings.Cut(a, "=")
		name, version, ok2 := strings.Cut(nv, "@")
		if !ok || !ok2 || name == "" || version == "" || dir == "" {
			return fmt.Errorf("%q is not NAME@VERSION=DIR", a)
		}
		if _, err := os.Stat(dir); err != nil {
			return err
		}
		cs = append(cs, flux.ModuleController{Name: name, Version: version, Dir: dir})
	}
	data, err := flux.ModuleManifests(cs)
	if err != nil {
		return err
	}
	// Renamed into place: a reader never sees half a file.
	tmp := out + ".tmp"
	if err := os.WriteFile(tmp, data, 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, out)
}
