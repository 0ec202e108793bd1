#!/bin/sh
# /init of Cozy's tenant worker image (tenant/workerimage): PID 1, run by
# busybox. It brings up what a kubeadm node needs (kernel modules,
# cgroup v2, the first NIC's DHCP lease, containerd), mounts the cloud-init
# disk KubeVirt attaches (a NoCloud seed, labelled cidata, or a config
# drive, labelled config-2, which CAPK's VMs get) and hands over to
# cozy-worker, which applies the seed (kubeadm join) and runs the kubelet.
# The whole root file system, containerd's images included, is in RAM.
export PATH=/bin:/usr/bin:/sbin:/usr/sbin
/bin/busybox --install -s /bin

# runc jails containers with pivot_root(2), which the initial rootfs
# refuses: leave it for a bind mount of itself (as the lab's node does).
if [ "$COZY_ROOT" != bound ]; then
	export COZY_ROOT=bound
	mkdir -p /newroot
	mount -o bind / /newroot && cd /newroot && mount -o move . / && exec chroot . /init
	echo "cozy-worker: cannot leave the initramfs root (containers cannot start); going on"
fi

log() { echo "cozy-worker: [$(cut -d' ' -f1 /proc/uptime)s] $*"; }
fail() {
	log "FATAL: $*; powering off"
	sync
	poweroff -f
}

mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
mkdir -p /run /tmp /dev/pts /dev/shm /var /etc/kubernetes/manifests
mount -t devpts -o gid=5,mode=620,ptmxmode=666 devpts /dev/pts
mount -t tmpfs -o mode=1777 shm /dev/shm
mount -t tmpfs -o mode=0755 run /run
mkdir -p /run/seed
# The kubelet's and containerd's state on a tmpfs: the kubelet (cAdvisor)
# cannot size the initial root file system ("rootfs") it would otherwise
# be on, and refuses to start.
mount -t tmpfs -o mode=0755 var /var
mkdir -p /var/lib /var/log
ln -sfn /run /var/run
mount -t cgroup2 cgroup2 /sys/fs/cgroup
for c in $(cat /sys/fs/cgroup/cgroup.controllers); do
	echo "+$c" >/sys/fs/cgroup/cgroup.subtree_control || log "cgroup controller $c not enabled"
done
log "kernel $(uname -r) booted; Kubernetes @VERSION@"
# kubeadm's preflight reads the kernel's configuration from here.
ln -sfn config "/boot/config-$(uname -r)"

for m in $(cat /lib/modules/modules.order); do
	insmod "/lib/modules/$m" || log "insmod $m failed"
done
sysctl -qw net.ipv4.ip_forward=1 net.ipv6.conf.all.forwarding=1 \
	net.bridge.bridge-nf-call-iptables=1 net.bridge.bridge-nf-call-ip6tables=1 || log "sysctl failed"

# The machine ID the kubelet reports: the VM's SMBIOS UUID (KubeVirt sets
# it per VM), else one made now.
uuid=$(cat /sys/class/dmi/id/product_uuid 2>/dev/null)
[ -n "$uuid" ] || uuid=$(cat /proc/sys/kernel/random/uuid)
echo "$uuid" | tr -d '-' >/etc/machine-id

# The first NIC takes its address by DHCP (KubeVirt's masquerade and
# bridge bindings both serve one); udhcpc stays to renew it.
nic=
tries=0
while [ -z "$nic" ]; do
	for d in /sys/class/net/*; do
		case "${d##*/}" in lo) continue ;; esac
		[ -e "$d/device" ] && nic=${d##*/} && break
	done
	[ -n "$nic" ] && break
	tries=$((tries + 1))
	[ "$tries" -lt 30 ] || fail "no NIC (have: $(ls /sys/class/net | tr '\n' ' '))"
	sleep 1
done
ip link set lo up
ip link set "$nic" up
udhcpc -f -i "$nic" -s /etc/udhcpc.script -T 2 -A 3 &
tries=0
until [ -s /run/udhcpc.env ]; do
	tries=$((tries + 1))
	[ $((tries % 60)) -ne 0 ] || log "still no DHCP lease on $nic after ${tries}s"
	sleep 1
done
. /run/udhcpc.env
log "address $ip/$mask on $nic"

# The seed: the block device whose file system is labelled cidata or
# config-2
# (Debian's busybox has no blkid): an ISO 9660 primary volume descriptor's
# volume ID (KubeVirt's seed), or a FAT boot sector's label (FAT32's,
# then FAT12/16's), one per line.
label() {
	if [ "$(dd if="$1" bs=1 skip=32769 count=5 2>/dev/null)" = CD001 ]; then
		dd if="$1" bs=1 skip=32808 count=32 2>/dev/null
	else
		dd if="$1" bs=1 skip=71 count=11 2>/dev/null
		echo
		dd if="$1" bs=1 skip=43 count=11 2>/dev/null
	fi
	echo
}
seed=
tries=0
while [ -z "$seed" ]; do
	for d in /sys/class/block/*; do
		dev=/dev/${d##*/}
		label "$dev" | tr -d ' \000' | tr 'A-Z' 'a-z' | grep -qxE 'cidata|config-2' && seed=$dev && break
	done
	[ -n "$seed" ] && break
	tries=$((tries + 1))
	[ "$tries" -lt 30 ] || fail "no cloud-init disk (a volume labelled cidata or config-2) among $(ls /sys/class/block | tr '\n' ' ')"
	sleep 1
done
mount -o ro "$seed" /run/seed || fail "cannot mount the cloud-init disk $seed"
log "cloud-init disk $seed"

containerd >/var/log/containerd.log 2>&1 &
tries=0
until [ -S /run/containerd/containerd.sock ]; do
	tries=$((tries + 1))
	[ "$tries" -lt 120 ] || fail "containerd did not start: $(tail -5 /var/log/containerd.log)"
	sleep 1
done
log "containerd is up"

cozy-worker --seed /run/seed --kubelet /bin/kubelet
fail "cozy-worker exited with status $?"
