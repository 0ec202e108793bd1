package bmc

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"time"
)

// ipmi is a Controller over IPMI 2.0 (RMCP+, "lanplus") through
// ipmitool, Debian's IPMI client: it negotiates the cipher suites and
// session privileges that BMCs of twenty years differ in. The password
// goes to it in its environment (-E), never on a command line that `ps`
// shows.
type ipmi struct {
	target Target
	host   string
	port   string
	// cipher is the RMCP+ cipher suite the BMC took: 17 (HMAC-SHA256,
	// AES-128) where it can, else 3 (HMAC-SHA1, AES-128), which every
	// IPMI 2.0 BMC has. Named rather than negotiated: ipmitool asks the
	// BMC for its suites first, and a BMC that does not answer that
	// (OpenIPMI's) costs ~10 s on every command.
	cipher string
}

// cipherSuites are tried in order, strongest first.
var cipherSuites = []string{"17", "3"}

// IPMITool is the ipmitool binary (Debian package ipmitool).
var IPMITool = "ipmitool"

func dialIPMI(ctx context.Context, t Target) (*ipmi, error) {
	if t.DialContext != nil {
		return nil, fmt.Errorf("%s: IPMI runs ipmitool, which cannot use a custom dialer: run the command inside the BMC's network namespace", t.Address)
	}
	if _, err := exec.LookPath(IPMITool); err != nil {
		return nil, fmt.Errorf("%s: IPMI needs ipmitool (Debian package ipmitool): %w", t.Address, err)
	}
	host, port, err := net.SplitHostPort(t.Address.Endpoint)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", t.Address, err)
	}
	// Open a session once, so that an unreachable BMC or wrong
	// credentials fail here, as for Redfish, and to find the cipher suite.
	for _, cs := range cipherSuites {
		i := &ipmi{target: t, host: host, port: port, cipher: cs}
		if _, err = i.PowerState(ctx); err == nil {
			return i, nil
		}
		if errors.Is(err, context.DeadlineExceeded) {
			break // nothing answers: another suite will not either
		}
	}
	return nil, err
}

// run runs one ipmitool command. ipmitool retries each request itself:
// -N seconds apart, -R times, within the Target's timeout.
func (i *ipmi) run(ctx context.Context, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, i.target.Timeout)
	defer cancel()
	per := max(1, int(math.Ceil(i.target.Timeout.Seconds()/3)))
	base := []string{"-I", "lanplus", "-C", i.cipher, "-H", i.host, "-p", i.port, "-U", i.target.Credentials.Username, "-E", "-N", strconv.Itoa(per), "-R", "2"}
	cmd := exec.CommandContext(ctx, IPMITool, append(base, args...)...)
	cmd.Env = append(os.Environ(), "IPMI_PASSWORD="+i.target.Credentials.Password)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	if ctx.Err() != nil {
		return "", fmt.Errorf("%s: %s: the BMC did not answer in time (is IPMI over LAN on at this address?): %w", i.target.Address, strings.Join(args, " "), ctx.Err())
	}
	if err != nil {
		return "", i.explain(args, stderr.String(), err)
	}
	return stdout.String(), nil
}

// explain turns ipmitool's stderr into a message that says what to do.
func (i *ipmi) explain(args []string, stderr string, err error) error {
	what := strings.Join(args, " ")
	msg := lastLine(stderr)
	switch {
	case strings.Contains(stderr, "Unable to establish IPMI v2 / RMCP+ session"):
		return fmt.Errorf("%s: %s: no IPMI session: wrong credentials, IPMI over LAN off, or nothing answers IPMI at this address (%s)", i.target.Address, what, msg)
	case strings.Contains(stderr, "Insufficient privilege"), strings.Contains(stderr, "privilege"):
		return fmt.Errorf("%s: %s: the BMC user may not do this: give it the operator or administrator role (%s)", i.target.Address, what, msg)
	case msg != "":
		return fmt.Errorf("%s: %s: %s", i.target.Address, what, msg)
	default:
		return fmt.Errorf("%s: %s: ipmitool: %w", i.target.Address, what, err)
	}
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return strings.TrimSpace(lines[len(lines)-1])
}

func (i *ipmi) Close() {}

func (i *ipmi) Address() Address { return i.target.Address }

func (i *ipmi) PowerState(ctx context.Context) (PowerState, error) {
	out, err := i.run(ctx, "chassis", "power", "status")
	if err != nil {
		return "", err
	}
	return ParseIPMIPower(out)
}

// ParseIPMIPower reads `ipmitool chassis power status`.
func ParseIPMIPower(out string) (PowerState, error) {
	switch strings.TrimSpace(out) {
	case "Chassis Power is on":
		return PowerOn, nil
	case "Chassis Power is off":
		return PowerOff, nil
	}
	return "", fmt.Errorf("not a chassis power status: %q", truncate(out, 40))
}

func truncate(s string, n int) string {
	if len(s) > n {
		return s[:n] + "…"
	}
	return s
}

func (i *ipmi) Power(ctx context.Context, a Action) error {
	state, err := i.PowerState(ctx)
	if err != nil {
		return err
	}
	var cmd string
	switch a {
	case On:
		if state == PowerOn {
			return nil
		}
		cmd = "on"
	case Off, Soft:
		if state == PowerOff {
			return nil
		}
		cmd = map[Action]string{Off: "off", Soft: "soft"}[a]
	case Cycle:
		// IPMI's power cycle is refused for a machine that is off.
		cmd = map[bool]string{true: "cycle", false: "on"}[state == PowerOn]
	case Reset:
		if state != PowerOn {
			return fmt.Errorf("%s: the machine is off; a reset needs it on: use on or cycle", i.target.Address)
		}
		cmd = "reset"
	default:
		_, err := ParseAction(string(a))
		return err
	}
	if _, err = i.run(ctx, "chassis", "power", cmd); err != nil || cmd != "cycle" {
		return err
	}
	// A BMC cycles power in the background (off, a second or more, on):
	// return once it is on again, as a caller of cycle expects.
	ctx, cancel := context.WithTimeout(ctx, i.target.Timeout)
	defer cancel()
	for {
		if state, err := i.PowerState(ctx); err == nil && state == PowerOn {
			return nil
		}
		if err := sleep(ctx, 500*time.Millisecond); err != nil {
			return fmt.Errorf("%s: power cycle: not on again within %s", i.target.Address, i.target.Timeout)
		}
	}
}

// BootPXEOnce sets the boot device for the next boot only: IPMI's boot
// flags without the persistent bit, cleared by the BMC once used.
func (i *ipmi) BootPXEOnce(ctx context.Context) (BootChange, error) {
	prev, err := i.boot(ctx)
	if err != nil {
		return BootChange{}, err
	}
	ch := BootChange{Previous: prev, Now: Boot{Target: "Pxe", Enabled: "Once"}}
	_, err = i.run(ctx, "chassis", "bootdev", "pxe")
	return ch, err
}

// SetBoot restores an override: Once and Continuous of Pxe, Hdd or Cd;
// Disabled or None clears it.
func (i *ipmi) SetBoot(ctx context.Context, b Boot) error {
	dev, ok := map[string]string{"Pxe": "pxe", "Hdd": "disk", "Cd": "cdrom", "None": "none", "": "none"}[b.Target]
	if !ok {
		return fmt.Errorf("%s: boot target %q has no IPMI boot device", i.target.Address, b.Target)
	}
	args := []string{"chassis", "bootdev", dev}
	switch {
	case b.Enabled == "Disabled":
		args[2] = "none"
	case b.Enabled == "Continuous" && dev != "none":
		args = append(args, "options=persistent")
	}
	_, err := i.run(ctx, args...)
	return err
}

// boot reads the boot flags (system boot option parameter 5).
func (i *ipmi) boot(ctx context.Context) (Boot, error) {
	out, err := i.run(ctx, "chassis", "bootparam", "get", "5")
	if err != nil {
		return Boot{}, err
	}
	return ParseIPMIBootFlags(out), nil
}

// ParseIPMIBootFlags reads `ipmitool chassis bootparam get 5`, in
// Redfish's words.
func ParseIPMIBootFlags(out string) Boot {
	b := Boot{Target: "None", Enabled: "Disabled"}
	valid, persistent := true, false
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		line := strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(sc.Text()), "- "))
		switch {
		case line == "Boot Flag Invalid":
			valid = false
		case strings.HasPrefix(line, "Options apply to all future boots"):
			persistent = true
		case strings.HasPrefix(line, "Boot Device Selector :"):
			sel := strings.TrimSpace(strings.TrimPrefix(line, "Boot Device Selector :"))
			for prefix, target := range map[string]string{"Force PXE": "Pxe", "Force Boot from default Hard-Drive": "Hdd", "Force Boot from CD/DVD": "Cd"} {
				if strings.HasPrefix(sel, prefix) {
					b.Target = target
				}
			}
		}
	}
	if b.Target != "None" && valid {
		b.Enabled = map[bool]string{true: "Continuous", false: "Once"}[persistent]
	}
	return b
}

// Inspect reads what IPMI tells of the hardware: the system GUID and
// the FRU's product fields. IPMI does not list a host's NICs or disks.
func (i *ipmi) Inspect(ctx context.Context) (Inventory, error) {
	state, err := i.PowerState(ctx)
	if err != nil {
		return Inventory{}, err
	}
	inv := Inventory{PowerState: state, NICs: []NIC{}, Disks: []Disk{}}
	if out, err := i.run(ctx, "mc", "guid"); err == nil {
		inv.UUID = ipmiField(out, "System GUID")
	}
	// A BMC without FRU 0 answers "Device not present": the GUID is then
	// all there is.
	if out, err := i.run(ctx, "fru", "print", "0"); err == nil {
		inv.Manufacturer = ipmiField(out, "Product Manufacturer")
		inv.Model = ipmiField(out, "Product Name")
		inv.SerialNumber = ipmiField(out, "Product Serial")
	}
	return inv, nil
}

// ipmiField reads "Name : value" from ipmitool's output.
func ipmiField(out, name string) string {
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if ok && strings.TrimSpace(k) == name {
			return strings.TrimSpace(v)
		}
	}
	return ""
}
