#!/usr/bin/env bash
# Builds, from source, the images of the platform components Cozy can
# build here, under their exact upstream names and tags, into one OCI
# image layout (as hack/lab-images.sh does for the nodes' images), for
# `cozyctl images mirror --from DIR` to push into a registry the cluster
# pulls from. Nothing is pulled: the binaries come from the Go module
# proxy, the CA bundle from Debian's ca-certificates.
#
#   hack/platform-images.sh
#
#   ghcr.io/fluxcd/source-controller:v1.9.6     the binaries hack/flux-controllers.sh builds
#   ghcr.io/fluxcd/kustomize-controller:v1.9.6
#   ghcr.io/fluxcd/helm-controller:v1.6.4
#   quay.io/metallb/controller:v0.15.2          go.universe.tf/metallb controller, CGO_ENABLED=0
#   quay.io/metallb/speaker:v0.15.2             go.universe.tf/metallb speaker (native L2 mode)
#
# Which other components' images cannot be built here, and why:
# docs/images.md.
#
# The layout is cached in $COZY_CACHE_DIR/platform-images/<key>, the key
# naming every version, ca-certificates' version and a hash of the Go
# version and of the code that packs the images; built in a temporary
# directory and renamed into place, so an interrupted build never leaves
# a half-written one.
#
# Measured on 2 cores (2026-12-04): MetalLB's two binaries take about a
# minute with the Go build cache warm from Cozy's own build (they share
# client-go and controller-runtime); the Flux binaries are
# hack/flux-controllers.sh's, built once for the tests.
#
# Only the directory goes to stdout; progress goes to stderr.
set -euo pipefail

metallb_version=v0.15.2 # the platform's pin (charts/platform/values.yaml versions.metallb)

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
[[ -f "$repo/hack/platformimages/main.go" ]] || { echo "platform-images: run it from a Cozy source tree" >&2; exit 1; }
# shellcheck source=hack/debroot.sh
source "$repo/hack/debroot.sh"
cache_root="${COZY_CACHE_DIR:-${HOME:-/root}/.cache/cozy}"
(($# == 0)) || { echo "usage: hack/platform-images.sh (prints the layout's directory)" >&2; exit 2; }

log() { echo "platform-images: $*" >&2; }
die() { log "$*"; exit 1; }

for tool in go apt-get apt-cache dpkg-deb sha256sum; do
	command -v "$tool" >/dev/null || die "$tool is not installed (see hack/install-deps.sh)"
done

# The Flux controllers' versions are hack/flux-controllers.sh's.
eval "$(sed -n 's/^\(source_version\|kustomize_version\|helm_version\)=\(v[0-9.]*\)$/\1=\2/p' "$repo/hack/flux-controllers.sh")"
[[ -n ${source_version:-} && -n ${kustomize_version:-} && -n ${helm_version:-} ]] || die "cannot read the Flux versions from hack/flux-controllers.sh"

ca_deb="$(apt-cache policy ca-certificates | awk '/^  Candidate:/ { print $2 }')"
[[ -n $ca_deb && $ca_deb != "(none)" ]] || die "no candidate for ca-certificates: run apt-get update"
build_hash="$(cd "$repo" && {
	go env GOVERSION
	cat hack/platform-images.sh hack/debroot.sh hack/flux-controllers.sh hack/platformimages/main.go
	ls internal/ociimage/*.go | grep -v _test.go | xargs cat
} | sha256sum | cut -c1-12)"
key="flux-${source_version}-${kustomize_version}-${helm_version}_metallb-${metallb_version}_ca-${ca_deb}_build-${build_hash}"
out="$cache_root/platform-images/$key"

if [[ -f "$out/index.json" ]]; then
	echo "$out"
	exit 0
fi

flux_bin="$("$repo/hack/flux-controllers.sh")"
mkdir -p "$cache_root/platform-images"
work="$(mktemp -d "$cache_root/platform-images/.build.XXXXXX")"
trap 'rm -rf "$work"' EXIT
export GOTOOLCHAIN=local

log "MetalLB $metallb_version: controller and speaker"
mod="$work/metallb"
mkdir -p "$mod"
printf 'module cozy.dev/tools/metallb\n\ngo 1.26\n\nrequire go.universe.tf/metallb %s\n' "$metallb_version" >"$mod/go.mod"
printf '//go:build tools\n\npackage tools\n\nimport (\n\t_ "go.universe.tf/metallb/controller"\n\t_ "go.universe.tf/metallb/speaker"\n)\n' >"$mod/tools.go"
(cd "$mod" && GOFLAGS=-mod=mod go mod tidy -e >&2)
# Upstream's Dockerfiles: CGO_ENABLED=0, the commit and branch in
# internal/version (the version itself is in the source).
for c in controller speaker; do
	(cd "$mod" && CGO_ENABLED=0 GOFLAGS=-mod=mod go build -trimpath -o "$work/$c" \
		-ldflags "-s -w -X go.universe.tf/metallb/internal/version.gitCommit=$metallb_version -X go.universe.tf/metallb/internal/version.gitBranch=$metallb_version" \
		"go.universe.tf/metallb/$c" >&2)
done

log "Debian ca-certificates $ca_deb"
debroot "$work" "ca-certificates=$ca_deb"

log "packing the images"
(cd "$repo" && go build -o "$work/platformimages" ./hack/platformimages)
"$work/platformimages" -o "$work/layout" -debs "$work/debroot" \
	-flux "$flux_bin" -flux-tags "source-controller=$source_version,kustomize-controller=$kustomize_version,helm-controller=$helm_version" \
	-metallb-controller "$work/controller" -metallb-speaker "$work/speaker" -metallb-tag "$metallb_version"
chmod 0755 "$work/layout"
mv -T "$work/layout" "$out" 2>/dev/null || [[ -f "$out/index.json" ]] || die "cannot move the layout to $out"
echo "$out"
