#!/bin/sh
# udhcpc's hook in the node image: puts the lease's address on the NIC and
# tells /init (/run/udhcpc.env). A lost lease leaves the address alone: the
# node listens on it, and the rack's DHCP server reserves it for this MAC.
# shellcheck disable=SC2154 # udhcpc sets interface, ip, mask, router, dns, domain
case "$1" in
deconfig)
	ip link set "$interface" up
	;;
bound | renew)
	ip addr replace "$ip/${mask:-24}" dev "$interface"
	if [ -n "$router" ]; then
		# shellcheck disable=SC2086 # the first of the routers
		set -- $router
		ip route replace default via "$1" dev "$interface"
	fi
	: >/etc/resolv.conf
	for d in $dns; do echo "nameserver $d" >>/etc/resolv.conf; done
	[ -z "$domain" ] || echo "search $domain" >>/etc/resolv.conf
	echo "ip=$ip mask=${mask:-24}" >/run/udhcpc.env.new
	mv /run/udhcpc.env.new /run/udhcpc.env
	;;
esac
