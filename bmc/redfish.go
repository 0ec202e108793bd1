package bmc

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/stmcginnis/gofish"
	"github.com/stmcginnis/gofish/schemas"
)

// redfish is a Controller over a Redfish service, through gofish: it
// knows the quirks of real BMCs (system discovery, reset types offered
// through AllowableValues or ActionInfo, task monitors, the Settings
// resource iDRAC patches boot through).
type redfish struct {
	target Target
	api    *gofish.APIClient
	// system is the ComputerSystem's path, fetched anew by every call so
	// that power state and allowed values are current.
	system string
}

func dialRedfish(ctx context.Context, t Target) (*redfish, error) {
	dial := t.DialContext
	if dial == nil {
		dial = (&net.Dialer{Timeout: t.Timeout}).DialContext
	}
	transport := &http.Transport{
		DialContext:         dial,
		TLSHandshakeTimeout: t.Timeout,
		TLSClientConfig:     &tls.Config{MinVersion: tls.VersionTLS12, InsecureSkipVerify: t.InsecureSkipVerify}, //nolint:gosec // the rack's choice, for self-signed BMCs
		ForceAttemptHTTP2:   true,
	}
	cfg := gofish.ClientConfig{
		Endpoint: t.Address.Endpoint,
		Username: t.Credentials.Username,
		Password: t.Credentials.Password,
		// Basic authentication: every BMC and emulator speaks it, and it
		// leaves no session behind to expire or to fill the BMC's few
		// session slots when a run is cut short.
		BasicAuth:         true,
		HTTPClient:        &http.Client{Transport: transport, Timeout: t.Timeout},
		NoModifyTransport: true,
		// One TLS connection for all of a command's requests: a BMC's
		// handshake is slow (an embedded CPU), and gofish otherwise
		// closes the connection after each request.
		ReuseConnections: true,
	}
	api, err := gofish.ConnectContext(ctx, cfg)
	if err != nil {
		return nil, explain(t.Address, "connect", err)
	}
	r := &redfish{target: t, api: api, system: t.Address.System}
	if r.system == "" {
		if r.system, err = r.findSystem(ctx); err != nil {
			return nil, err
		}
	}
	return r, nil
}

// findSystem picks the service's only system; a BMC that manages several
// (a chassis manager, sushy-tools over libvirt) needs the system's path
// in the address.
func (r *redfish) findSystem(ctx context.Context) (string, error) {
	resp, err := r.api.WithContext(ctx).Get(SystemsPath)
	if err != nil {
		return "", explain(r.target.Address, "list systems", err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, maxCollection))
	if err != nil {
		return "", explain(r.target.Address, "list systems", err)
	}
	systems, err := DecodeMembers(data)
	if err != nil {
		return "", fmt.Errorf("%s: list systems: %w", r.target.Address, err)
	}
	switch len(systems) {
	case 1:
		return systems[0], nil
	case 0:
		return "", fmt.Errorf("%s: the BMC lists no system under %s", r.target.Address, SystemsPath)
	}
	return "", fmt.Errorf("%s: the BMC manages %d systems; name one in the address: %s", r.target.Address, len(systems), strings.Join(systems, ", "))
}

// maxCollection bounds a collection's body: a BMC's systems list is a
// few hundred bytes, a chassis manager's a few dozen kilobytes.
const maxCollection = 1 << 20

// DecodeMembers reads a Redfish collection's member paths. Paths outside
// the systems collection are refused: they would be fetched with the
// BMC's credentials.
func DecodeMembers(data []byte) ([]string, error) {
	var c struct {
		Members []struct {
			ID string `json:"@odata.id"`
		} `json:"Members"`
	}
	if err := json.Unmarshal(data, &c); err != nil {
		return nil, fmt.Errorf("the systems collection is not Redfish JSON: %w", err)
	}
	var paths []string
	for _, m := range c.Members {
		p := strings.TrimSuffix(m.ID, "/")
		rest, ok := strings.CutPrefix(p, SystemsPath+"/")
		if !ok || rest == "" || strings.ContainsAny(rest, "/?#") {
			return nil, fmt.Errorf("the systems collection lists %q, not a system under %s", m.ID, SystemsPath)
		}
		paths = append(paths, p)
	}
	return paths, nil
}

func (r *redfish) get(ctx context.Context) (*schemas.ComputerSystem, error) {
	s, err := schemas.GetComputerSystem(r.api.WithContext(ctx), r.system)
	if err != nil {
		return nil, explain(r.target.Address, "read system", err)
	}
	return s, nil
}

func (r *redfish) Close() { r.api.Logout() }

func (r *redfish) Address() Address {
	a := r.target.Address
	a.System = r.system
	return a
}

func (r *redfish) PowerState(ctx context.Context) (PowerState, error) {
	s, err := r.get(ctx)
	if err != nil {
		return "", err
	}
	return PowerState(s.PowerState), nil
}

func (r *redfish) Power(ctx context.Context, a Action) error {
	s, err := r.get(ctx)
	if err != nil {
		return err
	}
	state := PowerState(s.PowerState)
	allowed, err := s.GetSupportedResetTypes()
	if err != nil {
		return explain(r.target.Address, "read reset types", err)
	}
	on := state == PowerOn || state == PowerPoweringOn
	switch a {
	case On:
		if on {
			return nil
		}
		return r.reset(ctx, s, allowed, schemas.OnResetType, schemas.ForceOnResetType)
	case Off:
		if state == PowerOff {
			return nil
		}
		return r.reset(ctx, s, allowed, schemas.ForceOffResetType)
	case Soft:
		if state == PowerOff {
			return nil
		}
		return r.reset(ctx, s, allowed, schemas.GracefulShutdownResetType)
	case Cycle:
		if !on {
			return r.reset(ctx, s, allowed, schemas.OnResetType, schemas.ForceOnResetType)
		}
		if offers(allowed, schemas.PowerCycleResetType) {
			return r.reset(ctx, s, allowed, schemas.PowerCycleResetType)
		}
		// Off, then on once the BMC says it is off.
		if err := r.reset(ctx, s, allowed, schemas.ForceOffResetType); err != nil {
			return err
		}
		if err := r.waitPower(ctx, PowerOff); err != nil {
			return err
		}
		return r.reset(ctx, s, allowed, schemas.OnResetType, schemas.ForceOnResetType)
	case Reset:
		if !on {
			return fmt.Errorf("%s: the machine is off; a reset needs it on: use on or cycle", r.target.Address)
		}
		return r.reset(ctx, s, allowed, schemas.ForceRestartResetType, schemas.PowerCycleResetType)
	default:
		_, err := ParseAction(string(a))
		return err
	}
}

// offers says whether a BMC lists a reset type; one that lists none is
// taken to offer all, as gofish does.
func offers(allowed []schemas.ResetType, t schemas.ResetType) bool {
	return len(allowed) == 0 || slices.Contains(allowed, t)
}

// reset posts the first of the preferred reset types the BMC offers and
// follows its task monitor, if it answers with one, to the end.
func (r *redfish) reset(ctx context.Context, s *schemas.ComputerSystem, allowed []schemas.ResetType, prefer ...schemas.ResetType) error {
	for _, t := range prefer {
		if !offers(allowed, t) {
			continue
		}
		s.SetClient(r.api.WithContext(ctx))
		task, err := s.Reset(t)
		if err != nil {
			return explain(r.target.Address, "reset "+string(t), err)
		}
		return r.waitTask(ctx, task)
	}
	return fmt.Errorf("%s: the BMC offers none of the reset types %v (it offers %v)", r.target.Address, prefer, allowed)
}

// waitTask polls a task monitor until the task is no longer running:
// the monitor answers 202 while it runs.
func (r *redfish) waitTask(ctx context.Context, task *schemas.TaskMonitorInfo) error {
	if task == nil || task.TaskMonitor == "" {
		return nil
	}
	api := r.api.WithContext(ctx)
	for {
		resp, err := api.Get(task.TaskMonitor)
		if err != nil {
			return explain(r.target.Address, "follow task "+task.TaskMonitor, err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusAccepted {
			return nil
		}
		if err := sleep(ctx, retryAfter(resp)); err != nil {
			return fmt.Errorf("%s: task %s still running: %w", r.target.Address, task.TaskMonitor, err)
		}
	}
}

func retryAfter(resp *http.Response) time.Duration {
	var s int
	if _, err := fmt.Sscanf(resp.Header.Get("Retry-After"), "%d", &s); err == nil && s > 0 && s < 60 {
		return time.Duration(s) * time.Second
	}
	return time.Second
}

// waitPower polls until the system reports a power state.
func (r *redfish) waitPower(ctx context.Context, want PowerState) error {
	for {
		got, err := r.PowerState(ctx)
		if err != nil {
			return err
		}
		if got == want {
			return nil
		}
		if err := sleep(ctx, time.Second); err != nil {
			return fmt.Errorf("%s: waiting for power %s, still %s: %w", r.target.Address, want, got, err)
		}
	}
}

func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

func (r *redfish) BootPXEOnce(ctx context.Context) (BootChange, error) {
	s, err := r.get(ctx)
	if err != nil {
		return BootChange{}, err
	}
	ch := BootChange{Previous: Boot{Target: string(s.Boot.BootSourceOverrideTarget), Enabled: string(s.Boot.BootSourceOverrideEnabled)}}
	if targets := s.Boot.AllowableBootSourceOverrideTargetValues; len(targets) > 0 && !slices.Contains(targets, schemas.PxeBootSource) {
		return ch, fmt.Errorf("%s: the BMC offers no Pxe boot override (it offers %v)", r.target.Address, targets)
	}
	ch.Now = Boot{Target: string(schemas.PxeBootSource), Enabled: string(schemas.OnceBootSourceOverrideEnabled)}
	err = r.setBoot(ctx, s, ch.Now)
	if err == nil {
		return ch, nil
	}
	// Some BMCs refuse a one-time override (400, or 405 on firmware that
	// lists only Continuous): set it for good; the caller puts the old
	// one back once the machine has netbooted.
	var rerr *schemas.Error
	if !errors.As(err, &rerr) || rerr.HTTPReturnedStatusCode < 400 || rerr.HTTPReturnedStatusCode >= 500 || rerr.HTTPReturnedStatusCode == http.StatusUnauthorized {
		return ch, err
	}
	ch.Now.Enabled = string(schemas.ContinuousBootSourceOverrideEnabled)
	ch.Fallback = true
	if err2 := r.setBoot(ctx, s, ch.Now); err2 != nil {
		return ch, fmt.Errorf("%w; Continuous too: %w", err, err2)
	}
	return ch, nil
}

func (r *redfish) SetBoot(ctx context.Context, b Boot) error {
	s, err := r.get(ctx)
	if err != nil {
		return err
	}
	return r.setBoot(ctx, s, b)
}

// setBoot patches the override of a system just read.
func (r *redfish) setBoot(ctx context.Context, s *schemas.ComputerSystem, b Boot) error {
	s.SetClient(r.api.WithContext(ctx))
	boot := &schemas.Boot{
		BootSourceOverrideTarget:  schemas.BootSource(b.Target),
		BootSourceOverrideEnabled: schemas.BootSourceOverrideEnabled(b.Enabled),
	}
	if err := s.SetBoot(boot); err != nil {
		return explain(r.target.Address, fmt.Sprintf("set boot %s %s", b.Target, b.Enabled), err)
	}
	return nil
}

func (r *redfish) Inspect(ctx context.Context) (Inventory, error) {
	s, err := r.get(ctx)
	if err != nil {
		return Inventory{}, err
	}
	inv := Inventory{
		Manufacturer: s.Manufacturer, Model: s.Model, SerialNumber: s.SerialNumber,
		UUID: s.UUID, BIOSVersion: s.BiosVersion, PowerState: PowerState(s.PowerState),
		CPUModel: s.ProcessorSummary.Model, NICs: []NIC{}, Disks: []Disk{},
	}
	if c := s.ProcessorSummary.Count; c != nil {
		inv.CPUs = int(*c)
	}
	if m := s.MemorySummary.TotalSystemMemoryGiB; m != nil {
		inv.MemoryGiB = *m
	}
	nics, err := s.EthernetInterfaces()
	if err != nil {
		return inv, explain(r.target.Address, "read NICs", err)
	}
	for _, n := range nics {
		inv.NICs = append(inv.NICs, NIC{Name: n.ID, MAC: strings.ToLower(n.MACAddress), LinkStatus: string(n.LinkStatus)})
	}
	inv.Disks, err = r.disks(s)
	return inv, err
}

// disks reads Storage's drives, or SimpleStorage's devices on BMCs that
// have only the older resource.
func (r *redfish) disks(s *schemas.ComputerSystem) ([]Disk, error) {
	disks := []Disk{}
	storage, err := s.Storage()
	if err != nil {
		return disks, explain(r.target.Address, "read storage", err)
	}
	for _, st := range storage {
		drives, err := st.Drives()
		if err != nil {
			return disks, explain(r.target.Address, "read drives", err)
		}
		for _, d := range drives {
			disk := Disk{Name: d.Name, Model: d.Model, SerialNumber: d.SerialNumber}
			if d.CapacityBytes != nil {
				disk.CapacityBytes = int64(*d.CapacityBytes)
			}
			disks = append(disks, disk)
		}
	}
	if len(disks) > 0 {
		return disks, nil
	}
	simple, err := s.SimpleStorage()
	if err != nil {
		return disks, explain(r.target.Address, "read simple storage", err)
	}
	for _, st := range simple {
		for _, d := range st.Devices {
			disk := Disk{Name: d.Name, Model: d.Model}
			if d.CapacityBytes != nil {
				disk.CapacityBytes = int64(*d.CapacityBytes)
			}
			disks = append(disks, disk)
		}
	}
	return disks, nil
}

// explain turns an HTTP, TLS or Redfish failure into a message that says
// what to do about it. It never includes the credentials.
func explain(addr Address, what string, err error) error {
	var rerr *schemas.Error
	var unknownCA x509.UnknownAuthorityError
	var hostname x509.HostnameError
	var certInvalid x509.CertificateInvalidError
	var tlsRecord tls.RecordHeaderError
	switch {
	case errors.As(err, &rerr) && rerr.HTTPReturnedStatusCode == http.StatusUnauthorized:
		return fmt.Errorf("%s: %s: the BMC refused the credentials (401)", addr, what)
	case errors.As(err, &rerr) && rerr.HTTPReturnedStatusCode == http.StatusForbidden:
		return fmt.Errorf("%s: %s: the BMC user may not do this (403): give it the operator role", addr, what)
	case errors.As(err, &rerr) && rerr.HTTPReturnedStatusCode != 0:
		return &statusError{msg: fmt.Sprintf("%s: %s: the BMC answered %d: %s", addr, what, rerr.HTTPReturnedStatusCode, redfishMessage(rerr)), err: rerr}
	case errors.As(err, &unknownCA), errors.As(err, &hostname), errors.As(err, &certInvalid):
		return fmt.Errorf("%s: %s: the BMC's TLS certificate is not trusted (%v): set insecureSkipVerify: true for a self-signed BMC", addr, what, err)
	case errors.As(err, &tlsRecord), errors.Is(err, http.ErrSchemeMismatch):
		return fmt.Errorf("%s: %s: the BMC does not speak TLS on this port: use redfish+http:// if it serves plain HTTP", addr, what)
	case errors.Is(err, context.DeadlineExceeded), isTimeout(err):
		return fmt.Errorf("%s: %s: the BMC did not answer in time: %w", addr, what, err)
	case errors.As(err, new(*net.OpError)):
		return fmt.Errorf("%s: %s: cannot reach the BMC: %w", addr, what, err)
	case errors.As(err, new(*schemas.Error)):
		return fmt.Errorf("%s: %s: %w", addr, what, err)
	default:
		return fmt.Errorf("%s: %s: %w (is this a Redfish service?)", addr, what, err)
	}
}

// statusError is a BMC's refusal, with the Redfish error under it for
// callers that look at the status code.
type statusError struct {
	msg string
	err *schemas.Error
}

func (e *statusError) Error() string { return e.msg }
func (e *statusError) Unwrap() error { return e.err }

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// redfishMessage is the first message of a Redfish error body.
func redfishMessage(e *schemas.Error) string {
	if e.Message != "" {
		return e.Message
	}
	for _, m := range e.ExtendedInfos {
		if m.Message != "" {
			return m.Message
		}
	}
	return "no Redfish error message"
}
