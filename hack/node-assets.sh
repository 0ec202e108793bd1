#!/usr/bin/env bash
# Builds the container runtime the emulated Talos node runs beside kubelet
# (containerd, its runc shim, ctr, and the CNI plugins Talos ships for its
# default flannel network) from the Go module proxy, as Talos builds them
# into its rootfs, and prints the directory that holds them:
#
#   bin/containerd bin/containerd-shim-runc-v2 bin/ctr
#   cni/bin/bridge cni/bin/host-local cni/bin/loopback cni/bin/portmap
#   cni/bin/flannel
#
#   hack/node-assets.sh [CONTAINERD_VERSION [CNI_VERSION [FLANNEL_CNI_VERSION]]]
#
# Defaults:
#   containerd v2.4.2 (github.com/containerd/containerd/v2): one wrapper
#     module, one `go build` for the three binaries, with the tags and version
#     ldflags of containerd's `make STATIC=1` (btrfs needs cgo and drops out by
#     itself; no_btrfs says so). The shim is built with the daemon, so without
#     the Makefile's no_grpc tag: a bigger binary, the same behaviour. The
#     Makefile's REVISION (the git commit) is not known from the proxy: empty.
#   CNI plugins v1.10.0 (github.com/containernetworking/plugins), the newest;
#     its go.mod asks for Go 1.26.8, which this repo pins (v1.9.1 builds too).
#   flannel CNI plugin v1.0.0-rc1, from the same module's plugins/meta/flannel.
#     The plugin moved to github.com/flannel-io/cni-plugin (flannel v0.28.4
#     pairs with its v1.9.1-flannel1), but the proxy refuses every version of
#     that module, tags and pseudo-versions alike. v1.0.0-rc1 is the last
#     served containernetworking/plugins version that still carries it, and
#     the first that speaks CNI spec 1.0.0, which Talos's flannel conflist
#     asks for (v0.9.1 stops at 0.4.0). It reads flannel's subnet.env as
#     v1.9.1-flannel1 does, except that it takes one network per address
#     family, not a comma-separated list. FLANNEL_CNI_VERSION is therefore a
#     containernetworking/plugins version.
# runc is not built: Debian's runc 1.1.5 (/usr/sbin/runc, `make deps`) runs
# this containerd's containers, with overlayfs or native snapshots, on this
# machine's cgroup v1 (hybrid) hierarchy.
#
# Everything is CGO_ENABLED=0 and static. The result is cached in
# $COZY_CACHE_DIR/node/containerd-<v>_cni-<v>_flannel-cni-<v> (default
# COZY_CACHE_DIR=$HOME/.cache/cozy); a cached build returns at once. Each
# binary is built in a temporary directory and renamed into place, so an
# interrupted build never leaves a half-written cache. Cold (empty module and
# build caches) it took 6 and 10 minutes on 2 cores beside a running
# Kubernetes build (4 minutes of CPU; containerd is three quarters of it).
#
# Only the directory goes to stdout; progress goes to stderr.
set -euo pipefail

containerd_version="${1:-v2.4.2}"
cni_version="${2:-v1.10.0}"
flannel_cni_version="${3:-v1.0.0-rc1}"

for v in "$containerd_version" "$cni_version" "$flannel_cni_version"; do
	if [[ ! "$v" =~ ^v[0-9]+\.[0-9]+\.[0-9]+(-[0-9A-Za-z.-]+)?$ ]]; then
		echo "node-assets: version '$v' is not of the form vMAJOR.MINOR.PATCH[-PRERELEASE]" >&2
		exit 2
	fi
done

cache_root="${COZY_CACHE_DIR:-${HOME:-/root}/.cache/cozy}"
out="$cache_root/node/containerd-${containerd_version}_cni-${cni_version}_flannel-cni-${flannel_cni_version}"

containerd_module=github.com/containerd/containerd/v2
cni_module=github.com/containernetworking/plugins
containerd_binaries=(containerd containerd-shim-runc-v2 ctr)
# plugin name => package under $cni_module
declare -A cni_packages=(
	[bridge]=plugins/main/bridge
	[host-local]=plugins/ipam/host-local
	[loopback]=plugins/main/loopback
	[portmap]=plugins/meta/portmap
)

# runs BIN: it is in the cache, runs in place and reports the version asked
# for (an empty file would "run" as a shell script).
runs() {
	local bin version
	case "$1" in
	containerd | containerd-shim-runc-v2 | ctr) bin="$out/bin/$1" version="$containerd_version" ;;
	flannel) bin="$out/cni/bin/$1" version="$flannel_cni_version" ;;
	*) bin="$out/cni/bin/$1" version="$cni_version" ;;
	esac
	[[ -x "$bin" ]] || return 1
	local report
	case "$1" in
	containerd | ctr) report="$("$bin" --version 2>/dev/null)" ;;
	containerd-shim-runc-v2) report="$("$bin" -v 2>/dev/null)" ;;
	*) report="$("$bin" </dev/null 2>&1)" ;; # a CNI plugin run bare prints its name and version
	esac || return 1
	[[ "$report" =~ [[:space:]]"$version"([[:space:]]|$) ]]
}
have() {
	local b
	for b in "${containerd_binaries[@]}" "${!cni_packages[@]}" flannel; do
		runs "$b" || return 1
	done
}
if have; then
	echo "$out"
	exit 0
fi

export GOTOOLCHAIN=local GOFLAGS=-mod=mod CGO_ENABLED=0
mkdir -p "$out/bin" "$out/cni/bin"
work="$(mktemp -d "$cache_root/node/.build.XXXXXX")"
trap 'rm -rf "$work"' EXIT

log() { echo "node-assets: $*" >&2; }

# atomic_install SRC DIR NAME: move a freshly built binary into the cache.
atomic_install() {
	install -m 0755 "$1" "$2/.$3.tmp"
	mv -f "$2/.$3.tmp" "$2/$3"
}

# wrapper_module DIR NAME MODULE VERSION PACKAGE...: a module that requires
# MODULE@VERSION and imports PACKAGEs (paths under MODULE), tidied.
wrapper_module() {
	local mod="$1" name="$2" module="$3" version="$4" p
	shift 4
	mkdir -p "$mod"
	cat >"$mod/go.mod" <<-EOF
	module cozy.dev/tools/$name

	go 1.26

	require $module $version
	EOF
	{
		printf '//go:build tools\n\npackage tools\n\nimport (\n'
		for p in "$@"; do
			printf '\t_ "%s/%s"\n' "$module" "$p"
		done
		printf ')\n'
	} >"$mod/tools.go"
	(cd "$mod" && go mod tidy -e >&2)
}

build_containerd() {
	local mod="$work/containerd"
	log "building containerd $containerd_version"
	wrapper_module "$mod" node-containerd "$containerd_module" "$containerd_version" \
		"${containerd_binaries[@]/#/cmd/}"
	# As `make STATIC=1`: the Makefile's VERSION is `git describe`, the tag;
	# its REVISION (the commit) is not known from the proxy and stays empty.
	local pkg="$containerd_module/version"
	local ldflags="-s -w -X $pkg.Version=$containerd_version -X $pkg.Package=$containerd_module"
	local tags="urfave_cli_no_docs osusergo netgo static_build no_btrfs"
	mkdir -p "$work/containerd-bin"
	(cd "$mod" && go build -trimpath -tags "$tags" -ldflags "$ldflags" -o "$work/containerd-bin/" \
		"${containerd_binaries[@]/#/$containerd_module/cmd/}" >&2)
	local b
	for b in "${containerd_binaries[@]}"; do
		atomic_install "$work/containerd-bin/$b" "$out/bin" "$b"
	done
}

# build_cni NAME VERSION BIN=PACKAGE...: builds plugins of $cni_module at
# VERSION in one `go build`, with the version ldflag of its release script.
build_cni() {
	local name="$1" version="$2" mod="$work/$1" b
	shift 2
	local bins=("${@%%=*}") pkgs=("${@#*=}")
	log "building CNI plugins ${bins[*]} $version"
	wrapper_module "$mod" "$name" "$cni_module" "$version" "${pkgs[@]}"
	local ldflags="-s -w -X $cni_module/pkg/utils/buildversion.BuildVersion=$version"
	mkdir -p "$work/$name-bin"
	(cd "$mod" && go build -trimpath -ldflags "$ldflags" -o "$work/$name-bin/" \
		"${pkgs[@]/#/$cni_module/}" >&2)
	for b in "${bins[@]}"; do
		atomic_install "$work/$name-bin/$b" "$out/cni/bin" "$b"
	done
}

missing=()
for b in "${containerd_binaries[@]}"; do
	runs "$b" || missing+=("$b")
done
if ((${#missing[@]})); then
	build_containerd
fi
missing=()
for b in "${!cni_packages[@]}"; do
	runs "$b" || missing+=("$b=${cni_packages[$b]}")
done
if ((${#missing[@]})); then
	build_cni node-cni "$cni_version" "${missing[@]}"
fi
if ! runs flannel; then
	build_cni node-flannel-cni "$flannel_cni_version" flannel=plugins/meta/flannel
fi

have || { log "built binaries in $out do not run"; exit 1; }
log "$("$out/bin/containerd" --version | sed "s/ *$//"), $("$out/cni/bin/bridge" </dev/null 2>&1 | head -n1), $("$out/cni/bin/flannel" </dev/null 2>&1 | head -n1)"
echo "$out"
