// Package version reports what this build of Cozy is and which upstream
// versions it installs by default.
//
// Version and Commit are set at link time by the Makefile
// (-X cozy.dev/cozy/internal/version.Version=...). The Talos and Kubernetes
// versions are read from the pinned Talos machinery module, so they change
// only when go.mod does.
package version

import (
	"runtime"
	"strings"

	"github.com/siderolabs/talos/pkg/machinery/constants"
	"github.com/siderolabs/talos/pkg/machinery/gendata"
)

// Set by the linker; the defaults describe a plain `go build`.
var (
	Version = "dev"
	Commit  = "unknown"
)

// Info is what `cozyctl version` prints.
type Info struct {
	Version   string `json:"version"`
	Commit    string `json:"commit"`
	GoVersion string `json:"goVersion"`
	Platform  string `json:"platform"`
	// TalosVersion is the Talos release whose machinery generates configs.
	TalosVersion string `json:"talosVersion"`
	// KubernetesVersion is the Kubernetes version new clusters get unless
	// the rack file says otherwise.
	KubernetesVersion string `json:"kubernetesVersion"`
}

// Get returns the version information of the running binary.
func Get() Info {
	return Info{
		Version:           Version,
		Commit:            Commit,
		GoVersion:         runtime.Version(),
		Platform:          runtime.GOOS + "/" + runtime.GOARCH,
		TalosVersion:      strings.TrimSpace(gendata.VersionTag),
		KubernetesVersion: "v" + constants.DefaultKubernetesVersion,
	}
}
