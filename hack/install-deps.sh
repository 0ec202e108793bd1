#!/usr/bin/env bash
# Installs the Debian packages Cozy's tests need. As root it runs apt-get
# for whatever is missing; otherwise it names the missing packages and
# fails, so a test run never starts without them.
set -euo pipefail

packages=(
	git             # the version stamp of `make build`; gittestserver later
	make
	ca-certificates
	iproute2        # network namespaces and veth pairs for network tests
	qemu-system-x86 # VMs that PXE-boot in the netboot and lab tests
	qemu-utils      # qemu-img: qcow2 disks of lab VMs
	ovmf            # UEFI firmware for those VMs
	ipxe-qemu       # QEMU's NIC boot ROMs (iPXE)
	qemu-system-arm  # an arm64 VM that PXE-boots in the netboot test
	qemu-efi-aarch64 # its UEFI firmware (AAVMF)
	radvd           # lab: tells iPXE there is no IPv6 router (it waits ~13 s per boot otherwise)
	nftables        # lab --internet: NAT out of the lab's namespace (TestInternet)
	procps          # sysctl, for that NAT's IPv4 forwarding
	ipxe            # undionly.kpxe, ipxe.efi, snponly.efi served by cozyctl pxe serve
	busybox-static  # the userland of test initramfs images
	kmod            # modinfo: hack/boot-assets.sh orders the node image's kernel modules
	dnsmasq-base    # a real DHCP server for proxy mode to run beside
	isc-dhcp-client # dhclient, a real DHCP client for full mode
	isc-dhcp-relay  # dhcrelay, a real relay agent (giaddr, option 82)
	cpio            # cross-checks the initramfs writer
	jq              # hack/flux-controllers.sh reads upstream go.mod replaces
	skopeo          # reads and copies the operator image archive (make image) in its test
	umoci           # unpacks that image into a runtime bundle
	runc            # runs it, as a container runtime would
	ipmitool        # Cozy's IPMI client (ipmi:// BMCs)
	openipmi        # ipmi_sim: an IPMI BMC that is not Cozy's, to test that client against
	python3-sushy   # OpenStack Ironic's Redfish client, to test the lab's BMC against
	xorriso         # the bootable ISO inside Cozy's tenant worker disk (hack/worker-image.sh)
	conntrack       # in that disk: kubeadm's preflight needs it before Kubernetes 1.32
	iptables        # in that disk: kubeadm's preflight needs it before 1.31, CNIs at any version
)

# `hack/install-deps.sh bench` adds the peers `make bench` compares with.
if [[ "${1:-}" == bench ]]; then
	packages+=(
		kea-admin        # perfdhcp
		kea-dhcp4-server # Kea, the DHCP peer
		nginx-light      # the HTTP peer
	)
fi

missing=()
for p in "${packages[@]}"; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]} == 0)); then
	exit 0
fi
if [[ $(id -u) -ne 0 ]]; then
	echo "install-deps: missing Debian packages: ${missing[*]}" >&2
	echo "install-deps: run: sudo apt-get install -y ${missing[*]}" >&2
	exit 1
fi
echo "install-deps: installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq >&2
# Install daemons without starting them: nothing may answer on this
# machine's networks except inside the tests' own namespaces.
policy=/usr/sbin/policy-rc.d
created_policy=
if [[ ! -e $policy ]]; then
	printf '#!/bin/sh\nexit 101\n' >"$policy" && chmod +x "$policy" && created_policy=1
fi
trap '[[ -n $created_policy ]] && rm -f "$policy"' EXIT
apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
