// Package lease keeps the full-DHCP-mode address leases of the netboot
// server: which address of which pool belongs to which MAC until when. Every grant is
// written to an append-only journal and fsynced before the caller may send
// its DHCPACK, so a crash at any moment loses no granted lease and a
// restarted server never hands a granted address to someone else.
package lease

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"sync"
	"time"
)

// Pool is the range of addresses the server may hand out.
type Pool struct {
	First, Last netip.Addr
}

// ParsePool reads "FROM-TO", e.g. "10.8.0.100-10.8.0.199".
func ParsePool(s string) (Pool, error) {
	from, to, ok := bytes.Cut([]byte(s), []byte("-"))
	if !ok {
		return Pool{}, fmt.Errorf("range %q: want FROM-TO, e.g. 10.8.0.100-10.8.0.199", s)
	}
	first, err1 := netip.ParseAddr(string(from))
	last, err2 := netip.ParseAddr(string(to))
	if err1 != nil || err2 != nil || !first.Is4() || !last.Is4() {
		return Pool{}, fmt.Errorf("range %q: want two IPv4 addresses", s)
	}
	if last.Less(first) {
		return Pool{}, fmt.Errorf("range %q: %s comes after %s", s, first, last)
	}
	return Pool{First: first, Last: last}, nil
}

// Contains reports whether ip is in the pool.
func (p Pool) Contains(ip netip.Addr) bool {
	return ip.Is4() && !ip.Less(p.First) && !p.Last.Less(ip)
}

func (p Pool) String() string { return p.First.String() + "-" + p.Last.String() }

// size is the number of addresses in the pool.
func (p Pool) size() int {
	f, l := p.First.As4(), p.Last.As4()
	first := uint32(f[0])<<24 | uint32(f[1])<<16 | uint32(f[2])<<8 | uint32(f[3])
	last := uint32(l[0])<<24 | uint32(l[1])<<16 | uint32(l[2])<<8 | uint32(l[3])
	return int(last-first) + 1
}

// Lease is one address granted to one client.
type Lease struct {
	MAC     string     `json:"mac"`
	IP      netip.Addr `json:"ip"`
	Expires time.Time  `json:"expires"`
}

// record is one journal line.
type record struct {
	Op      string     `json:"op"` // grant, release, decline
	MAC     string     `json:"mac,omitempty"`
	IP      netip.Addr `json:"ip"`
	Expires time.Time  `json:"expires"`
}

// Errors callers turn into DHCPNAK or silence.
var (
	ErrPoolExhausted = errors.New("no free address in the pool")
	ErrTaken         = errors.New("address leased to another client")
	ErrOutOfPool     = errors.New("address outside the pool")
)

// declineHold is how long an address a client declined (someone else
// answered ARP for it) stays out of use.
const declineHold = 10 * time.Minute

// offerHold keeps an offered address for its client while the client
// decides, so two clients are not offered the same address.
const offerHold = 30 * time.Second

// Network is one pool of addresses on one IP network, with the addresses
// reserved there for some machines.
type Network struct {
	// Subnet is the network: the journal's records for addresses in it
	// belong to this pool. Zero in a store of one network: every address
	// belongs to it.
	Subnet netip.Prefix
	Pool   Pool
	// Reservations maps a MAC to its fixed address, which may lie outside
	// the pool (not outside Subnet) and never goes to anyone else.
	Reservations map[string]netip.Addr
}

// network is a Network's state, under Store.mu.
type network struct {
	Network
	static   map[string]netip.Addr // Reservations, by normalised MAC
	reserved map[netip.Addr]string // static inverted
	// cursor is where the search for a free address resumes, so offers
	// stay O(1) on a pool that fills from the bottom.
	cursor netip.Addr
	byMAC  map[string]*Lease
}

// Store holds the leases of one or more networks, in one journal: a batch
// of grants costs one write and one fdatasync, whichever networks they
// are on.
type Store struct {
	now  func() time.Time
	nets []*network

	mu sync.Mutex
	// byIP holds every lease, also of addresses no network claims any more
	// (a network removed from the configuration): they are kept, not
	// forgotten, in case it comes back.
	byIP     map[netip.Addr]*Lease
	declined map[netip.Addr]time.Time
	offers   map[netip.Addr]offer
	path     string
	pending  []byte // records appended but not yet written (under mu)
	written  Seq    // records appended (under mu)

	// syncMu orders journal writes: one writer (and fdatasync) at a time,
	// which every grant waiting meanwhile then shares (group commit).
	// Lock order: syncMu, then mu.
	syncMu  sync.Mutex
	journal *journalFile
	spare   []byte // the other pending buffer, swapped in on each write
	flushed Seq    // records written to the journal file
	synced  Seq    // records known durable
	// failed is the first write or sync error: after it nothing is
	// acknowledged again, since the kernel may have dropped what it had not
	// written (a later fsync that succeeds would prove nothing).
	failed error

	// Compaction (see Compact). fileRecords counts the records in the
	// journal file; while compacting, tail keeps what is written to the old
	// file after the snapshot, for the new one, until shadow (the new
	// file) receives every write itself. All under syncMu.
	compactMu   sync.Mutex // one compaction at a time
	due         chan struct{}
	compactMin  int // records a journal may hold before compaction is due
	retryAfter  int // no compaction is due before the file holds this many
	fileRecords int
	compacting  bool
	tail        []byte
	tailRecords int
	shadow      *journalFile
}

type offer struct {
	mac     string
	expires time.Time
}

// Open loads the leases of the networks kept in dir (creating it if
// needed) and compacts the journal. Each network has its pool and its
// reservations; Network(i) is the store as the i-th sees it. now is the
// clock (time.Now when nil).
func Open(dir string, nets []Network, now func() time.Time) (*Store, error) {
	if now == nil {
		now = time.Now
	}
	if err := CheckNetworks(nets); err != nil {
		return nil, err
	}
	s := &Store{
		now: now, byIP: map[netip.Addr]*Lease{},
		declined: map[netip.Addr]time.Time{}, offers: map[netip.Addr]offer{},
		path: filepath.Join(dir, leaseFileName),
		due:  make(chan struct{}, 1), compactMin: compactMinRecords,
	}
	for _, n := range nets {
		st := &network{Network: n, static: map[string]netip.Addr{}, reserved: map[netip.Addr]string{},
			cursor: n.Pool.First, byMAC: map[string]*Lease{}}
		for mac, ip := range n.Reservations {
			st.static[normMAC(mac)] = ip
			st.reserved[ip] = normMAC(mac)
		}
		s.nets = append(s.nets, st)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("lease state dir: %w", err)
	}
	removeTemps(dir)
	if err := s.load(); err != nil {
		return nil, err
	}
	if err := s.compact(); err != nil {
		return nil, err
	}
	return s, nil
}

// CheckNetworks refuses networks whose pools or reservations lie outside
// them, or that overlap: each address must belong to one network. Open
// checks with it, and so does the netboot server's configuration, before
// it opens anything.
func CheckNetworks(nets []Network) error {
	if len(nets) == 0 {
		return errors.New("no address pool")
	}
	for i, n := range nets {
		if err := checkNetwork(n, nets[:i]); err != nil {
			return err
		}
	}
	return nil
}

// checkNetwork refuses a network whose pool or reservations lie outside
// it, or that overlaps one before it: each address must belong to one
// network.
func checkNetwork(n Network, before []Network) error {
	if !n.Subnet.IsValid() {
		if len(before) > 0 {
			return fmt.Errorf("pool %s: name its network", n.Pool)
		}
		return nil
	}
	if !n.Subnet.Contains(n.Pool.First) || !n.Subnet.Contains(n.Pool.Last) {
		return fmt.Errorf("pool %s is not inside its network %s", n.Pool, n.Subnet)
	}
	for mac, ip := range n.Reservations {
		if !n.Subnet.Contains(ip) {
			return fmt.Errorf("reservation %s=%s is not inside the network %s", mac, ip, n.Subnet)
		}
	}
	for _, b := range before {
		if !b.Subnet.IsValid() || b.Subnet.Overlaps(n.Subnet) {
			return fmt.Errorf("networks %s and %s overlap: each address must belong to one pool", b.Subnet, n.Subnet)
		}
	}
	return nil
}

// networkOf is the network an address belongs to; nil if none.
func (s *Store) networkOf(ip netip.Addr) *network {
	for _, n := range s.nets {
		if !n.Subnet.IsValid() || n.Subnet.Contains(ip) {
			return n
		}
	}
	return nil
}

func normMAC(mac string) string {
	if canonicalMAC(mac) {
		return mac // what net.HardwareAddr.String writes, as callers mostly pass
	}
	if hw, err := net.ParseMAC(mac); err == nil {
		return hw.String()
	}
	return mac
}

// canonicalMAC reports whether mac is six lower-case hex pairs separated by
// colons.
func canonicalMAC(mac string) bool {
	if len(mac) != 17 {
		return false
	}
	for i := 0; i < len(mac); i++ {
		c := mac[i]
		switch {
		case i%3 == 2:
			if c != ':' {
				return false
			}
		case ('0' <= c && c <= '9') || ('a' <= c && c <= 'f'):
		default:
			return false
		}
	}
	return true
}

// load replays the journal (see readJournal for what is dropped).
func (s *Store) load() error {
	records, err := readJournal(s.path)
	if err != nil {
		return err
	}
	for _, r := range records {
		s.apply(r)
	}
	return nil
}

// removeTemps deletes what a crash during a rewrite of the journal left.
func removeTemps(dir string) {
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		if isTemp(e.Name()) {
			os.Remove(filepath.Join(dir, e.Name()))
		}
	}
}

func (s *Store) apply(r record) {
	n := s.networkOf(r.IP)
	switch r.Op {
	case opGrant:
		if n != nil {
			if old := n.byMAC[r.MAC]; old != nil && old.IP != r.IP {
				delete(s.byIP, old.IP)
			}
		}
		if old := s.byIP[r.IP]; old != nil && old.MAC != r.MAC && n != nil && n.byMAC[old.MAC] == old {
			delete(n.byMAC, old.MAC)
		}
		l := &Lease{MAC: r.MAC, IP: r.IP, Expires: r.Expires}
		s.byIP[r.IP] = l
		if n != nil {
			n.byMAC[r.MAC] = l
		}
	case opRelease:
		if l := s.byIP[r.IP]; l != nil && l.MAC == r.MAC {
			// Keep the binding so the client gets the same address back,
			// but expired: anyone may take it.
			l.Expires = r.Expires
		}
	case opDecline:
		if l := s.byIP[r.IP]; l != nil {
			if n != nil && n.byMAC[l.MAC] == l {
				delete(n.byMAC, l.MAC)
			}
			delete(s.byIP, r.IP)
		}
		s.declined[r.IP] = r.Expires
	}
}

// usableBy reports whether ip may go to mac now, on network n.
func (s *Store) usableBy(n *network, ip netip.Addr, mac string, now time.Time) error {
	if m, ok := n.reserved[ip]; ok && m != mac {
		return fmt.Errorf("%w: %s is reserved for %s", ErrTaken, ip, m)
	}
	if r, ok := n.static[mac]; ok {
		if r != ip {
			return fmt.Errorf("%w: %s has the reservation %s", ErrTaken, mac, r)
		}
	} else if !n.Pool.Contains(ip) {
		return fmt.Errorf("%w: %s not in %s", ErrOutOfPool, ip, n.Pool)
	}
	if l := s.byIP[ip]; l != nil && l.MAC != mac && now.Before(l.Expires) {
		return fmt.Errorf("%w: %s until %s", ErrTaken, ip, l.Expires.Format(time.RFC3339))
	}
	if until, ok := s.declined[ip]; ok && now.Before(until) {
		return fmt.Errorf("%w: %s was declined (address conflict)", ErrTaken, ip)
	}
	if o, ok := s.offers[ip]; ok && o.mac != mac && now.Before(o.expires) {
		return fmt.Errorf("%w: %s is offered to %s", ErrTaken, ip, o.mac)
	}
	return nil
}

// Net is the store as one of its networks sees it: what that network's
// DHCP server needs. Changes are applied at once and durable after
// Sync of the position they return.
type Net struct {
	s *Store
	n *network
}

// Network returns the i-th network's view of the store (in the order
// given to Open).
func (s *Store) Network(i int) *Net { return &Net{s: s, n: s.nets[i]} }

// Offer picks the address for a DHCPOFFER: the client's reservation, its
// current or last address, the address it asks for, or the next free one.
// Nothing is written: an offer is not a grant.
func (v *Net) Offer(mac string, requested netip.Addr) (netip.Addr, error) {
	s, n := v.s, v.n
	mac = normMAC(mac)
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	var candidates [2]netip.Addr
	if r, ok := n.static[mac]; ok {
		candidates[0] = r
	} else {
		if l := n.byMAC[mac]; l != nil {
			candidates[0] = l.IP
		}
		candidates[1] = requested
	}
	for _, ip := range candidates {
		if ip.IsValid() && s.usableBy(n, ip, mac, now) == nil {
			s.offers[ip] = offer{mac: mac, expires: now.Add(offerHold)}
			return ip, nil
		}
	}
	if r, ok := n.static[mac]; ok {
		return netip.Addr{}, s.usableBy(n, r, mac, now)
	}
	// Never-used addresses first, then expired ones, so a client that
	// returns soon tends to find its old address still free. The search
	// starts at the cursor and wraps around once.
	var expired netip.Addr
	ip := n.cursor
	for range n.Pool.size() {
		if s.usableBy(n, ip, mac, now) == nil {
			if s.byIP[ip] == nil {
				return s.hold(n, ip, mac, now), nil
			}
			if !expired.IsValid() {
				expired = ip
			}
		}
		if ip = ip.Next(); !n.Pool.Contains(ip) {
			ip = n.Pool.First
		}
	}
	if expired.IsValid() {
		return s.hold(n, expired, mac, now), nil
	}
	return netip.Addr{}, ErrPoolExhausted
}

// hold reserves an offered address for its client and moves the cursor.
func (s *Store) hold(n *network, ip netip.Addr, mac string, now time.Time) netip.Addr {
	s.offers[ip] = offer{mac: mac, expires: now.Add(offerHold)}
	if n.cursor = ip.Next(); !n.Pool.Contains(n.cursor) {
		n.cursor = n.Pool.First
	}
	return ip
}

// Grant leases ip to mac for d, durably: when Grant returns nil the lease
// survives any crash. It fails if ip may not go to mac.
func (v *Net) Grant(mac string, ip netip.Addr, d time.Duration) (Lease, error) {
	l, seq, err := v.GrantBuffered(mac, ip, d)
	if err != nil {
		return Lease{}, err
	}
	return l, v.s.Sync(seq)
}

// GrantBuffered leases ip to mac for d, in memory: the lease is durable,
// and may be acknowledged, once Sync(seq) has returned nil. Meanwhile the
// address counts as taken.
func (v *Net) GrantBuffered(mac string, ip netip.Addr, d time.Duration) (Lease, Seq, error) {
	s := v.s
	mac = normMAC(mac)
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	if err := s.usableBy(v.n, ip, mac, now); err != nil {
		return Lease{}, 0, err
	}
	delete(s.offers, ip)
	r := record{Op: opGrant, MAC: mac, IP: ip, Expires: now.Add(d).UTC().Truncate(time.Second)}
	return Lease{MAC: mac, IP: ip, Expires: r.Expires}, s.append(r), nil
}

// Release ends mac's lease on ip early (DHCPRELEASE), durably.
func (v *Net) Release(mac string, ip netip.Addr) error {
	return v.s.Sync(v.ReleaseBuffered(mac, ip))
}

// ReleaseBuffered is Release, durable once Sync(seq) returns nil. Zero
// means there was nothing to release.
func (v *Net) ReleaseBuffered(mac string, ip netip.Addr) Seq {
	s := v.s
	mac = normMAC(mac)
	s.mu.Lock()
	defer s.mu.Unlock()
	if l := s.byIP[ip]; l == nil || l.MAC != mac {
		return 0 // not ours to release; RFC 2131 has no reply anyway
	}
	return s.append(record{Op: opRelease, MAC: mac, IP: ip, Expires: s.now().UTC()})
}

// Decline takes ip out of use for a while, durably: the client found it in
// use (DHCPDECLINE after an ARP probe).
func (v *Net) Decline(mac string, ip netip.Addr) error {
	return v.s.Sync(v.DeclineBuffered(mac, ip))
}

// DeclineBuffered is Decline, durable once Sync(seq) returns nil. Zero
// means the decline was ignored.
func (v *Net) DeclineBuffered(mac string, ip netip.Addr) Seq {
	s := v.s
	mac = normMAC(mac)
	s.mu.Lock()
	defer s.mu.Unlock()
	if l := s.byIP[ip]; !v.n.Pool.Contains(ip) || (l != nil && l.MAC != mac) {
		return 0 // not ours, or someone else's lease: a forged or confused decline
	}
	return s.append(record{Op: opDecline, IP: ip, Expires: s.now().Add(declineHold).UTC()})
}

// Sync makes every record up to seq durable (see Store.Sync).
func (v *Net) Sync(seq Seq) error { return v.s.Sync(seq) }

// Lookup returns mac's lease on this network, expired or not.
func (v *Net) Lookup(mac string) (Lease, bool) {
	v.s.mu.Lock()
	defer v.s.mu.Unlock()
	if l := v.n.byMAC[normMAC(mac)]; l != nil {
		return *l, true
	}
	return Lease{}, false
}

// Lookup returns mac's lease, expired or not: on the first network that
// has one, else among the leases of addresses no network claims.
func (s *Store) Lookup(mac string) (Lease, bool) {
	mac = normMAC(mac)
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, n := range s.nets {
		if l := n.byMAC[mac]; l != nil {
			return *l, true
		}
	}
	for _, l := range s.byIP {
		if l.MAC == mac && s.networkOf(l.IP) == nil {
			return *l, true
		}
	}
	return Lease{}, false
}

// Leases returns a copy of every lease, expired ones included.
func (s *Store) Leases() []Lease {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]Lease, 0, len(s.byIP))
	for _, l := range s.byIP {
		out = append(out, *l)
	}
	return out
}
