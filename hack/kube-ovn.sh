#!/usr/bin/env bash
# Builds Kube-OVN's image from source, under its upstream name and tag,
# into an OCI image layout for `cozyctl images mirror --from DIR`:
#
#   hack/kube-ovn.sh      prints the layout's directory
#
#   docker.io/kubeovn/kube-ovn:v1.15.4
#     /kube-ovn/kube-ovn-cmd, -daemon, -controller and kube-ovn (the CNI
#       plugin): github.com/kubeovn/kube-ovn at the platform's pin, built
#       in its own module tree (its go.mod replaces k8s.io/* and
#       libovsdb) as makefiles/build.mk builds them;
#     /kube-ovn/*.sh, kubectl-ko, 01-kube-ovn.conflist: the same module's
#       dist/images, as its Dockerfile copies them;
#     /loopback, /portmap, /macvlan: containernetworking/plugins at the
#       version Kube-OVN's go.mod requires; /usr/bin/kubectl: the
#       k8s.io/kubernetes its go.mod requires;
#     Open vSwitch and OVN: Debian 13's packages (openvswitch 3.5, OVN
#       25.03: the branches Kube-OVN builds its own from, without its
#       patches), with everything they and the scripts depend on.
#
# Kube-OVN's image is Ubuntu with its own patched builds of OVS and OVN;
# here it is Debian trixie's, unpatched: docs/images.md says what that
# leaves out. This machine runs Debian 12, whose OVN (23.03) is older
# than the schema Kube-OVN's controller is generated from, so the
# packages come from trixie through an apt state of the script's own
# ($COZY_CACHE_DIR/apt/trixie), checked with the archive keys this
# machine's apt trusts.
#
# Cached in $COZY_CACHE_DIR/kube-ovn/<key>, the key naming Kube-OVN's
# version, a hash of every Debian package and version in the image, the
# Go version and a hash of the code that packs it; built in a temporary
# directory and renamed into place.
#
# Only the directory goes to stdout; progress goes to stderr.
set -euo pipefail

version=v1.15.4 # the platform's pin (platform/upstream: the kube-ovn chart)
suite=trixie
# Debian 13's Open vSwitch and OVN, and what the start scripts and the
# daemon run besides (Kube-OVN's Dockerfile.base installs the same
# tools; IPsec, BGP and BFD are left out).
debs=(openvswitch-switch=3.5.0-1+b1 ovn-central=25.03.0-1 ovn-host=25.03.0-1
	base-files base-passwd bash coreutils dash diffutils findutils grep gzip hostname sed mawk util-linux
	procps iproute2 iptables ipset kmod conntrack ethtool netbase ca-certificates uuid-runtime dumb-init
	libcap2-bin iputils-ping)

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
[[ -f "$repo/hack/kubeovnimage/main.go" ]] || { echo "kube-ovn: run it from a Cozy source tree" >&2; exit 1; }
# shellcheck source=hack/debroot.sh
source "$repo/hack/debroot.sh"
cache_root="${COZY_CACHE_DIR:-${HOME:-/root}/.cache/cozy}"
(($# == 0)) || { echo "usage: hack/kube-ovn.sh (prints the layout's directory)" >&2; exit 2; }

log() { echo "kube-ovn: $*" >&2; }
die() { log "$*"; exit 1; }

for tool in go apt-get dpkg-deb sha256sum; do
	command -v "$tool" >/dev/null || die "$tool is not installed (see hack/install-deps.sh)"
done
grep -q "\"kube-ovn\", Version: \"$version\"" "$repo/platform/upstream/upstream.go" ||
	die "platform/upstream pins another kube-ovn chart than $version: update version"

debsuite "$cache_root/apt/$suite" "$suite"
# The lists are kept; when the pins are not in them (a newer pin, or
# lists older than it), fetch them again once.
if ! closure="$(debclosure "${debs[@]}" 2>/dev/null)" || [[ -z $closure ]]; then
	log "Debian $suite: fetching the package lists again"
	rm -f "$cache_root/apt/$suite/lists/"*_Packages
	debsuite "$cache_root/apt/$suite" "$suite"
	closure="$(debclosure "${debs[@]}")" || die "apt cannot resolve ${debs[*]} in Debian $suite"
	[[ -n $closure ]] || die "apt resolved nothing for ${debs[*]} in Debian $suite"
fi
build_hash="$(cd "$repo" && {
	go env GOVERSION
	echo "$closure"
	cat hack/kube-ovn.sh hack/debroot.sh hack/kubeovnimage/main.go
	ls internal/ociimage/*.go | grep -v _test.go | xargs cat
} | sha256sum | cut -c1-12)"
key="kube-ovn-${version}_debian-${suite}_build-${build_hash}"
out="$cache_root/kube-ovn/$key"

if [[ -f "$out/index.json" ]]; then
	echo "$out"
	exit 0
fi

mkdir -p "$cache_root/kube-ovn"
work="$(mktemp -d "$cache_root/kube-ovn/.build.XXXXXX")"
trap 'rm -rf "$work"' EXIT
export GOTOOLCHAIN=local GOFLAGS=-mod=mod

log "Kube-OVN $version: the module's tree"
src="$(cd "$work" && printf 'module x\n' >go.mod && go mod download -json "github.com/kubeovn/kube-ovn@$version" |
	sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')"
[[ -f "$src/dist/images/start-db.sh" ]] || die "no dist/images/start-db.sh in github.com/kubeovn/kube-ovn@$version"
cp -r "$src" "$work/src"
chmod -R u+w "$work/src"

log "Kube-OVN $version: kube-ovn, kube-ovn-cmd, kube-ovn-daemon, kube-ovn-controller"
# makefiles/build.mk: CGO_ENABLED=0, PIE but for the CNI plugin, the
# version in versions.VERSION.
ldflags="-s -w -X github.com/kubeovn/kube-ovn/versions.VERSION=$version -X github.com/kubeovn/kube-ovn/versions.COMMIT=$version"
mkdir -p "$work/bin"
(cd "$work/src" && CGO_ENABLED=0 go build -trimpath -ldflags "$ldflags" -o "$work/bin/kube-ovn" ./cmd/cni >&2)
for c in cmd:kube-ovn-cmd cmd/daemon:kube-ovn-daemon cmd/controller:kube-ovn-controller; do
	(cd "$work/src" && CGO_ENABLED=0 go build -trimpath -buildmode=pie -ldflags "$ldflags" -o "$work/bin/${c#*:}" "./${c%%:*}" >&2)
done

# dist/images/go-deps/download-go-deps.sh takes release binaries of the
# CNI plugins and kubectl; here they are built from the modules
# Kube-OVN's go.mod requires.
cni_version="$(cd "$work/src" && go list -m -f '{{.Version}}' github.com/containernetworking/plugins)"
k8s_version="$(cd "$work/src" && go list -m -f '{{.Version}}' k8s.io/kubernetes)"
log "CNI plugins $cni_version (loopback, portmap, macvlan), kubectl $k8s_version"
for p in main/loopback meta/portmap main/macvlan; do
	(cd "$work/src" && CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$work/bin/${p#*/}" \
		"github.com/containernetworking/plugins/plugins/$p" >&2)
done
(cd "$work/src" && CGO_ENABLED=0 go build -trimpath -o "$work/bin/kubectl" \
	-ldflags "-s -w -X k8s.io/component-base/version.gitVersion=$k8s_version -X k8s.io/client-go/pkg/version.gitVersion=$k8s_version" \
	k8s.io/kubernetes/cmd/kubectl >&2)

log "Debian $suite: $(echo "$closure" | wc -l) packages"
mapfile -t pinned <<<"$closure"
debroot "$work" "${pinned[@]}"

log "packing the image"
(cd "$repo" && go build -o "$work/kubeovnimage" ./hack/kubeovnimage)
"$work/kubeovnimage" -o "$work/layout" -debs "$work/debroot" -bin "$work/bin" -dist "$work/src/dist/images" -tag "$version"
chmod 0755 "$work/layout"
mv -T "$work/layout" "$out" 2>/dev/null || [[ -f "$out/index.json" ]] || die "cannot move the layout to $out"
echo "$out"
