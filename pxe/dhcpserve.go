package pxe

import (
	"context"
	"log/slog"
	"net"
	"sync"

	"github.com/insomniacslk/dhcp/dhcpv4"
	"golang.org/x/net/ipv4"

	"cozy.dev/cozy/pxe/dhcp"
	"cozy.dev/cozy/pxe/lease"
)

// decider is the DHCP decision: dhcp.Proxy or dhcp.Full.
type decider interface {
	Decide(req *dhcpv4.DHCPv4, port int) (dhcp.Decision, error)
}

// dhcpServer answers the DHCP requests of one socket in batches. One
// goroutine reads every request waiting (recvmmsg), decides each and sends
// at once (sendmmsg) the replies that announce no lease change (OFFERs,
// NAKs, proxy answers). The others (ACKs) queue for a second goroutine,
// which makes the lease changes of everything queued durable with one
// journal write and fdatasync, then sends those replies. No ACK leaves
// before its lease is durable; the more arrive while one sync runs, the
// more the next one carries; and a slow sync holds up ACKs only, never
// the reading of requests.
type dhcpServer struct {
	conn    *net.UDPConn
	port    int
	decider decider
	// commit makes the lease journal durable up to a position (full
	// mode's lease.Store.Sync).
	commit  func(lease.Seq) error
	sighted func(req *dhcpv4.DHCPv4, d dhcp.Decision, port int, peer *net.UDPAddr)
	log     *slog.Logger
}

// batchSize is how many datagrams one system call reads or sends at most.
const batchSize = 64

// outgoing is a batch of replies to send.
type outgoing struct {
	msgs []ipv4.Message
	info []sentReply // beside msgs: what to log
}

type sentReply struct {
	req, reply *dhcpv4.DHCPv4
	outcome    dhcp.Outcome
}

// add encodes a reply into the next message, reusing the buffer that
// message slot had before.
func (o *outgoing) add(req *dhcpv4.DHCPv4, d dhcp.Decision, dst *net.UDPAddr) {
	if len(o.msgs) < cap(o.msgs) {
		o.msgs = o.msgs[:len(o.msgs)+1]
	} else {
		o.msgs = append(o.msgs, ipv4.Message{})
	}
	m := &o.msgs[len(o.msgs)-1]
	if m.Buffers == nil { // a slot never used (append grows by more than one)
		m.Buffers = [][]byte{make([]byte, 0, 576)}
	}
	m.Buffers[0] = dhcp.AppendPacket(m.Buffers[0][:0], d.Reply)
	m.Addr = dst
	o.info = append(o.info, sentReply{req: req, reply: d.Reply, outcome: d.Outcome})
}

func (o *outgoing) reset() {
	for i := range o.msgs {
		o.msgs[i].Addr = nil // the buffers stay, for the next batch
	}
	clear(o.info) // let the packets be collected
	o.msgs, o.info = o.msgs[:0], o.info[:0]
}

// commitQueue holds the replies waiting for the lease journal.
type commitQueue struct {
	mu      sync.Mutex
	waiting outgoing
	commit  lease.Seq // the position all of them wait for
	// ready wakes the committer; closed when the reader stops.
	ready chan struct{}
}

func (q *commitQueue) add(req *dhcpv4.DHCPv4, d dhcp.Decision, dst *net.UDPAddr) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.commit = max(q.commit, d.Commit)
	if d.Reply != nil {
		q.waiting.add(req, d, dst)
	}
}

// wake tells the committer there is work, without waiting for it.
func (q *commitQueue) wake() {
	select {
	case q.ready <- struct{}{}:
	default:
	}
}

// take swaps what is waiting for spare (emptied).
func (q *commitQueue) take(spare *outgoing) (outgoing, lease.Seq) {
	spare.reset()
	q.mu.Lock()
	defer q.mu.Unlock()
	got, commit := q.waiting, q.commit
	q.waiting, q.commit = *spare, 0
	return got, commit
}

// serve runs until the socket is closed (by the server, when ctx ends).
func (s *dhcpServer) serve(ctx context.Context) error {
	pc := ipv4.NewPacketConn(s.conn)
	q := &commitQueue{ready: make(chan struct{}, 1)}
	committed := make(chan struct{})
	go func() {
		defer close(committed)
		s.commitAndSend(ctx, pc, q)
	}()
	defer func() { close(q.ready); <-committed }()

	in := make([]ipv4.Message, batchSize)
	for i := range in {
		// Ethernet frames hold 1500 bytes; more arrive as IP fragments,
		// reassembled up to this size.
		in[i].Buffers = [][]byte{make([]byte, 4096)}
	}
	var now outgoing
	for {
		n, err := pc.ReadBatch(in, 0)
		if err != nil {
			if ctx.Err() != nil {
				return nil // the server closed the socket
			}
			return err
		}
		now.reset()
		queued := false
		for i := range in[:n] {
			m := &in[i]
			peer, _ := m.Addr.(*net.UDPAddr)
			req, err := dhcpv4.FromBytes(m.Buffers[0][:m.N])
			if err != nil {
				s.log.Debug("malformed DHCP packet", "from", peer, "err", err)
				continue
			}
			d, err := s.decider.Decide(req, s.port)
			s.sighted(req, d, s.port, peer)
			if err != nil {
				s.log.Warn("dhcp request rejected", "mac", req.ClientHWAddr.String(), "port", s.port, "type", d.RequestType, "err", err)
			} else if d.Reply == nil && s.log.Enabled(ctx, slog.LevelDebug) {
				s.log.Debug("dhcp request handled without reply", "mac", req.ClientHWAddr.String(), "port", s.port, "type", d.RequestType, "outcome", d.Outcome)
			}
			var dst *net.UDPAddr
			if d.Reply != nil {
				dst = dhcp.Destination(req, d.Reply, s.port, peer)
			}
			switch {
			case d.Commit != 0:
				q.add(req, d, dst)
				queued = true
			case d.Reply != nil:
				now.add(req, d, dst)
			}
		}
		s.send(ctx, pc, &now)
		if queued {
			q.wake()
		}
	}
}

// commitAndSend makes the queued lease changes durable and sends the
// replies that waited for them, until q.ready is closed. If the journal
// cannot be written, those replies are dropped: better silence than an
// ACK a restart would forget.
func (s *dhcpServer) commitAndSend(ctx context.Context, pc *ipv4.PacketConn, q *commitQueue) {
	var spare outgoing
	for {
		_, open := <-q.ready
		batch, commit := q.take(&spare)
		if commit != 0 {
			if err := s.commit(commit); err != nil {
				s.log.Error("lease journal: replies that grant leases are not sent", "replies", len(batch.msgs), "err", err)
				batch.reset()
			}
		}
		s.send(ctx, pc, &batch)
		spare = batch
		if !open {
			return
		}
	}
}

// send sends o's replies, batchSize at a time.
func (s *dhcpServer) send(ctx context.Context, pc *ipv4.PacketConn, o *outgoing) {
	for i := 0; i < len(o.msgs); {
		n, err := pc.WriteBatch(o.msgs[i:min(i+batchSize, len(o.msgs))], 0)
		if err != nil {
			// The first datagram failed (say, no route to a relay);
			// the rest may not.
			if ctx.Err() == nil {
				s.log.Warn("dhcp send", "to", o.msgs[i].Addr, "err", err)
			}
			n = 1
		} else {
			s.logSent(ctx, o.msgs[i:i+n], o.info[i:i+n])
		}
		i += n
	}
}

func (s *dhcpServer) logSent(ctx context.Context, msgs []ipv4.Message, info []sentReply) {
	if !s.log.Enabled(ctx, slog.LevelInfo) {
		return // spare the hot path building lines nobody reads
	}
	for i, r := range info {
		attrs := []any{"mac", r.req.ClientHWAddr.String(), "port", s.port, "outcome", r.outcome,
			"ip", r.reply.YourIPAddr, "file", r.reply.BootFileName, "to", msgs[i].Addr}
		if !r.req.GatewayIPAddr.IsUnspecified() {
			attrs = append(attrs, "relay", r.req.GatewayIPAddr,
				"option82", r.reply.GetOneOption(dhcpv4.OptionRelayAgentInformation) != nil)
		}
		s.log.Info("dhcp reply", attrs...)
	}
}
