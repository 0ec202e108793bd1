#!/usr/bin/env bash
# Fetches a Linux kernel that netboot and lab tests boot in QEMU: Debian's
# linux-image-amd64 (through apt, the only package source here), unpacked
# with dpkg -x, never installed. Prints a directory holding:
#
#   vmlinuz            the kernel
#   modules/*.ko       the virtio NIC and disk drivers and ext4 (modules
#                      in Debian's kernel), in load order (modules.order)
#
# Cached in $COZY_CACHE_DIR/boot/<package>_<version>; a cached copy returns
# at once. Written to a temporary directory and renamed, so an interrupted
# run leaves nothing half-done.
set -euo pipefail

cache_root="${COZY_CACHE_DIR:-${HOME:-/root}/.cache/cozy}"
log() { echo "boot-assets: $*" >&2; }

kernel_package() {
	pkg="$(apt-cache depends linux-image-amd64 2>/dev/null | awk '/Depends: linux-image-[0-9]/ { print $2; exit }')"
	version="$(apt-cache policy "$pkg" 2>/dev/null | awk '/Candidate:/ { print $2 }')"
	[[ -n "$pkg" && -n "$version" && "$version" != "(none)" ]]
}
if ! kernel_package; then
	if [[ $(id -u) -ne 0 ]]; then
		log "apt does not know linux-image-amd64; run: sudo apt-get update"
		exit 1
	fi
	apt-get update -qq >&2
	kernel_package || { log "apt has no linux-image-amd64"; exit 1; }
fi
# Bump layout when what this script extracts changes.
layout=3
out="$cache_root/boot/${pkg}_${version}_v${layout}"
if [[ -s "$out/vmlinuz" && -s "$out/modules.order" ]]; then
	echo "$out"
	exit 0
fi

mkdir -p "$cache_root/boot"
work="$(mktemp -d "$cache_root/boot/.fetch.XXXXXX")"
trap 'rm -rf "$work"' EXIT
log "downloading $pkg $version (about 70 MB)"
# apt's sandbox user cannot write to root's temp dirs; download as root.
if ! (cd "$work" && apt-get download -o APT::Sandbox::User=root "$pkg=$version" >&2); then
	# Stale package lists name a version the mirror no longer has.
	[[ $(id -u) -eq 0 ]] || exit 1
	apt-get update -qq >&2
	kernel_package
	(cd "$work" && apt-get download -o APT::Sandbox::User=root "$pkg=$version" >&2)
fi
dpkg -x "$work"/*.deb "$work/x"

mkdir -p "$work/out/modules"
cp "$work/x/boot/vmlinuz-"* "$work/out/vmlinuz"
moddir="$(echo "$work"/x/lib/modules/*)"
# virtio-net, virtio-blk and ext4 (which also mounts ext2) with what they
# depend on, in dependency order: the modules' own depends= and softdep=
# (the package ships no modules.dep). virtio needs virtio_ring's symbols;
# ext4 needs jbd2, mbcache and crc16, and crc32c through the crypto API
# (crc32c_generic: crc32c-intel needs SSE4.2, which TCG's default CPU
# lacks).
for m in drivers/virtio/virtio_ring.ko drivers/virtio/virtio.ko \
	drivers/virtio/virtio_pci_legacy_dev.ko drivers/virtio/virtio_pci_modern_dev.ko \
	drivers/virtio/virtio_pci.ko net/core/failover.ko drivers/net/net_failover.ko \
	drivers/net/virtio_net.ko drivers/block/virtio_blk.ko \
	crypto/crc32c_generic.ko lib/crc16.ko fs/mbcache.ko fs/jbd2/jbd2.ko fs/ext4/ext4.ko; do
	cp "$moddir/kernel/$m" "$work/out/modules/"
	basename "$m" >>"$work/out/modules.order"
done
rm -rf "$out"
mv "$work/out" "$out"
log "kernel $(basename "$moddir") in $out"
echo "$out"
