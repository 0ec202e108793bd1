#!/usr/bin/env bash
# Builds the kube-apiserver and etcd that integration tests run through
# controller-runtime's envtest, from the Go module proxy (no release
# downloads are reachable here), and prints the directory to use as
# KUBEBUILDER_ASSETS.
#
#   hack/envtest-assets.sh [KUBERNETES_VERSION [ETCD_VERSION]]
#
# Defaults: Kubernetes v1.37.2, etcd v3.6.10 (the versions DESIGN.md pins).
# The result is cached in $COZY_CACHE_DIR/envtest/k8s-<v>_etcd-<v> (default
# COZY_CACHE_DIR=$HOME/.cache/cozy); a cached build returns at once. Each
# binary is built in a temporary directory and renamed into place, so an
# interrupted build never leaves a half-written cache.
#
# Only the directory goes to stdout; progress goes to stderr.
set -euo pipefail

k8s_version="${1:-v1.37.2}"
etcd_version="${2:-v3.6.10}"

for v in "$k8s_version" "$etcd_version"; do
	if [[ ! "$v" =~ ^v[0-9]+\.[0-9]+\.[0-9]+$ ]]; then
		echo "envtest-assets: version '$v' is not of the form vMAJOR.MINOR.PATCH" >&2
		exit 2
	fi
done

cache_root="${COZY_CACHE_DIR:-${HOME:-/root}/.cache/cozy}"
out="$cache_root/envtest/k8s-${k8s_version}_etcd-${etcd_version}"

# Binaries must run in place; `--version` proves they are whole.
have() {
	[[ -x "$out/kube-apiserver" && -x "$out/etcd" ]] &&
		"$out/kube-apiserver" --version >/dev/null 2>&1 &&
		"$out/etcd" --version >/dev/null 2>&1
}
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

build_kube_apiserver() {
	local mod="$work/kube-apiserver"
	mkdir -p "$mod"
	log "building kube-apiserver $k8s_version (about 8 minutes cold on 2 cores)"
	# The k8s.io/kubernetes module points its staging modules at ./staging;
	# a wrapper module maps each to its published k8s.io/<m> v0.<minor>.<patch>.
	local gomod
	gomod="$(cd "$mod" && go mod download -json "k8s.io/kubernetes@$k8s_version" |
		sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",$/\1/p')"
	[[ -f "$gomod" ]] || { log "cannot download k8s.io/kubernetes@$k8s_version"; exit 1; }
	local staging_version="v0.${k8s_version#v1.}"
	{
		echo "module cozy.dev/envtest/kube-apiserver"
		echo
		echo "go 1.26"
		echo
		echo "require k8s.io/kubernetes $k8s_version"
		echo
		grep -E '^[[:space:]]*k8s\.io/[a-z0-9-]+ => \./staging/' "$gomod" |
			awk -v v="$staging_version" '{ printf "replace %s => %s %s\n", $1, $1, v }'
	} >"$mod/go.mod"
	cat >"$mod/tools.go" <<-'EOF'
	//go:build tools

	package tools

	import _ "k8s.io/kubernetes/cmd/kube-apiserver"
	EOF
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
	(cd "$mod" && go build -trimpath -ldflags "$ldflags" -o "$work/kube-apiserver.bin" k8s.io/kubernetes/cmd/kube-apiserver >&2)
	atomic_install "$work/kube-apiserver.bin" kube-apiserver
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

if ! { [[ -x "$out/etcd" ]] && "$out/etcd" --version >/dev/null 2>&1; }; then
	build_etcd
fi
if ! { [[ -x "$out/kube-apiserver" ]] && "$out/kube-apiserver" --version >/dev/null 2>&1; }; then
	build_kube_apiserver
fi

have || { log "built binaries in $out do not run"; exit 1; }
log "$("$out/kube-apiserver" --version), etcd $("$out/etcd" --version | sed -n 's/^etcd Version: //p')"
echo "$out"
