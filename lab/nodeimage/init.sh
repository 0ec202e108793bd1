#!/bin/sh
# /init of Cozy's emulated Talos node image (lab/nodeimage): PID 1, run by
# busybox. It finds the VM's hardware as Talos would (the boot NIC and its
# DHCP lease, the SMBIOS UUID, the system disk), keeps the node's state on
# that disk, runs cozy-talos-node, and turns the node's exits into real
# power transitions: reboot (the VM netboots again and the node finds its
# config on the disk) or power-off.
#
# Kernel command line: BOOTIF=01-aa-bb-cc-dd-ee-ff picks the NIC (iPXE's
# form; else the first virtio NIC), cozy.debug logs every API request,
# cozy.api_only runs the node without its node services (no kubelet,
# containerd, controllers: the Talos API, etcd and kube-apiserver only).
export PATH=/bin
/bin/busybox --install -s /bin

# Leave the initramfs for a mount of its own before anything else, as
# Talos's init switch_roots out of its initramfs. The kernel refuses
# pivot_root(2) while / is the initial rootfs (it has no parent mount), and
# runc jails every container with pivot_root: without this no pod sandbox
# starts ("pivot_root .: invalid argument"). A bind mount of / moved over /
# is such a mount, and copies nothing; /init then runs again inside it.
if [ "$COZY_ROOT" != bound ]; then
	export COZY_ROOT=bound
	mkdir -p /newroot
	mount -o bind / /newroot && cd /newroot && mount -o move . / && exec chroot . /init
	echo "cozy-node: cannot leave the initramfs root (containers cannot start); going on"
fi

log() { echo "cozy-node: [$(cut -d' ' -f1 /proc/uptime)s] $*"; }

# A machine that cannot come up says why and powers off: the lab sees the
# VM stop and keeps its serial log; rebooting into the same failure would
# only loop.
fail() {
	log "FATAL: $*; powering off"
	sync
	poweroff -f
}

# wait_for TRIES COMMAND...: run COMMAND once a second until it succeeds.
wait_for() {
	tries=$1
	shift
	while ! "$@"; do
		tries=$((tries - 1))
		[ "$tries" -gt 0 ] || return 1
		sleep 1
	done
}

mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
mkdir -p /run /tmp /mnt/disk /dev/pts /dev/shm
mount -t devpts -o gid=5,mode=620,ptmxmode=666 devpts /dev/pts
mount -t tmpfs -o mode=1777 shm /dev/shm
# cgroup v2, as on Talos, with every controller available to the
# kubelet's and containerd's cgroups.
mount -t cgroup2 cgroup2 /sys/fs/cgroup
for c in $(cat /sys/fs/cgroup/cgroup.controllers); do
	echo "+$c" >/sys/fs/cgroup/cgroup.subtree_control || log "cgroup controller $c not enabled"
done
log "kernel $(uname -r) booted; initramfs unpacked"

bootif=
debug=
services=--node-services
for arg in $(cat /proc/cmdline); do
	case "$arg" in
	BOOTIF=*) bootif=$(echo "${arg#BOOTIF=}" | sed 's/^01-//; s/-/:/g' | tr 'A-F' 'a-f') ;;
	cozy.debug) debug=--debug ;;
	cozy.api_only) services= ;;
	esac
done

for m in $(cat /lib/modules/modules.order); do
	insmod "/lib/modules/$m" || log "insmod $m failed"
done

# The boot NIC: BOOTIF's MAC if given, else the first virtio NIC.
boot_nic() {
	for d in /sys/class/net/*; do
		[ "${d##*/}" = lo ] && continue
		if [ -n "$bootif" ]; then
			[ "$(cat "$d/address")" = "$bootif" ] || continue
		else
			case "$(readlink "$d/device/driver")" in */virtio_net) ;; *) continue ;; esac
		fi
		nic=${d##*/}
		return 0
	done
	return 1
}
nic=
wait_for 30 boot_nic || fail "no boot NIC (BOOTIF=${bootif:-none}; NICs: $(ls /sys/class/net | tr '\n' ' '))"
mac=$(cat "/sys/class/net/$nic/address")
log "boot NIC $nic, MAC $mac"

# The address comes from the rack's DHCP server (a reservation per MAC);
# udhcpc stays to renew the lease, and its hook writes /run/udhcpc.env.
ip link set lo up
ip link set "$nic" up
udhcpc -f -i "$nic" -s /etc/udhcpc.script -T 2 -A 3 &
tries=0
until [ -s /run/udhcpc.env ]; do
	tries=$((tries + 1))
	[ $((tries % 60)) -ne 0 ] || log "still no DHCP lease on $nic after ${tries}s"
	sleep 1
done
ip=
mask=
# shellcheck source=/dev/null # written by /etc/udhcpc.script: ip= mask=
. /run/udhcpc.env
log "address $ip/$mask on $nic"

uuid=$(cat /sys/class/dmi/id/product_uuid 2>/dev/null)
log "SMBIOS UUID ${uuid:-none}"
# The machine's identity for the kubelet (its Node's systemUUID and
# machine ID), as Talos derives it.
[ -z "$uuid" ] || echo "$uuid" | tr -d '-' >/etc/machine-id

# Disks: every virtio disk is reported; vda holds the node's state, as
# Talos's system disk holds its config.
wait_for 30 test -e /sys/block/vda || fail "no system disk vda (virtio_blk; disks: $(ls /sys/block | tr '\n' ' '))"
disks=
for d in /sys/block/vd*; do
	name=${d##*/}
	size=$(($(cat "$d/size") * 512))
	serial=$(cat "$d/serial" 2>/dev/null)
	disks="$disks --disk $name:$size:virtio${serial:+::$serial}"
done

# A disk without an ext2/3/4 superblock (magic 0xEF53 at byte 1080) is a
# new machine's: make the filesystem. Anything else on it is this node's.
magic=$(od -An -tx2 -j1080 -N2 /dev/vda | tr -d ' \n')
if [ "$magic" != ef53 ]; then
	log "vda has no filesystem: a new machine; making one"
	# Few inodes: the node keeps a few hundred files, and busybox's mke2fs
	# zeroes every inode table. One inode per MiB is 8192 on the lab's 8
	# GiB disk and 2.6 MB of tables; busybox ignores -N, and its default
	# (one per 16 KiB) meant 128 MB of zeros, 13 s per VM under TCG.
	mke2fs -F -b 4096 -m 0 -i 1048576 -L cozy-node /dev/vda >/dev/null || fail "mke2fs /dev/vda failed"
fi
mount -t ext4 /dev/vda /mnt/disk || fail "cannot mount /dev/vda"
boots=$(($(cat /mnt/disk/boots 2>/dev/null || echo 0) + 1))
echo "$boots" >/mnt/disk/boots
log "vda mounted on /mnt/disk; boot $boots of this disk"

# The state is stopped before the machine goes down: what the node ran
# died with it, so the disk can be unmounted (its system directories
# and pods' mounts first).
release_disk() {
	sync
	for m in $(awk '$2 ~ "^/(var|etc|run)/" { print $2 }' /proc/mounts | sort -r); do
		umount -l "$m" 2>/dev/null
	done
	umount /mnt/disk 2>/dev/null || mount -o remount,ro /mnt/disk
	sync
}

while :; do
	log "starting cozy-talos-node"
	# shellcheck disable=SC2086 # $disks, $services and $debug are lists of flags
	cozy-talos-node --address "$ip/$mask" --mac "$mac" --uuid "$uuid" $disks \
		--state-dir /mnt/disk/node --platform metal $services --cni-bin-dir /opt/cni/bin \
		--reboot exit $debug
	rc=$?
	case $rc in
	0)
		log "powering off"
		release_disk
		poweroff -f
		;;
	@REBOOT_EXIT_CODE@)
		log "rebooting"
		release_disk
		reboot -f
		;;
	*)
		# A crash, not a power transition: restart the node on the same
		# boot, as a service manager would.
		log "cozy-talos-node exited with status $rc; restarting it in 5s"
		sleep 5
		;;
	esac
done
