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
# and whose APIs the Flux API modules in go.mod match. The three are built
# together in one wrapper module that requires the upstream modules and
# their published api modules and carries the upstream go.mods' replace
# lines that point at published versions.
# The result is cached in $COZY_CACHE_DIR/flux/<versions>; a cached build
# returns at once, and binaries are built in a temporary directory and
# renamed into place, so an interrupted build never leaves a half-written
# cache. Only the directory goes to stdout; progress goes to stderr.
set -euo pipefail

source_version=v1.9.6
kustomize_version=v1.9.6
helm_version=v1.6.4

cache_root="${COZY_CACHE_DIR:-${HOME:-/root}/.cache/cozy}"
# "one-module": the build layout, so binaries built three modules apart
# (before 2026-12) are rebuilt once.
out="$cache_root/flux/one-module_source-${source_version}_kustomize-${kustomize_version}_helm-${helm_version}"

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

controllers=(
	"source-controller $source_version"
	"kustomize-controller $kustomize_version"
	"helm-controller $helm_version"
)

# upstream_gomod MODULE VERSION prints the path of the module's go.mod in the
# module cache.
upstream_gomod() {
	local gomod
	gomod="$(cd "$work" && go mod download -json "$1@$2" |
		sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",$/\1/p')"
	[[ -f "$gomod" ]] || { log "cannot download $1@$2"; exit 1; }
	echo "$gomod"
}

# merged_replaces prints the upstream go.mods' replace lines that name a
# published version (their `api => ./api` ones are the api modules required
# below). Where two controllers replace the same module with different
# versions (opencontainers/go-digest's pseudo-versions), the newer wins: one
# module graph has room for one version of each module.
merged_replaces() {
	local c name version
	for c in "${controllers[@]}"; do
		read -r name version <<<"$c"
		go mod edit -json "$(upstream_gomod "github.com/fluxcd/$name" "$version")" |
			jq -r '.Replace[]? | select(.New.Version != null) |
				"\(.Old.Path)\(if .Old.Version then " " + .Old.Version else "" end)\t\(.New.Path) \(.New.Version)"'
	done | sort -t $'\t' -k1,1 -k2,2V | awk -F '\t' '{ last[$1] = $2 } END { for (k in last) print "replace " k " => " last[k] }' | sort
}

# All three controllers are built in one wrapper module, so their shared
# dependencies (Kubernetes, controller-runtime, Helm, the cloud SDKs) are
# resolved once, at one version each, and compiled once: 608 s cold on 2
# cores against 1128 s for three wrapper modules, where kustomize-controller's
# older x/sys, grpc and zap recompiled the whole graph (docs/development.md).
# Minimal version selection gives each controller the newest version of a
# shared dependency that any of them asks for, not always the one its own
# release pins; the platform's Flux tests run on exactly these binaries.
mod="$work/mod"
mkdir -p "$mod"
printf 'module x\n' >"$work/go.mod"
log "building ${controllers[*]} in one module (about 10 minutes cold on 2 cores)"
{
	echo "module cozy.dev/tools/flux"
	echo
	echo "go 1.26"
	echo
	echo "require ("
	for c in "${controllers[@]}"; do
		read -r name version <<<"$c"
		echo "	github.com/fluxcd/$name $version"
		echo "	github.com/fluxcd/$name/api $version"
	done
	echo ")"
	echo
	merged_replaces
	# pkg/artifact v0.18.3, which source-controller v1.9.6 asks for, is
	# refused by the proxy; v0.18.0 has the same API.
	echo "replace github.com/fluxcd/pkg/artifact => github.com/fluxcd/pkg/artifact v0.18.0"
} >"$mod/go.mod"
{
	printf '//go:build tools\n\npackage tools\n\nimport (\n'
	for c in "${controllers[@]}"; do
		read -r name _ <<<"$c"
		printf '\t_ "github.com/fluxcd/%s"\n' "$name"
	done
	printf ')\n'
} >"$mod/tools.go"
# -e: a test-only dependency of one controller's test helpers is refused by
# the proxy; nothing built here imports it.
(cd "$mod" && go mod tidy -e >&2)
mkdir -p "$work/bin"
pkgs=()
for c in "${controllers[@]}"; do
	read -r name _ <<<"$c"
	pkgs+=("github.com/fluxcd/$name")
done
(cd "$mod" && go build -trimpath -ldflags "-s -w" -o "$work/bin/" "${pkgs[@]}" >&2)
for c in "${controllers[@]}"; do
	read -r name _ <<<"$c"
	install -m 0755 "$work/bin/$name" "$out/.$name.tmp"
	mv -f "$out/.$name.tmp" "$out/$name"
done

have || { log "built controllers in $out do not run"; exit 1; }
manifests
echo "$out"
