#!/usr/bin/env bash
# Builds, from source, the images every Kubernetes node of the lab pulls
# at bootstrap, under their exact upstream names and tags, into one OCI
# image layout (index.json + blobs/sha256, each manifest annotated with
# org.opencontainers.image.ref.name and io.containerd.image.name), for
# `cozyctl images mirror --from DIR` to push into the lab's registry. No
# registry is reachable here (nor from an air-gapped rack), so nothing is
# pulled: the binaries come from the Go module proxy and gcc, the
# userland they exec from Debian packages.
#
#   hack/lab-images.sh [OUTDIR]
#
#   registry.k8s.io/pause:3.10.2          pause.c of k8s.io/kubernetes v1.36.3, gcc -Os -static
#   registry.k8s.io/pause:3.10.1          the same image, under the tag Talos v1.13's nodes ask for
#   registry.k8s.io/coredns/coredns:v1.14.2  github.com/coredns/coredns, all plugins, CGO_ENABLED=0
#   ghcr.io/siderolabs/flannel:v0.28.4    github.com/flannel-io/flannel (cgo for the UDP backend, static)
#                                         on Debian 12 iptables (nf_tables), nft and cp
#   registry.k8s.io/kube-proxy:v1.36.3    kube-proxy from hack/envtest-assets.sh, kube-log-runner
#                                         as /go-runner, on the same base plus conntrack
#   docker.io/library/busybox:1.35.0      Debian 12's busybox-static (the probe pods of
#                                         internal/testing/clustertest)
#
# The layout is cached in $COZY_CACHE_DIR/lab-images/<key> (default
# COZY_CACHE_DIR=$HOME/.cache/cozy), the key naming every version, a hash
# of the Debian packages' versions, and a hash of the Go and gcc versions
# and of the code that builds and packs the images: a change rebuilds.
# It is built in a temporary directory and renamed into place, so an
# interrupted build never leaves a half-written one. With OUTDIR, the
# layout is also copied there (OUTDIR must not exist) and OUTDIR is
# printed.
#
# Cold build, measured 2026-12-01 on 2 cores with an empty Go build cache
# (modules already downloaded, kube-proxy already built by
# hack/envtest-assets.sh) while other builds shared the CPUs (load ~10):
# 11.5 minutes (689 s), most of it CoreDNS then flannel; 32 s with a
# warm Go build cache; about 3 s when the layout is cached (apt resolving
# the packages' versions for the key).
# The Debian packages (27, about 9 MB) are fetched with `apt-get
# download` and extracted with dpkg-deb -x, never installed.
#
# Only the directory goes to stdout; progress goes to stderr.
set -euo pipefail

k8s_version=v1.36.3      # kube-proxy, and pause's source
pause_tag=3.10.2         # build/pause/Makefile's TAG at k8s_version; tenant workers' sandbox (tenant/workerimage)
pause_talos_tag=3.10.1   # the Talos nodes' sandbox: the same Linux pause.c
coredns_version=v1.14.2  # Talos v1.13's DefaultCoreDNSVersion
flannel_version=v0.28.4  # Talos v1.13's FlannelVersion (its image copies docker.io/flannel/flannel)
busybox_tag=1.35.0       # Debian 12's busybox-static, checked below
# What the images exec, and what it all needs, from Debian.
debian_packages=(iptables nftables conntrack coreutils netbase busybox-static)

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# It packs the images with hack/labimages: it runs from a Cozy source tree.
[[ -f "$repo/hack/labimages/main.go" ]] || { echo "lab-images: run it from a Cozy source tree (no $repo/hack/labimages)" >&2; exit 1; }
# shellcheck source=hack/debroot.sh
source "$repo/hack/debroot.sh"
cache_root="${COZY_CACHE_DIR:-${HOME:-/root}/.cache/cozy}"
outdir="${1:-}"

log() { echo "lab-images: $*" >&2; }
die() { log "$*"; exit 1; }

for tool in go gcc strip apt-get apt-cache dpkg-deb sha256sum; do
	command -v "$tool" >/dev/null || die "$tool is not installed (see hack/install-deps.sh)"
done

# The Debian packages, with every package they depend on, pinned to the
# versions apt would install now; their hash is part of the key.
mapfile -t deb_names < <(apt-cache depends --recurse --no-recommends --no-suggests --no-conflicts \
	--no-breaks --no-replaces --no-enhances "${debian_packages[@]}" | grep -v '^[ <]' | sort -u)
mapfile -t debs < <(apt-cache policy "${deb_names[@]}" |
	awk '/^[^ ]/ { p = $1; sub(/:$/, "", p) } /^  Candidate:/ { print p "=" $2 }' | sort)
((${#debs[@]} == ${#deb_names[@]})) || die "apt knows ${#debs[@]} of ${#deb_names[@]} packages (${deb_names[*]}): run apt-get update"
for d in "${debs[@]}"; do
	[[ $d != *"=(none)" ]] || die "no candidate for ${d%=*}: run apt-get update"
done
busybox_deb="$(printf '%s\n' "${debs[@]}" | sed -n 's/^busybox-static=\([0-9]*:\)\{0,1\}\([^-]*\)-.*/\2/p')"
[[ $busybox_deb == "$busybox_tag" ]] || die "Debian's busybox-static is $busybox_deb, not $busybox_tag: update busybox_tag (and its users)"
debs_hash="$(printf '%s\n' "${debs[@]}" | sha256sum | cut -c1-12)"
# The toolchains and the code that builds and packs the images.
build_hash="$(cd "$repo" && {
	go env GOVERSION
	gcc -dumpfullversion
	ls hack/lab-images.sh hack/debroot.sh hack/labimages/*.go internal/ociimage/*.go | grep -v _test.go | xargs cat
} | sha256sum | cut -c1-12)"
key="k8s-${k8s_version}_pause-${pause_tag}-${pause_talos_tag}_coredns-${coredns_version}_flannel-${flannel_version}_busybox-${busybox_tag}_debs-${debs_hash}_build-${build_hash}"
out="$cache_root/lab-images/$key"

# publish: print the layout, after copying it to OUTDIR if one was given.
publish() {
	if [[ -z $outdir ]]; then
		echo "$out"
		return
	fi
	[[ ! -e $outdir ]] || die "$outdir exists: give a new directory"
	local tmp
	tmp="$(mktemp -d "$(dirname "$outdir")/.lab-images.XXXXXX")"
	cp -a --reflink=auto "$out/." "$tmp/"
	mv -T "$tmp" "$outdir"
	echo "$outdir"
}

if [[ -f "$out/index.json" ]]; then
	publish
	exit 0
fi

# kube-proxy comes from the build of the node's Kubernetes binaries.
k8s_bin="$("$repo/hack/envtest-assets.sh" "$k8s_version")"
[[ -x "$k8s_bin/kube-proxy" ]] && "$k8s_bin/kube-proxy" --version 2>/dev/null | grep -qx "Kubernetes $k8s_version" ||
	die "$k8s_bin/kube-proxy is missing or not $k8s_version: hack/envtest-assets.sh builds it"

mkdir -p "$cache_root/lab-images"
work="$(mktemp -d "$cache_root/lab-images/.build.XXXXXX")"
trap 'rm -rf "$work"' EXIT
export GOTOOLCHAIN=local

# wrapper NAME PKG MODULE@VERSION...: a module requiring the upstream
# module (and pins of its dependencies), with a tools file importing the
# main package PKG, tidied.
wrapper() {
	local name=$1 pkg=$2
	shift 2
	local mod="$work/$name"
	mkdir -p "$mod"
	{
		printf 'module cozy.dev/tools/%s\n\ngo 1.26\n\nrequire (\n' "$name"
		printf '\t%s\n' "${@/@/ }"
		printf ')\n'
	} >"$mod/go.mod"
	printf '//go:build tools\n\npackage tools\n\nimport _ "%s"\n' "$pkg" >"$mod/tools.go"
	(cd "$mod" && GOFLAGS=-mod=mod go mod tidy -e >&2)
}
# gobuild NAME PKG OUT ARGS...: go build in NAME's wrapper module.
gobuild() {
	local name=$1 pkg=$2 bin=$3
	shift 3
	(cd "$work/$name" && GOFLAGS=-mod=mod go build -trimpath "$@" -o "$bin" "$pkg" >&2)
}

log "pause $pause_tag from k8s.io/kubernetes@$k8s_version build/pause/linux/pause.c"
k8s_src="$(cd "$work" && printf 'module x\n' >go.mod && go mod download -json "k8s.io/kubernetes@$k8s_version" |
	sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')"
[[ -f "$k8s_src/build/pause/linux/pause.c" ]] || die "no build/pause/linux/pause.c in k8s.io/kubernetes@$k8s_version"
grep -qx "TAG ?= $pause_tag" "$k8s_src/build/pause/Makefile" ||
	die "build/pause/Makefile of k8s.io/kubernetes@$k8s_version does not say TAG ?= $pause_tag: update pause_tag"
[[ -f "$(gcc -print-file-name=libc.a)" ]] || die "gcc cannot link statically: install libc6-dev"
# build/pause/Makefile: CFLAGS = -Os -Wall -Werror -static -DVERSION=v$(TAG)-$(REV),
# REV being the git revision, here the Kubernetes release the source is from.
gcc -Os -Wall -Werror -static -DVERSION="v${pause_tag}-${k8s_version}" -o "$work/pause" "$k8s_src/build/pause/linux/pause.c"
strip "$work/pause"

log "CoreDNS $coredns_version, every plugin of its plugin.cfg (the longest build)"
wrapper coredns github.com/coredns/coredns "github.com/coredns/coredns@$coredns_version"
CGO_ENABLED=0 gobuild coredns github.com/coredns/coredns "$work/coredns.bin" \
	-ldflags "-s -w -X github.com/coredns/coredns/coremain.GitCommit=$coredns_version"

log "flannel $flannel_version"
# Its go.mod requires tencentcloud-sdk-go common v1.3.79, which the proxy
# refuses; v1.3.81 is served and API-compatible.
wrapper flannel github.com/flannel-io/flannel "github.com/flannel-io/flannel@$flannel_version" \
	github.com/tencentcloud/tencentcloud-sdk-go/tencentcloud/common@v1.3.81
# Upstream's Makefile: cgo on amd64 (the UDP backend is C), -extldflags
# -static; netgo and osusergo keep glibc's NSS out of the static binary.
CGO_ENABLED=1 gobuild flannel github.com/flannel-io/flannel "$work/flanneld" -tags netgo,osusergo \
	-ldflags "-s -w -X github.com/flannel-io/flannel/pkg/version.Version=$flannel_version -extldflags -static"

log "kube-log-runner (/go-runner of the kube-proxy image)"
wrapper component-base k8s.io/component-base/logs/kube-log-runner "k8s.io/component-base@v0.${k8s_version#v1.}"
CGO_ENABLED=0 gobuild component-base k8s.io/component-base/logs/kube-log-runner "$work/go-runner" -ldflags "-s -w"

log "Debian packages: ${debs[*]}"
debroot "$work" "${debs[@]}"

log "packing the images"
(cd "$repo" && go build -o "$work/labimages" ./hack/labimages)
"$work/labimages" -o "$work/layout" -debs "$work/debroot" \
	-pause "$work/pause" -coredns "$work/coredns.bin" -flanneld "$work/flanneld" \
	-kube-proxy "$k8s_bin/kube-proxy" -go-runner "$work/go-runner" \
	-kubernetes-version "$k8s_version" -pause-tag "$pause_tag" -pause-talos-tag "$pause_talos_tag" \
	-coredns-tag "$coredns_version" -flannel-tag "$flannel_version" -busybox-tag "$busybox_tag"
chmod 0755 "$work/layout"
mv -T "$work/layout" "$out" 2>/dev/null || [[ -f "$out/index.json" ]] || die "cannot move the layout to $out"
publish
