#!/usr/bin/env bash
# Builds the Cluster API core manager and the kubeadm bootstrap provider's
# manager from the Go module proxy (no release images or binaries are
# reachable here) for the tenant integration tests, and prints the
# directory that holds them (use it as COZY_CAPI_BIN).
#
#   hack/capi-controllers.sh
#
# The version is the one DESIGN.md pins, whose CRDs the integration tests
# load and whose API module go.mod requires. The manager is built in a
# wrapper module that requires the upstream module, carries the upstream
# go.mod's replace lines that point at published versions, and maps the
# upstream `api => ./api` replace to the published api module.
# The result is cached in $COZY_CACHE_DIR/capi/<version>; a cached build
# returns at once, and the binary is built in a temporary directory and
# renamed into place, so an interrupted build never leaves a half-written
# cache. Only the directory goes to stdout; progress goes to stderr.
set -euo pipefail

version=v1.14.2
module=sigs.k8s.io/cluster-api

cache_root="${COZY_CACHE_DIR:-${HOME:-/root}/.cache/cozy}"
out="$cache_root/capi/$version"

runs() { [[ -x "$out/$1" ]] && "$out/$1" --help >/dev/null 2>&1; }
if runs cluster-api-manager && runs kubeadm-bootstrap-manager; then
	echo "$out"
	exit 0
fi

export GOTOOLCHAIN=local GOFLAGS=-mod=mod CGO_ENABLED=0
mkdir -p "$out"
work="$(mktemp -d "$cache_root/capi/.build.XXXXXX")"
trap 'rm -rf "$work"' EXIT
log() { echo "capi-controllers: $*" >&2; }

mod="$work/cluster-api"
mkdir -p "$mod"
log "building the Cluster API core and kubeadm bootstrap managers $version (a few minutes cold on 2 cores)"
gomod="$(cd "$mod" && printf 'module x\n' >go.mod && go mod download -json "$module@$version" |
	sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",$/\1/p')"
[[ -f "$gomod" ]] || { log "cannot download $module@$version"; exit 1; }
{
	echo "module cozy.dev/tools/cluster-api"
	echo
	echo "go 1.26"
	echo
	echo "require ("
	echo "	$module $version"
	echo "	$module/api $version"
	echo ")"
	echo
	# Upstream replaces that name a published version; `./api` becomes
	# the published api module, which replacing it to itself pins for
	# every module that requires it.
	go mod edit -json "$gomod" |
		jq -r '.Replace[]? | select(.New.Version != null) |
			"replace \(.Old.Path)\(if .Old.Version then " " + .Old.Version else "" end) => \(.New.Path) \(.New.Version)"'
	echo "replace $module/api => $module/api $version"
} >"$mod/go.mod"
# The managers are the main packages in core/ and bootstrap/kubeadm/ of
# the root module: one module, one go build, one build cache.
printf '//go:build tools\n\npackage tools\n\nimport (\n\t_ "%s/core"\n\t_ "%s/bootstrap/kubeadm"\n)\n' "$module" "$module" >"$mod/tools.go"
(cd "$mod" && go mod tidy -e >&2)
mkdir -p "$work/bin"
(cd "$mod" && go build -trimpath -ldflags "-s -w" -o "$work/bin/" "$module/core" "$module/bootstrap/kubeadm" >&2)
install -m 0755 "$work/bin/core" "$out/.cluster-api-manager.tmp"
install -m 0755 "$work/bin/kubeadm" "$out/.kubeadm-bootstrap-manager.tmp"
mv -f "$out/.cluster-api-manager.tmp" "$out/cluster-api-manager"
mv -f "$out/.kubeadm-bootstrap-manager.tmp" "$out/kubeadm-bootstrap-manager"

runs cluster-api-manager || { log "built manager in $out does not run"; exit 1; }
runs kubeadm-bootstrap-manager || { log "built kubeadm bootstrap manager in $out does not run"; exit 1; }
echo "$out"
