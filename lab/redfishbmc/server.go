// Package redfishbmc is the lab's baseboard management controller: a
// Redfish service, one per lab VM, that answers the resources a real
// BMC (or sushy-tools, OpenStack's Redfish emulator) answers for power
// and boot: the service root, the systems collection, the computer system
// with its Reset action and boot override, its NICs and disks.
//
// Power goes to a Machine: in the lab, the VM's QEMU through QMP.
package redfishbmc

import (
	"context"
	"crypto/subtle"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync"
)

// Machine is what a BMC powers.
type Machine interface {
	// Running says whether the machine has power.
	Running(ctx context.Context) (bool, error)
	// Start powers the machine on; netboot makes this boot a network
	// boot (the one-time PXE override), else it boots its disk first.
	Start(ctx context.Context, netboot bool) error
	// Stop cuts power, or with graceful asks the OS to shut down (ACPI).
	Stop(ctx context.Context, graceful bool) error
	// Restart resets a running machine; netboot as for Start.
	Restart(ctx context.Context, netboot bool) error
}

// System is one computer system the BMC manages and what it reports of it.
type System struct {
	// ID names the system in its path, /redfish/v1/Systems/ID.
	ID        string
	UUID      string
	MAC       string
	CPUs      int
	MemoryMiB int
	DiskBytes int64
	Machine   Machine
}

// Credentials are the one account the BMC knows.
type Credentials struct{ Username, Password string }

// The boot override targets and modes this BMC offers, and its reset
// types: those sushy-tools offers for a libvirt domain. Like it, no
// PowerCycle: clients must power off and on.
var (
	bootTargets = []string{"None", "Pxe", "Hdd", "Cd"}
	bootEnabled = []string{"Disabled", "Once", "Continuous"}
	resetTypes  = []string{"On", "ForceOn", "ForceOff", "GracefulShutdown", "GracefulRestart", "ForceRestart"}
)

// Server is a Redfish service; it is an http.Handler.
type Server struct {
	creds   Credentials
	log     *slog.Logger
	mux     *http.ServeMux
	systems map[string]*system
	order   []string
}

type system struct {
	System
	// mu serialises actions and guards the override.
	mu   sync.Mutex
	boot BootOverride
}

// BootOverride is a system's boot source override, as Redfish names its fields.
type BootOverride struct {
	Target  string `json:"BootSourceOverrideTarget"`
	Enabled string `json:"BootSourceOverrideEnabled"`
	Mode    string `json:"BootSourceOverrideMode,omitempty"`
}

// New serves systems behind one account.
func New(creds Credentials, log *slog.Logger, systems ...System) *Server {
	s := &Server{creds: creds, log: log, mux: http.NewServeMux(), systems: map[string]*system{}}
	for _, sys := range systems {
		s.systems[sys.ID] = &system{System: sys, boot: BootOverride{Target: "None", Enabled: "Disabled", Mode: "Legacy"}}
		s.order = append(s.order, sys.ID)
	}
	// The service root answers without credentials, as the Redfish
	// specification requires, so that clients can find what to log in to.
	s.mux.HandleFunc("GET /redfish", s.versions)
	s.mux.HandleFunc("GET /redfish/v1", s.root)
	s.mux.HandleFunc("GET /redfish/v1/", s.root)
	s.handle("GET /redfish/v1/Systems", s.collection)
	s.handle("GET /redfish/v1/Systems/{id}", s.withSystem(s.getSystem))
	s.handle("PATCH /redfish/v1/Systems/{id}", s.withSystem(s.patchSystem))
	s.handle("POST /redfish/v1/Systems/{id}/Actions/ComputerSystem.Reset", s.withSystem(s.reset))
	s.handle("GET /redfish/v1/Systems/{id}/EthernetInterfaces", s.withSystem(s.nics))
	s.handle("GET /redfish/v1/Systems/{id}/EthernetInterfaces/{nic}", s.withSystem(s.nic))
	s.handle("GET /redfish/v1/Systems/{id}/SimpleStorage", s.withSystem(s.storages))
	s.handle("GET /redfish/v1/Systems/{id}/SimpleStorage/{storage}", s.withSystem(s.storage))
	return s
}

func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s.mux.ServeHTTP(w, r)
}

// handle registers an authenticated route, with trailing-slash twin.
func (s *Server) handle(pattern string, h http.HandlerFunc) {
	auth := func(w http.ResponseWriter, r *http.Request) {
		if !s.authorized(r) {
			w.Header().Set("WWW-Authenticate", `Basic realm="cozy-lab-bmc"`)
			writeError(w, http.StatusUnauthorized, "Base.1.8.NoValidSession", "the credentials are not valid")
			return
		}
		h(w, r)
	}
	s.mux.HandleFunc(pattern, auth)
	s.mux.HandleFunc(pattern+"/", auth)
}

func (s *Server) authorized(r *http.Request) bool {
	user, pass, ok := r.BasicAuth()
	if !ok {
		return false
	}
	u := subtle.ConstantTimeCompare([]byte(user), []byte(s.creds.Username))
	p := subtle.ConstantTimeCompare([]byte(pass), []byte(s.creds.Password))
	return u&p == 1
}

func (s *Server) withSystem(h func(http.ResponseWriter, *http.Request, *system)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		sys, ok := s.systems[r.PathValue("id")]
		if !ok {
			writeError(w, http.StatusNotFound, "Base.1.8.ResourceMissingAtURI", "no system "+r.PathValue("id"))
			return
		}
		h(w, r, sys)
	}
}

type object = map[string]any

// enabled is the Status of every resource a lab BMC has: clients such as
// sushy count only enabled devices.
var enabled = object{"State": "Enabled", "Health": "OK"}

func link(path string) object { return object{"@odata.id": path} }

func (s *Server) versions(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, object{"v1": "/redfish/v1/"})
}

func (s *Server) root(w http.ResponseWriter, r *http.Request) {
	if p := strings.TrimSuffix(r.URL.Path, "/"); p != "/redfish/v1" {
		writeError(w, http.StatusNotFound, "Base.1.8.ResourceMissingAtURI", "no resource at "+r.URL.Path)
		return
	}
	writeJSON(w, http.StatusOK, object{
		"@odata.type":    "#ServiceRoot.v1_5_0.ServiceRoot",
		"@odata.id":      "/redfish/v1/",
		"Id":             "RootService",
		"Name":           "Cozy lab BMC",
		"RedfishVersion": "1.8.0",
		"Systems":        link("/redfish/v1/Systems"),
	})
}

func (s *Server) collection(w http.ResponseWriter, _ *http.Request) {
	writeCollection(w, "/redfish/v1/Systems", "ComputerSystem", "Computer System", s.order...)
}

// writeCollection answers a Redfish collection of kind at path, whose
// members are path/ID for each id.
func writeCollection(w http.ResponseWriter, path, kind, name string, ids ...string) {
	members := []object{}
	for _, id := range ids {
		members = append(members, link(path+"/"+id))
	}
	writeJSON(w, http.StatusOK, object{
		"@odata.type":         fmt.Sprintf("#%sCollection.%sCollection", kind, kind),
		"@odata.id":           path,
		"Name":                name + " Collection",
		"Members@odata.count": len(members),
		"Members":             members,
	})
}

func (s *Server) getSystem(w http.ResponseWriter, r *http.Request, sys *system) {
	running, err := sys.Machine.Running(r.Context())
	if err != nil {
		writeError(w, http.StatusInternalServerError, "Base.1.8.InternalError", "power state: "+err.Error())
		return
	}
	power := "Off"
	if running {
		power = "On"
	}
	sys.mu.Lock()
	b := sys.boot
	sys.mu.Unlock()
	base := "/redfish/v1/Systems/" + sys.ID
	writeJSON(w, http.StatusOK, object{
		"@odata.type":  "#ComputerSystem.v1_10_0.ComputerSystem",
		"@odata.id":    base,
		"Id":           sys.ID,
		"Name":         sys.ID,
		"UUID":         sys.UUID,
		"Manufacturer": "QEMU",
		"Model":        "Standard PC",
		"SerialNumber": sys.UUID,
		"SystemType":   "Virtual",
		"Status":       enabled,
		"PowerState":   power,
		"Boot": object{
			"BootSourceOverrideTarget":                         b.Target,
			"BootSourceOverrideEnabled":                        b.Enabled,
			"BootSourceOverrideMode":                           b.Mode,
			"BootSourceOverrideTarget@Redfish.AllowableValues": bootTargets,
		},
		"ProcessorSummary":   object{"Count": sys.CPUs, "Model": "QEMU Virtual CPU"},
		"MemorySummary":      object{"TotalSystemMemoryGiB": float64(sys.MemoryMiB) / 1024},
		"EthernetInterfaces": link(base + "/EthernetInterfaces"),
		"SimpleStorage":      link(base + "/SimpleStorage"),
		"Actions": object{"#ComputerSystem.Reset": object{
			"target":                            base + "/Actions/ComputerSystem.Reset",
			"ResetType@Redfish.AllowableValues": resetTypes,
		}},
	})
}

func (s *Server) patchSystem(w http.ResponseWriter, r *http.Request, sys *system) {
	p, err := DecodePatch(http.MaxBytesReader(w, r.Body, maxBody))
	if err != nil {
		writeError(w, http.StatusBadRequest, "Base.1.8.MalformedJSON", err.Error())
		return
	}
	sys.mu.Lock()
	b := sys.boot
	if p.Target != "" {
		b.Target = p.Target
	}
	if p.Enabled != "" {
		b.Enabled = p.Enabled
	}
	if p.Mode != "" {
		b.Mode = p.Mode
	}
	sys.boot = b
	sys.mu.Unlock()
	s.log.Info("boot override", "system", sys.ID, "target", b.Target, "enabled", b.Enabled)
	w.WriteHeader(http.StatusNoContent)
}

// netboot says whether this boot follows a network override, and clears
// a one-time override as a BMC does once the boot it applied to starts.
func (sys *system) netboot() bool {
	sys.mu.Lock()
	defer sys.mu.Unlock()
	net := sys.boot.Target == "Pxe" && sys.boot.Enabled != "Disabled"
	if sys.boot.Enabled == "Once" {
		sys.boot.Target, sys.boot.Enabled = "None", "Disabled"
	}
	return net
}

func (s *Server) reset(w http.ResponseWriter, r *http.Request, sys *system) {
	t, err := DecodeReset(http.MaxBytesReader(w, r.Body, maxBody))
	if err != nil {
		writeError(w, http.StatusBadRequest, "Base.1.8.ActionParameterValueFormatError", err.Error())
		return
	}
	ctx := r.Context()
	running, err := sys.Machine.Running(ctx)
	if err != nil {
		writeError(w, http.StatusInternalServerError, "Base.1.8.InternalError", "power state: "+err.Error())
		return
	}
	switch {
	case (t == "On" || t == "ForceOn") && !running:
		err = sys.Machine.Start(ctx, sys.netboot())
	case t == "ForceOff" && running:
		err = sys.Machine.Stop(ctx, false)
	case t == "GracefulShutdown" && running:
		err = sys.Machine.Stop(ctx, true)
	case (t == "ForceRestart" || t == "GracefulRestart") && running:
		err = sys.Machine.Restart(ctx, sys.netboot())
	case t == "ForceRestart" || t == "GracefulRestart":
		writeError(w, http.StatusConflict, "Base.1.8.ActionNotSupported", "the system is off; power it on")
		return
	}
	if err != nil {
		writeError(w, http.StatusInternalServerError, "Base.1.8.InternalError", fmt.Sprintf("%s: %v", t, err))
		return
	}
	s.log.Info("reset", "system", sys.ID, "type", t, "wasRunning", running)
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) nics(w http.ResponseWriter, _ *http.Request, sys *system) {
	writeCollection(w, "/redfish/v1/Systems/"+sys.ID+"/EthernetInterfaces", "EthernetInterface", "Ethernet Interface", "nic0")
}

func (s *Server) nic(w http.ResponseWriter, r *http.Request, sys *system) {
	if r.PathValue("nic") != "nic0" {
		writeError(w, http.StatusNotFound, "Base.1.8.ResourceMissingAtURI", "no NIC "+r.PathValue("nic"))
		return
	}
	writeJSON(w, http.StatusOK, object{
		"@odata.type": "#EthernetInterface.v1_4_0.EthernetInterface",
		"@odata.id":   "/redfish/v1/Systems/" + sys.ID + "/EthernetInterfaces/nic0",
		"Id":          "nic0",
		"Name":        "VirtIO network device",
		"MACAddress":  sys.MAC,
		"LinkStatus":  "LinkUp",
		"Status":      enabled,
	})
}

func (s *Server) storages(w http.ResponseWriter, _ *http.Request, sys *system) {
	writeCollection(w, "/redfish/v1/Systems/"+sys.ID+"/SimpleStorage", "SimpleStorage", "Simple Storage", "virtio")
}

func (s *Server) storage(w http.ResponseWriter, r *http.Request, sys *system) {
	if r.PathValue("storage") != "virtio" {
		writeError(w, http.StatusNotFound, "Base.1.8.ResourceMissingAtURI", "no storage "+r.PathValue("storage"))
		return
	}
	writeJSON(w, http.StatusOK, object{
		"@odata.type": "#SimpleStorage.v1_2_0.SimpleStorage",
		"@odata.id":   "/redfish/v1/Systems/" + sys.ID + "/SimpleStorage/virtio",
		"Id":          "virtio",
		"Name":        "VirtIO block controller",
		"Devices":     []object{{"Name": "vda", "Model": "QEMU HARDDISK", "CapacityBytes": sys.DiskBytes, "Status": enabled}},
	})
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("OData-Version", "4.0")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}

// writeError answers in Redfish's error format, which clients parse for
// the message.
func writeError(w http.ResponseWriter, code int, id, msg string) {
	writeJSON(w, code, object{"error": object{
		"code":    id,
		"message": msg,
		"@Message.ExtendedInfo": []object{{
			"MessageId": id, "Message": msg, "Severity": "Warning",
		}},
	}})
}
