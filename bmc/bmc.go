package bmc

import (
	"context"
	"fmt"
	"net"
	"time"
)

// PowerState is a system's power as its BMC reports it.
type PowerState string

// The states Redfish reports (PowerState in ComputerSystem).
const (
	PowerOn          PowerState = "On"
	PowerOff         PowerState = "Off"
	PowerPoweringOn  PowerState = "PoweringOn"
	PowerPoweringOff PowerState = "PoweringOff"
)

// Action is a power action of `cozyctl machine power`.
type Action string

// The actions, in the words Rufio and ipmitool use.
const (
	// On powers an off machine on; an on machine is left alone.
	On Action = "on"
	// Off cuts power at once (Redfish ForceOff).
	Off Action = "off"
	// Soft asks the operating system to shut down (GracefulShutdown).
	Soft Action = "soft"
	// Cycle powers off and on again; an off machine is powered on.
	Cycle Action = "cycle"
	// Reset restarts without removing power (ForceRestart).
	Reset Action = "reset"
)

// Actions lists the actions, for help and validation.
var Actions = []Action{On, Off, Soft, Cycle, Reset}

// ParseAction checks an action name.
func ParseAction(s string) (Action, error) {
	for _, a := range Actions {
		if string(a) == s {
			return a, nil
		}
	}
	return "", fmt.Errorf("unknown power action %q: use one of on, off, soft, cycle, reset", s)
}

// Boot is a system's boot source override.
type Boot struct {
	// Target is the override device (Pxe, UefiHttp, Hdd, None, …).
	Target string `json:"target"`
	// Enabled is Disabled, Once or Continuous.
	Enabled string `json:"enabled"`
}

// BootChange is what BootPXEOnce did.
type BootChange struct {
	// Previous is the override before the change, to restore when the
	// BMC could not set a one-time boot.
	Previous Boot `json:"previous"`
	// Now is the override set.
	Now Boot `json:"now"`
	// Fallback says the BMC refused Once and Continuous was set: the
	// caller restores Previous once the machine has netbooted.
	Fallback bool `json:"fallback,omitempty"`
}

// Inventory is a system's hardware as its BMC reports it.
type Inventory struct {
	Manufacturer string     `json:"manufacturer,omitempty"`
	Model        string     `json:"model,omitempty"`
	SerialNumber string     `json:"serialNumber,omitempty"`
	UUID         string     `json:"uuid,omitempty"`
	BIOSVersion  string     `json:"biosVersion,omitempty"`
	PowerState   PowerState `json:"powerState"`
	CPUs         int        `json:"cpus"`
	CPUModel     string     `json:"cpuModel,omitempty"`
	MemoryGiB    float64    `json:"memoryGiB"`
	NICs         []NIC      `json:"nics"`
	Disks        []Disk     `json:"disks"`
}

// NIC is one network interface.
type NIC struct {
	Name string `json:"name"`
	MAC  string `json:"mac"`
	// LinkStatus is LinkUp, LinkDown or NoLink, when the BMC knows.
	LinkStatus string `json:"linkStatus,omitempty"`
}

// Disk is one drive.
type Disk struct {
	Name          string `json:"name"`
	CapacityBytes int64  `json:"capacityBytes"`
	Model         string `json:"model,omitempty"`
	SerialNumber  string `json:"serialNumber,omitempty"`
}

// Controller is one machine's BMC. Every call is bounded by the
// timeout it was dialled with as well as by ctx.
type Controller interface {
	PowerState(ctx context.Context) (PowerState, error)
	// Power runs an action; On of an on machine and Off of an off one do
	// nothing.
	Power(ctx context.Context, a Action) error
	// BootPXEOnce makes the next boot a network boot.
	BootPXEOnce(ctx context.Context) (BootChange, error)
	// SetBoot restores an override BootPXEOnce replaced.
	SetBoot(ctx context.Context, b Boot) error
	Inspect(ctx context.Context) (Inventory, error)
	// Address is the BMC's address with the system it drives.
	Address() Address
	Close()
}

// Target is everything needed to reach one BMC.
type Target struct {
	Address     Address
	Credentials Credentials
	// InsecureSkipVerify accepts any TLS certificate (BMCs often have
	// self-signed ones).
	InsecureSkipVerify bool
	// Timeout bounds each request; 0 means DefaultTimeout.
	Timeout time.Duration
	// DialContext, if set, opens connections to the BMC (tests and the
	// lab dial inside a network namespace).
	DialContext func(ctx context.Context, network, addr string) (net.Conn, error)
}

// DefaultTimeout bounds one request to a BMC: long enough for slow BMCs,
// which take seconds on power actions, short enough that a dead one does
// not hold up a rack.
const DefaultTimeout = 30 * time.Second

// Dial connects to a BMC.
func Dial(ctx context.Context, t Target) (Controller, error) {
	if t.Timeout == 0 {
		t.Timeout = DefaultTimeout
	}
	switch t.Address.Protocol {
	case Redfish:
		return dialRedfish(ctx, t)
	case IPMI:
		return dialIPMI(ctx, t)
	default:
		return nil, fmt.Errorf("%s: unknown BMC protocol %q", t.Address, t.Address.Protocol)
	}
}
