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
#   crictl             sigs.k8s.io/cri-tools v1.37.0, built here (CGO_ENABLED=0)
#   busybox, runc,     Debian's busybox-static, runc, conntrack and iptables
#   conntrack, iptables  (hack/install-deps.sh); the libraries of the last three
#   cozy-worker        built here from this tree (CGO_ENABLED=0)
# then `cozyctl tenant image build` packs them. The same inputs give the
# same digest (TestWorkerImageReproducible).
#
# Only the directory goes to stdout; progress goes to stderr.
set -euo pipefail

version="${1:-v1.36.3}"
crictl_version=v1.37.0 # sigs.k8s.io/cri-tools: crictl speaks CRI v1 to any containerd 2
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

# crictl, cached by its version.
crictl="$cache_root/crictl/$crictl_version/crictl"
if [[ ! -x $crictl ]]; then
	log "building crictl $crictl_version"
	mkdir -p "$cache_root/crictl"
	cwork="$(mktemp -d "$cache_root/crictl/.build.XXXXXX")"
	printf 'module cozy.dev/tools/crictl\n\ngo 1.26\n\nrequire sigs.k8s.io/cri-tools %s\n' "$crictl_version" >"$cwork/go.mod"
	(cd "$cwork" && CGO_ENABLED=0 GOFLAGS=-mod=mod go build -trimpath \
		-ldflags "-s -w -X sigs.k8s.io/cri-tools/pkg/version.Version=$crictl_version" \
		-o "$cwork/crictl" sigs.k8s.io/cri-tools/cmd/crictl >&2)
	mkdir -p "$(dirname "$crictl")"
	mv -f "$cwork/crictl" "$crictl"
	rm -rf "$cwork"
fi

bin="$(mktemp -d)"
trap 'rm -rf "$bin" ${work:+"$work"}' EXIT
(cd "$repo" && CGO_ENABLED=0 go build -trimpath -ldflags '-s -w' -o "$bin/" ./cmd/cozy-worker ./cmd/cozyctl)

key="$({
	echo "$version"
	sha256sum "$kube/kubelet" "$kube/kubeadm" "$runtime"/bin/* "$runtime"/cni/bin/* "$kernel"/vmlinuz "$kernel"/config "$kernel"/modules/* \
		"$syslinux"/* "$bin/cozy-worker" "$crictl" /bin/busybox /usr/sbin/runc /usr/sbin/conntrack /usr/sbin/xtables-nft-multi \
		/usr/lib/x86_64-linux-gnu/xtables/*.so "$repo"/tenant/workerimage/*.go "$repo"/tenant/workerimage/init.sh | cut -d' ' -f1
} | sha256sum | cut -c1-12)"
out="${2:-$cache_root/worker-image/${version}_$key}"
if [[ -f $out/index.json ]]; then
	echo "$out"
	exit 0
fi
mkdir -p "$(dirname "$out")"
log "packing Kubernetes $version into $out"
"$bin/cozyctl" tenant image build --version "$version" --out "$out" \
	--kernel "$kernel" --kubernetes "$kube" --runtime "$runtime" --syslinux "$syslinux" --agent "$bin/cozy-worker" --crictl "$crictl" >&2
echo "$out"
