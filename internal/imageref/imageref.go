// Package imageref reads container image references the way containerd
// and Docker do, writes them in one canonical form (registry host always
// given, docker.io's implicit library/ spelt out, a tag always present
// unless the reference is by digest), and names an image inside a mirror
// registry.
//
// The mirror naming is the one contract between `cozyctl images mirror`,
// which pushes, and the Talos mirror settings that `registries.mirror`
// expands to, which pull: HOST/REPO:TAG is stored as MIRROR/HOST/REPO:TAG,
// so two upstream registries never collide, and containerd reaches it
// through the endpoint http(s)://MIRROR/v2/HOST with overridePath.
package imageref

import (
	"errors"
	"fmt"
	"net/url"
	"strings"

	"github.com/distribution/reference"
)

// Ref is an image reference in canonical form.
type Ref struct {
	// Host is the registry's host[:port]: docker.io, registry.k8s.io.
	Host string
	// Repository is the path inside the registry: library/alpine,
	// pause, siderolabs/flannel.
	Repository string
	// Tag is the tag; "latest" when the reference gave neither a tag
	// nor a digest.
	Tag string
	// Digest pins the content (sha256:...); a pulled reference with
	// both is fetched by digest.
	Digest string
}

// Parse reads a reference as containerd does: alpine is
// docker.io/library/alpine:latest.
func Parse(s string) (Ref, error) {
	if s == "" {
		return Ref{}, errors.New("empty image reference")
	}
	if strings.TrimSpace(s) != s {
		return Ref{}, fmt.Errorf("image reference %q has surrounding spaces", s)
	}
	named, err := reference.ParseNormalizedNamed(s)
	if err != nil {
		return Ref{}, fmt.Errorf("%q is not an image reference: %w", s, err)
	}
	r := Ref{Host: reference.Domain(named), Repository: reference.Path(named)}
	if strings.ToLower(r.Host) != r.Host {
		// Docker reads an upper-case first component as a host; Cozy
		// names hosts in lower case only, as mirror paths must be.
		return Ref{}, fmt.Errorf("%q: write the registry host %q in lower case", s, r.Host)
	}
	if t, ok := named.(reference.Tagged); ok {
		r.Tag = t.Tag()
	}
	if d, ok := named.(reference.Digested); ok {
		r.Digest = d.Digest().String()
	}
	if r.Tag == "" && r.Digest == "" {
		r.Tag = "latest"
	}
	return r, nil
}

// Name is HOST/REPOSITORY.
func (r Ref) Name() string { return r.Host + "/" + r.Repository }

// String is the canonical form: HOST/REPOSITORY:TAG, HOST/REPOSITORY@DIGEST
// or HOST/REPOSITORY:TAG@DIGEST.
func (r Ref) String() string {
	s := r.Name()
	if r.Tag != "" {
		s += ":" + r.Tag
	}
	if r.Digest != "" {
		s += "@" + r.Digest
	}
	return s
}

// In names the image inside the mirror registry at host[:port] mirror:
// registry.k8s.io/pause:3.10.1 in 10.0.0.1:5000 is
// 10.0.0.1:5000/registry.k8s.io/pause:3.10.1. Upstream hosts with a port
// cannot be named this way (a repository path has no ':').
func (r Ref) In(mirror string) (Ref, error) {
	m := Ref{Host: mirror, Repository: r.Host + "/" + r.Repository, Tag: r.Tag, Digest: r.Digest}
	back, err := Parse(m.String())
	if err != nil || back != m {
		return Ref{}, fmt.Errorf("%s cannot be named in the mirror %s as %s: not a valid repository path (an upstream host with a port?)", r, mirror, m)
	}
	return m, nil
}

// WorkerImage is the repository of Cozy's tenant worker disks, one tag per
// Kubernetes version: `cozyctl tenant image build` names them so, `cozyctl
// images mirror` pushes them under MIRROR/cozy.dev/tenant-worker, and the
// platform points cozy-operator there.
const WorkerImage = "cozy.dev/tenant-worker"

// MirrorHosts are what a registries.mirror URL covers whatever the rack:
// the registries Kubernetes, Talos and the platform pull from. Hosts of other
// images a rack names are added where the images are known.
var MirrorHosts = []string{"docker.io", "ghcr.io", "quay.io", "registry.k8s.io"}

// IsMirrorURL says whether s is a registry mirror's base URL, as
// registries.mirror takes it: http or https, a host, no path (but "/"),
// query, fragment or user; the images are under /v2/<upstream host>/.
func IsMirrorURL(s string) bool {
	u, err := url.Parse(s)
	return err == nil && (u.Scheme == "http" || u.Scheme == "https") && u.Host != "" && u.Hostname() != "" &&
		(u.Path == "" || u.Path == "/") && u.RawQuery == "" && u.Fragment == "" && u.User == nil
}

// IsEndpointURL says whether s is a mirror endpoint as
// registries.mirrors takes it: http or https and a host; a path is kept
// (containerd and Talos add /v2/... after it).
func IsEndpointURL(s string) bool {
	u, err := url.Parse(s)
	return err == nil && (u.Scheme == "http" || u.Scheme == "https") && u.Host != "" && u.Hostname() != ""
}

// CheckRegistryHost says what is wrong with host as a key of
// registries.mirrors: a registry host such as docker.io or
// registry.local:5000 in lower case (Talos and containerd match hosts as
// written, so Docker.io would never be used), or "*" for every other
// registry. Each problem is one message; none: host is fine.
func CheckRegistryHost(host string) []string {
	if host == "*" {
		return nil
	}
	var problems []string
	if u, err := url.Parse("//" + host); host == "" || err != nil || u.Host != host || u.Hostname() == "" {
		problems = append(problems, fmt.Sprintf("%q is not a registry host such as docker.io or registry.local:5000", host))
	}
	if lower := strings.ToLower(host); lower != host {
		problems = append(problems, "write the registry host in lower case: "+lower)
	}
	return problems
}

// MirrorEndpoint is the URL containerd pulls host's images from, in the
// registry at mirrorURL (http(s)://HOST[:PORT]), with overridePath set:
// it already ends in /v2/HOST, so containerd adds nothing.
func MirrorEndpoint(mirrorURL, host string) string {
	return strings.TrimSuffix(mirrorURL, "/") + "/v2/" + host
}
