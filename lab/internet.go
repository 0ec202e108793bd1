package lab

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"hash/fnv"
	"net/netip"
	"os"
	"os/exec"
	"strings"
)

// The way out of a lab with --internet (real Talos pulls its installer):
//
//	VM 192.168.77.x → br0 [lab namespace] up0 ──veth── czl<hash> [this machine] → its own route out
//	                   masquerade to up0's address      masquerade to the machine's address
//
// The lab's side is NATed first, so this machine needs no route to the
// lab's subnet, which every lab shares; its side is NATed again on the
// way out. Both rules live in an nftables table of the lab's own
// (cozy-lab-<name>), removed with the lab. Without --internet none of
// this exists and nothing leaves the namespace.

// uplink names the veth pair of lab name and its /30: this machine's end
// (hostIP) and the lab's (labIP), from a hash of the name, so labs differ.
func uplink(name string) (hostIf string, hostIP, labIP netip.Prefix) {
	h := fnv.New32a()
	h.Write([]byte(name))
	sum := h.Sum32()
	// 100.77.0.0/16 (shared address space, RFC 6598): /30s, 16,384 of them.
	n := sum % 16384 * 4
	base := netip.AddrFrom4([4]byte{100, 77, byte(n >> 8), byte(n)})
	return fmt.Sprintf("czl%08x", sum), netip.PrefixFrom(base.Next(), 30), netip.PrefixFrom(base.Next().Next(), 30)
}

// labUplink is the lab's end of the veth pair, inside its namespace.
const labUplink = "up0"

// enableInternet gives lab name's namespace a way out through outside
// (a network namespace; "" is this machine's own). It turns on IPv4
// forwarding in both and leaves it on in outside when it was off.
func enableInternet(ctx context.Context, name, outside string) error {
	ns := Namespace(name)
	hostIf, hostIP, labIP := uplink(name)
	steps := [][]string{
		inNetns(outside, "link", "add", hostIf, "type", "veth", "peer", "name", labUplink, "netns", ns),
		inNetns(outside, "addr", "add", hostIP.String(), "dev", hostIf),
		inNetns(outside, "link", "set", hostIf, "up"),
		{"-n", ns, "addr", "add", labIP.String(), "dev", labUplink},
		{"-n", ns, "link", "set", labUplink, "up"},
		{"-n", ns, "route", "add", "default", "via", hostIP.Addr().String()},
	}
	for _, s := range steps {
		if err := ip(ctx, s...); err != nil {
			return fmt.Errorf("--internet: %w", err)
		}
	}
	for _, netns := range []string{ns, outside} {
		if err := runIn(ctx, netns, nil, "sysctl", "-q", "-w", "net.ipv4.ip_forward=1"); err != nil {
			return fmt.Errorf("--internet: %w", err)
		}
	}
	table := natTable(name)
	lab := fmt.Sprintf(`table ip %s {
	chain postrouting {
		type nat hook postrouting priority srcnat; policy accept;
		oifname %q ip saddr %s masquerade
	}
}
`, table, labUplink, Subnet)
	host := fmt.Sprintf(`table ip %s {
	chain postrouting {
		type nat hook postrouting priority srcnat; policy accept;
		ip saddr %s oifname != %q masquerade
	}
	chain forward {
		type filter hook forward priority filter; policy accept;
		iifname %q accept
		oifname %q ct state established,related accept
	}
}
`, table, labIP.Addr(), hostIf, hostIf, hostIf)
	for _, r := range []struct{ netns, rules string }{{ns, lab}, {outside, host}} {
		if err := runIn(ctx, r.netns, []byte(r.rules), "nft", "-f", "-"); err != nil {
			return fmt.Errorf("--internet: %w", err)
		}
	}
	return nil
}

// disableInternet removes what enableInternet made in outside: the
// nftables table and the veth pair (the lab's end goes with its
// namespace). Running it for a lab without --internet, or twice, is
// harmless.
func disableInternet(ctx context.Context, name, outside string) error {
	hostIf, _, _ := uplink(name)
	table := natTable(name)
	if err := runIn(ctx, outside, nil, "nft", "list", "table", "ip", table); err == nil {
		if err := runIn(ctx, outside, nil, "nft", "delete", "table", "ip", table); err != nil {
			return err
		}
	}
	if exec.CommandContext(ctx, "ip", inNetns(outside, "link", "show", hostIf)...).Run() == nil {
		return ip(ctx, inNetns(outside, "link", "del", hostIf)...)
	}
	return nil
}

// natTable is the nftables table of lab name's --internet, on both sides.
func natTable(name string) string { return "cozy-lab-" + name }

// inNetns prefixes ip's arguments to act in network namespace netns (""
// is this machine's own).
func inNetns(netns string, args ...string) []string {
	if netns == "" {
		return args
	}
	return append([]string{"-n", netns}, args...)
}

// runIn runs a command inside network namespace netns ("" is this
// machine's own), with stdin.
func runIn(ctx context.Context, netns string, stdin []byte, name string, args ...string) error {
	if netns != "" {
		args = append([]string{"netns", "exec", netns, name}, args...)
		name = "ip"
	}
	var stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Stdin = bytes.NewReader(stdin)
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("%s %s: %v: %s", name, strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return nil
}

// resolvers are the DNS servers the lab's VMs get with --internet: this
// machine's, unless they are on loopback (a local stub the VMs cannot
// reach), then Cloudflare's and Google's public ones.
func resolvers() []string {
	var out []string
	if f, err := os.Open("/etc/resolv.conf"); err == nil {
		defer f.Close()
		s := bufio.NewScanner(f)
		for s.Scan() {
			fields := strings.Fields(s.Text())
			if len(fields) >= 2 && fields[0] == "nameserver" {
				if a, err := netip.ParseAddr(fields[1]); err == nil && a.Is4() && !a.IsLoopback() {
					out = append(out, a.String())
				}
			}
		}
	}
	if len(out) == 0 {
		out = []string{"1.1.1.1", "8.8.8.8"}
	}
	return out
}
