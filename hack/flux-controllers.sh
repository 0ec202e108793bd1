#!/usr/bin/env bash
# Builds Flux's source-controller, kustomize-controller and helm-controller
# from the Go module proxy (no release images or binaries are reachable
# here) for the platform's reconcile test and their images
# (hack/platform-images.sh), writes their install manifests beside them
# (install.yaml, from the modules' config/), and prints the directory that
# holds them (use it as COZY_FLUX_BIN).
#
#   hack/flux-controllers.sh
#
# Versions are the ones DESIGN.md pins, whose CRDs the platform tests load
# and whose APIs the Flux API modules in go.mod match. Each controller is
# built in its own wrapper module that requires the upstream module, carries
# the upstream go.mod's replace lines that point at published versions, and
# maps the upstream `api => ./api` replace to the published api module.
# The result is cached in $COZY_CACHE_DIR/flux/<versions>; a cached build
# returns at once, and binaries are built in a temporary directory and
# renamed into place, so an interrupted build never leaves a half-written
# cache. Only the directory goes to stdout; progress goes to stderr.
set -euo pipefail

source_version=v1.9.6
kustomize_version=v1.9.6
helm_version=v1.6.4

cache_root="${COZY_CACHE_DIR:-${HOME:-/root}/.cache/cozy}"
out="$cache_root/flux/source-${source_version}_kustomize-${kustomize_version}_helm-${helm_version}"

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
log() { echo "flux-controllers: $*" >&2; }

runs() { [[ -x "$out/$1" ]] && "$out/$1" --help >/dev/null 2>&1; }
have() { runs source-controller && runs kustomize-controller && runs helm-controller; }

# manifests writes $out/install.yaml, the controllers' install manifests
# kustomized from their modules' config/ as a release's install.yaml is
# (hack/fluxmanifests), for `platform install --flux-manifests` where the
# release cannot be downloaded (the lab).
manifests() {
	[[ -f "$out/install.yaml" ]] && return
	local tmpmod nv dir args=()
	tmpmod="$(mktemp -d)"
	printf 'module x\n' >"$tmpmod/go.mod"
	for nv in "source-controller@$source_version" "kustomize-controller@$kustomize_version" "helm-controller@$helm_version"; do
		dir="$(cd "$tmpmod" && GOFLAGS=-mod=mod go mod download -json "github.com/fluxcd/$nv" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')"
		[[ -d $dir ]] || { log "cannot download github.com/fluxcd/$nv"; rm -rf "$tmpmod"; exit 1; }
		args+=("$nv=$dir")
	done
	rm -rf "$tmpmod"
	(cd "$repo" && GOFLAGS=-buildvcs=false go run ./hack/fluxmanifests -o "$out/install.yaml" "${args[@]}" >&2)
}

if have; then
	manifests
	echo "$out"
	exit 0
fi

export GOTOOLCHAIN=local GOFLAGS=-mod=mod CGO_ENABLED=0
mkdir -p "$out"
work="$(mktemp -d "$cache_root/flux/.build.XXXXXX")"
trap 'rm -rf "$work"' EXIT

# build NAME VERSION [EXTRA_REPLACE...]
build() {
	local name="$1" version="$2"
	shift 2
	local module="github.com/fluxcd/$name" mod="$work/$name"
	mkdir -p "$mod"
	log "building $name $version (a few minutes cold on 2 cores)"
	local gomod
	gomod="$(cd "$mod" && printf 'module x\n' >go.mod && go mod download -json "$module@$version" |
		sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",$/\1/p')"
	[[ -f "$gomod" ]] || { log "cannot download $module@$version"; exit 1; }
	{
		echo "module cozy.dev/tools/$name"
		echo
		echo "go 1.26"
		echo
		echo "require ("
		echo "	$module $version"
		echo "	$module/api $version"
		echo ")"
		echo
		# Upstream replaces that name a published version; `./api` is the
		# api module required above.
		go mod edit -json "$gomod" |
			jq -r '.Replace[]? | select(.New.Version != null) |
				"replace \(.Old.Path)\(if .Old.Version then " " + .Old.Version else "" end) => \(.New.Path) \(.New.Version)"'
		local r
		for r in "$@"; do echo "replace $r"; done
	} >"$mod/go.mod"
	printf '//go:build tools\n\npackage tools\n\nimport _ "%s"\n' "$module" >"$mod/tools.go"
	(cd "$mod" && go mod tidy -e >&2)
	(cd "$mod" && go build -trimpath -ldflags "-s -w" -o "$work/$name.bin" "$module" >&2)
	install -m 0755 "$work/$name.bin" "$out/.$name.tmp"
	mv -f "$out/.$name.tmp" "$out/$name"
}

# pkg/artifact v0.18.3, which source-controller v1.9.6 asks for, is refused
# by the proxy; v0.18.0 has the same API.
runs source-controller || build source-controller "$source_version" \
	"github.com/fluxcd/pkg/artifact => github.com/fluxcd/pkg/artifact v0.18.0"
runs kustomize-controller || build kustomize-controller "$kustomize_version"
runs helm-controller || build helm-controller "$helm_version"

have || { log "built controllers in $out do not run"; exit 1; }
manifests
echo "$out"
