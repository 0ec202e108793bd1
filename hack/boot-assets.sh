#!/usr/bin/env bash
# Fetches a Linux kernel that netboot and lab tests boot in QEMU: Debian's
# linux-image-amd64 (through apt, the only package source here), unpacked
# with dpkg -x, never installed. Prints a directory holding:
#
#   vmlinuz            the kernel
#   config             the kernel's configuration (its /boot/config-*)
#   modules/*.ko       the virtio NIC and disk drivers and ext4 (modules
#                      in Debian's kernel), in load order (modules.order)
#
# `hack/boot-assets.sh arm64` prints the same for an arm64 VM (Debian 12's
# linux-image-arm64, NIC drivers only), plus what an amd64 host lacks for
# it: busybox (busybox-static:arm64) and ipxe-arm64.efi (Debian 13's ipxe,
# the first to ship it). Those come through apt too, with a configuration
# of their own under the cache (arm64 indexes, Debian 13's suite), so the
# host's apt setup is left as it is.
#
# Cached in $COZY_CACHE_DIR/boot/<package>_<version>; a cached copy returns
# at once. Written to a temporary directory and renamed, so an interrupted
# run leaves nothing half-done.
set -euo pipefail

cache_root="${COZY_CACHE_DIR:-${HOME:-/root}/.cache/cozy}"
log() { echo "boot-assets: $*" >&2; }

# The virtio NIC's modules, in load order: virtio-net needs virtio_ring's
# symbols (virtio and virtio_ring are built into Debian's arm64 kernel).
nic_modules=(drivers/virtio/virtio_ring.ko drivers/virtio/virtio.ko
	drivers/virtio/virtio_pci_legacy_dev.ko drivers/virtio/virtio_pci_modern_dev.ko
	drivers/virtio/virtio_pci.ko net/core/failover.ko drivers/net/net_failover.ko
	drivers/net/virtio_net.ko)

# copy_modules MODDIR OUT MODULE...: copies each module (a path under
# MODDIR/kernel) into OUT/modules and lists it in OUT/modules.order, in
# the order given; a module built into this kernel is left out.
copy_modules() {
	local moddir="$1" out="$2" m
	shift 2
	mkdir -p "$out/modules"
	: >"$out/modules.order"
	for m in "$@"; do
		if [[ -f "$moddir/kernel/$m" ]]; then
			cp "$moddir/kernel/$m" "$out/modules/"
			basename "$m" >>"$out/modules.order"
		elif ! grep -qx "kernel/$m" "$moddir/modules.builtin"; then
			log "$(basename "$moddir") has no module $m"
			return 1
		fi
	done
}

if [[ "${1:-amd64}" == arm64 ]]; then
	apt_dir="$cache_root/apt-arm64"
	mkdir -p "$apt_dir/lists/partial" "$apt_dir/archives/partial"
	keyring=/usr/share/keyrings/debian-archive-keyring.gpg
	cat >"$apt_dir/sources.list" <<-EOF
		deb [signed-by=$keyring] http://deb.debian.org/debian bookworm main
		deb [signed-by=$keyring] http://deb.debian.org/debian trixie main
	EOF
	apt_opts=(-o APT::Architecture=arm64 -o APT::Architectures::=arm64
		-o Dir::State::Lists="$apt_dir/lists" -o Dir::Cache="$apt_dir"
		-o Dir::Cache::archives="$apt_dir/archives" -o Dir::State::status=/dev/null
		-o Dir::Etc::SourceList="$apt_dir/sources.list" -o Dir::Etc::SourceParts=/dev/null
		-o Dir::Etc::Preferences=/dev/null -o Dir::Etc::PreferencesParts=/dev/null
		-o APT::Sandbox::User=root -qq)
	# candidate PKG SUITE: the version of PKG that SUITE has.
	candidate() { apt-cache "${apt_opts[@]}" madison "$1" | awk -v s=" $2/" 'index($0, s) { print $3; exit }'; }
	resolve() {
		kpkg="$(apt-cache "${apt_opts[@]}" show linux-image-arm64/bookworm 2>/dev/null | awk '/^Depends: linux-image-[0-9]/ { sub(",", "", $2); print $2; exit }')"
		[[ -n "$kpkg" ]] || return 1
		kver="$(candidate "$kpkg" bookworm)" bver="$(candidate busybox-static bookworm)" iver="$(candidate ipxe trixie)"
		[[ -n "$kver" && -n "$bver" && -n "$iver" ]]
	}
	if ! resolve; then
		log "updating the arm64 package lists in $apt_dir"
		apt-get "${apt_opts[@]}" update >&2
		resolve || { log "Debian's mirror has no arm64 kernel, busybox-static or ipxe"; exit 1; }
	fi
	layout=1
	out="$cache_root/boot/${kpkg}_${kver}_busybox_${bver}_ipxe_${iver}_v${layout}"
	out="${out//:/_}" # epochs (1:1.35.0): keep colons out of paths
	if [[ -s "$out/vmlinuz" && -s "$out/ipxe-arm64.efi" && -s "$out/busybox" ]]; then
		echo "$out"
		exit 0
	fi
	mkdir -p "$cache_root/boot"
	work="$(mktemp -d "$cache_root/boot/.fetch.XXXXXX")"
	trap 'rm -rf "$work"' EXIT
	log "downloading $kpkg $kver, busybox-static $bver (arm64) and ipxe $iver (about 65 MB)"
	(cd "$work" && apt-get "${apt_opts[@]}" download "$kpkg=$kver" "busybox-static=$bver" "ipxe=$iver" >&2)
	for deb in "$work"/*.deb; do dpkg -x "$deb" "$work/x"; done
	mkdir -p "$work/out"
	cp "$work/x/boot/vmlinuz-"* "$work/out/vmlinuz"
	cp "$work/x/bin/busybox" "$work/out/busybox"
	cp "$work/x/usr/lib/ipxe/ipxe-arm64.efi" "$work/out/ipxe-arm64.efi"
	moddir="$(echo "$work"/x/lib/modules/*)"
	copy_modules "$moddir" "$work/out" "${nic_modules[@]}"
	rm -rf "$out"
	mv "$work/out" "$out"
	log "arm64 kernel $(basename "$moddir") in $out"
	echo "$out"
	exit 0
fi

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
layout=6
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

mkdir -p "$work/out"
cp "$work/x/boot/vmlinuz-"* "$work/out/vmlinuz"
moddir="$(echo "$work"/x/lib/modules/*)"
# The NIC, virtio-blk and ext4 (which also mounts ext2) with what they
# depend on, in dependency order: the modules' own depends= and softdep=
# (the package ships no modules.dep). ext4 needs jbd2, mbcache and crc16,
# and crc32c through the crypto API (crc32c_generic: crc32c-intel needs
# SSE4.2, which TCG's default CPU lacks).
copy_modules "$moddir" "$work/out" "${nic_modules[@]}" drivers/block/virtio_blk.ko \
	crypto/crc32c_generic.ko lib/crc16.ko fs/mbcache.ko fs/jbd2/jbd2.ko fs/ext4/ext4.ko
# What a Kubernetes node needs beyond that, each after the modules it
# depends on (modinfo's depends=): overlayfs for containerd's snapshots;
# bridge, veth and vxlan for the CNI (flannel); nf_tables and the
# xtables matches that kube-proxy (nftables mode) and flannel (iptables
# through nft) use; conntrack's netlink for the conntrack tool.
# kube-proxy writes its tables in the ip and ip6 families, not inet, so
# its `reject` and `fib` need the per-family modules (nft_reject_inet
# serves only inet tables): without nft_reject_ipv4 every sync of its
# ruleset fails whole, and no Service's ClusterIP answers. The kernel
# cannot load a missing one on demand: the initramfs has no modprobe.
k8s_modules=(overlay bridge br_netfilter veth vxlan nf_tables nft_ct nft_nat nft_masq nft_chain_nat
	nft_compat nft_numgen nft_fib_inet nft_fib_ipv4 nft_fib_ipv6 nft_reject_inet nft_reject_ipv4
	nft_reject_ipv6 nft_redir nft_limit nft_objref nf_conntrack_netlink
	xt_conntrack xt_comment xt_mark xt_MASQUERADE xt_addrtype xt_multiport xt_statistic xt_nat xt_tcpudp
	xt_physdev ipt_REJECT ip6t_REJECT
	isofs) # the NoCloud seed KubeVirt gives a tenant worker (tenant/workerimage)
# add_module NAME: NAME's dependencies, then NAME, once each.
declare -A added=()
add_module() {
	local name="$1" file dep
	[[ -n "${added[$name]:-}" ]] && return 0
	added[$name]=1
	file="$(find "$moddir/kernel" -name "$name.ko" | head -1)"
	if [[ -z "$file" ]]; then
		grep -q "/$name.ko\$" "$moddir/modules.builtin" && return 0
		log "$(basename "$moddir") has no module $name"
		return 1
	fi
	for dep in $(modinfo -F depends "$file" | tr ',' ' '); do
		add_module "$dep"
	done
	grep -qx "$name.ko" "$work/out/modules.order" && return 0
	cp "$file" "$work/out/modules/"
	echo "$name.ko" >>"$work/out/modules.order"
}
for m in "${k8s_modules[@]}"; do
	add_module "$m"
done
# The kernel's configuration, as /boot/config-<release> holds it: kubeadm's
# preflight checks (SystemVerification) read it on a tenant worker.
cp "$work/x/boot/config-"* "$work/out/config"
rm -rf "$out"
mv "$work/out" "$out"
log "kernel $(basename "$moddir") in $out"
echo "$out"
