#!/usr/bin/env bash
# Builds Cozy's tenant worker image (a KubeVirt containerDisk) for one
# Kubernetes version, from the Go module proxy and Debian only, and
# prints the OCI layout's directory:
#
#   hack/worker-image.sh [KUBERNETES_VERSION [OUT]]
#
# Default v1.36.3 into $COZY_CACHE_DIR/worker-image/<version>_<inputs>.
# What goes in, each from its own cached build:
#   kubelet, kubeadm   hack/envtest-assets.sh VERSION (the tests' wrapper
#                      module and build cache)
#   containerd, CNI    hack/node-assets.sh
#   kernel, modules    hack/boot-assets.sh (Debian's linux-image-amd64)
#   ISOLINUX           Debian's isolinux and syslinux-common, apt-get
#                      download and dpkg-deb -x, never installed
#   busybox, runc      Debian's busybox-static and runc (hack/install-deps.sh)
#   cozy-worker        built here from this tree (CGO_ENABLED=0)
# then `cozyctl tenant image build` packs them. The same inputs give the
# same digest (TestWorkerImageReproducible).
#
# Only the directory goes to stdout; progress goes to stderr.
set -euo pipefail

version="${1:-v1.36.3}"
[[ $version =~ ^v1\.[0-9]+\.[0-9]+$ ]] || { echo "worker-image: '$version' is not a Kubernetes version (v1.36.3)" >&2; exit 2; }
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cache_root="${COZY_CACHE_DIR:-${HOME:-/root}/.cache/cozy}"
log() { echo "worker-image: $*" >&2; }
die() { log "$*"; exit 1; }
for tool in go apt-get apt-cache dpkg-deb xorriso qemu-img sha256sum; do
	command -v "$tool" >/dev/null || die "$tool is not installed (see hack/install-deps.sh)"
done
export GOTOOLCHAIN=local

kube="$("$repo/hack/envtest-assets.sh" "$version")"
runtime="$("$repo/hack/node-assets.sh")"
kernel="$("$repo/hack/boot-assets.sh")"

# ISOLINUX, cached by its Debian version.
syslinux_deb="$(apt-cache policy isolinux | awk '/^  Candidate:/ { print $2 }')"
[[ -n $syslinux_deb && $syslinux_deb != "(none)" ]] || die "no candidate for isolinux: run apt-get update"
syslinux="$cache_root/syslinux/${syslinux_deb//[:~+]/_}"
if [[ ! -s $syslinux/isohdpfx.bin ]]; then
	mkdir -p "$cache_root/syslinux"
	work="$(mktemp -d "$cache_root/syslinux/.fetch.XXXXXX")"
	trap 'rm -rf "$work"' EXIT
	apt_opts=(-q)
	((EUID != 0)) || apt_opts+=(-o APT::Sandbox::User=root)
	(cd "$work" && apt-get download "${apt_opts[@]}" "isolinux=$syslinux_deb" "syslinux-common=$syslinux_deb" >&2)
	for d in "$work"/*.deb; do dpkg-deb -x "$d" "$work/x"; done
	mkdir -p "$work/out"
	cp "$work/x/usr/lib/ISOLINUX/isolinux.bin" "$work/x/usr/lib/ISOLINUX/isohdpfx.bin" \
		"$work/x/usr/lib/syslinux/modules/bios/ldlinux.c32" "$work/out/"
	rm -rf "$syslinux"
	mv "$work/out" "$syslinux"
fi

bin="$(mktemp -d)"
trap 'rm -rf "$bin" ${work:+"$work"}' EXIT
(cd "$repo" && CGO_ENABLED=0 go build -trimpath -ldflags '-s -w' -o "$bin/" ./cmd/cozy-worker ./cmd/cozyctl)

key="$({
	echo "$version"
	sha256sum "$kube/kubelet" "$kube/kubeadm" "$runtime"/bin/* "$runtime"/cni/bin/* "$kernel"/vmlinuz "$kernel"/config "$kernel"/modules/* \
		"$syslinux"/* "$bin/cozy-worker" /bin/busybox /usr/sbin/runc "$repo"/tenant/workerimage/*.go "$repo"/tenant/workerimage/init.sh | cut -d' ' -f1
} | sha256sum | cut -c1-12)"
out="${2:-$cache_root/worker-image/${version}_$key}"
if [[ -f $out/index.json ]]; then
	echo "$out"
	exit 0
fi
mkdir -p "$(dirname "$out")"
log "packing Kubernetes $version into $out"
"$bin/cozyctl" tenant image build --version "$version" --out "$out" \
	--kernel "$kernel" --kubernetes "$kube" --runtime "$runtime" --syslinux "$syslinux" --agent "$bin/cozy-worker" >&2
echo "$out"
