#!/usr/bin/env bash
# Builds the Kubernetes binaries Cozy runs (kube-apiserver,
# kube-controller-manager, kube-scheduler, kubelet, kube-proxy, kubectl,
# kubeadm) and etcd from
# the Go module proxy (no release downloads are reachable here), and prints
# their directory: KUBEBUILDER_ASSETS for envtest, and what the emulated
# Talos node runs.
#
#   hack/envtest-assets.sh [KUBERNETES_VERSION [ETCD_VERSION]]
#
# Defaults: Kubernetes v1.36.3 (the newest 1.36 the proxy serves: Talos
# v1.13 runs Kubernetes up to 1.36, and tests and nodes share one build),
# etcd v3.6.10.
# The result is cached in $COZY_CACHE_DIR/envtest/k8s-<v>_etcd-<v> (default
# COZY_CACHE_DIR=$HOME/.cache/cozy); a cached build returns at once. Each
# binary is built in a temporary directory and renamed into place, so an
# interrupted build never leaves a half-written cache.
#
# Only the directory goes to stdout; progress goes to stderr.
set -euo pipefail

k8s_version="${1:-v1.36.3}"
etcd_version="${2:-v3.6.10}"

for v in "$k8s_version" "$etcd_version"; do
	if [[ ! "$v" =~ ^v[0-9]+\.[0-9]+\.[0-9]+$ ]]; then
		echo "envtest-assets: version '$v' is not of the form vMAJOR.MINOR.PATCH" >&2
		exit 2
	fi
done

cache_root="${COZY_CACHE_DIR:-${HOME:-/root}/.cache/cozy}"
out="$cache_root/envtest/k8s-${k8s_version}_etcd-${etcd_version}"

# The binaries of k8s.io/kubernetes, built together: one wrapper module,
# one build cache.
# kubeadm goes into Cozy's tenant worker image (hack/worker-image.sh).
k8s_binaries=(kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy kubectl kubeadm)

# runs BIN: it is in the cache and runs in place (`--version` proves it is whole).
runs() {
	local v=--version
	[[ $1 == kubectl ]] && v="version --client"
	[[ $1 == kubeadm ]] && v="version -o short"
	[[ -x "$out/$1" ]] && "$out/$1" $v >/dev/null 2>&1
}
have() {
	local b
	for b in etcd "${k8s_binaries[@]}"; do
		runs "$b" || return 1
	done
}
if have; then
	echo "$out"
	exit 0
fi

# One build of a version at a time: hack/kamaji.sh and hack/worker-image.sh
# both want v1.30.2, and two builds side by side take twice the CPU. The
# second waits for the first, then finds its result.
mkdir -p "$cache_root/envtest"
exec 9>"$cache_root/envtest/.lock-${out##*/}"
if ! flock -n 9; then
	echo "envtest-assets: waiting for another build of ${out##*/}" >&2
	flock 9
fi
if have; then
	echo "$out"
	exit 0
fi

export GOTOOLCHAIN=local GOFLAGS=-mod=mod CGO_ENABLED=0
mkdir -p "$out"
work="$(mktemp -d "$cache_root/envtest/.build.XXXXXX")"
trap 'rm -rf "$work"' EXIT

log() { echo "envtest-assets: $*" >&2; }

# atomic_install SRC NAME: move a freshly built binary into the cache.
atomic_install() {
	install -m 0755 "$1" "$out/.$2.tmp"
	mv -f "$out/.$2.tmp" "$out/$2"
}

# build_kubernetes BIN...: builds the named binaries of k8s.io/kubernetes
# in one `go build`.
build_kubernetes() {
	local mod="$work/kubernetes"
	mkdir -p "$mod"
	log "building $* $k8s_version (about 14 minutes cold on 2 cores)"
	# The k8s.io/kubernetes module points its staging modules at ./staging;
	# a wrapper module maps each to its published k8s.io/<m> v0.<minor>.<patch>.
	local gomod
	gomod="$(cd "$mod" && go mod download -json "k8s.io/kubernetes@$k8s_version" |
		sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",$/\1/p')"
	[[ -f "$gomod" ]] || { log "cannot download k8s.io/kubernetes@$k8s_version"; exit 1; }
	local staging_version="v0.${k8s_version#v1.}"
	{
		echo "module cozy.dev/envtest/kubernetes"
		echo
		echo "go 1.26"
		echo
		echo "require k8s.io/kubernetes $k8s_version"
		echo
		grep -E '^[[:space:]]*k8s\.io/[a-z0-9-]+ => \./staging/' "$gomod" |
			awk -v v="$staging_version" '{ printf "replace %s => %s %s\n", $1, $1, v }'
	} >"$mod/go.mod"
	{
		printf '//go:build tools\n\npackage tools\n\nimport (\n'
		local b
		for b in "$@"; do
			printf '\t_ "k8s.io/kubernetes/cmd/%s"\n' "$b"
		done
		printf ')\n'
	} >"$mod/tools.go"
	(cd "$mod" && go mod tidy -e >&2)

	local major minor
	major="${k8s_version#v}"; major="${major%%.*}"
	minor="${k8s_version#v*.}"; minor="${minor%%.*}"
	local ldflags="-s -w"
	local pkg
	for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
		ldflags+=" -X $pkg.gitVersion=$k8s_version -X $pkg.gitMajor=$major -X $pkg.gitMinor=$minor"
		ldflags+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
	done
	local pkgs=()
	for b in "$@"; do
		pkgs+=("k8s.io/kubernetes/cmd/$b")
	done
	mkdir -p "$work/bin"
	(cd "$mod" && go build -trimpath -ldflags "$ldflags" -o "$work/bin/" "${pkgs[@]}" >&2)
	for b in "$@"; do
		atomic_install "$work/bin/$b" "$b"
	done
}

build_etcd() {
	local mod="$work/etcd"
	mkdir -p "$mod"
	log "building etcd $etcd_version (about 2 minutes cold on 2 cores)"
	cat >"$mod/go.mod" <<-EOF
	module cozy.dev/envtest/etcd

	go 1.26

	require go.etcd.io/etcd/server/v3 $etcd_version
	EOF
	cat >"$mod/tools.go" <<-'EOF'
	//go:build tools

	package tools

	import _ "go.etcd.io/etcd/server/v3"
	EOF
	(cd "$mod" && go mod tidy -e >&2)
	(cd "$mod" && go build -trimpath -ldflags "-s -w" -o "$work/etcd.bin" go.etcd.io/etcd/server/v3 >&2)
	atomic_install "$work/etcd.bin" etcd
}

if ! runs etcd; then
	build_etcd
fi
missing=()
for b in "${k8s_binaries[@]}"; do
	runs "$b" || missing+=("$b")
done
if ((${#missing[@]})); then
	build_kubernetes "${missing[@]}"
fi

have || { log "built binaries in $out do not run"; exit 1; }
log "$("$out/kube-apiserver" --version), etcd $("$out/etcd" --version | sed -n 's/^etcd Version: //p')"
echo "$out"
