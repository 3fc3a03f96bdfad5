package vpnhub

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/quic-go/quic-go"
	"github.com/quic-go/quic-go/qlogwriter"
	"github.com/rs/zerolog"

	"code.foss.global/serve.zone/relay/contracts"
	"code.foss.global/serve.zone/relay/feature"
	"code.foss.global/serve.zone/relay/vpnhub/internal/wire"
	"code.foss.global/serve.zone/relay/vpnhub/quicsock"
	"code.foss.global/serve.zone/relay/vpnhub/vpnkey"
)

// Options are what every component of the relay is built with. The zero value is usable.
type Options struct {
	// Logger is the relay's logger; the hub adds component "vpnhub".
	Logger zerolog.Logger
	// Registerer gets the hub's metrics; nil leaves them unregistered.
	Registerer prometheus.Registerer
	// Clock judges and schedules member expiry and silent sessions; nil is the wall clock.
	Clock Clock
}

// Config says what the hub serves and how. Zero values are the defaults.
type Config struct {
	// Listen is host:port; the host must be the concrete IPv4 address the hub binds (inside
	// vpn.hubPrefix in production): the hub reports exactly what it bound.
	Listen string
	// Conn, when set, is an already bound UDP socket to serve on instead of binding Listen (tests
	// bind one inside a network namespace). The hub closes it when Run ends.
	Conn net.PacketConn
	// ReportAddress, when valid, is reported by Endpoint instead of the bound address. Only for
	// `relay-dev`, whose hub binds loopback, which registerClusterRelay refuses.
	ReportAddress netip.Addr
	// Key is the hub's static Noise key.
	Key vpnkey.Pair

	InitialPacketSize uint16        // QUIC packet size to start with; 0: quic-go's 1280
	QueueLen          int           // packets queued per member; 0: DefaultQueueLen
	HandshakeTimeout  time.Duration // QUIC plus Noise handshake; 0: 5 s
	IdleTimeout       time.Duration // a member silent this long is gone; 0: 30 s

	// Handshake admission (ratelimit.go). Per-source values below WireGuard's 20/s, burst 5
	// are raised to them.
	HandshakeRate        float64
	HandshakeBurst       int
	GlobalHandshakeRate  float64 // 0: DefaultGlobalHandshakeRate
	GlobalHandshakeBurst int     // 0: DefaultGlobalHandshakeBurst
	// MaxHandshakes bounds the handshakes in progress at once, from a connection's first packet
	// to the judgement of its message 1; a connection beyond it is refused (busy) before any TLS
	// work. 0: DefaultMaxHandshakes.
	MaxHandshakes int

	// QUICTracer, when set, traces every QUIC connection (qlog). For diagnosis only: it costs an
	// event per packet.
	QUICTracer func(ctx context.Context, isClient bool, connID quic.ConnectionID) qlogwriter.Trace
}

// Defaults.
const (
	DefaultQueueLen         = 1024
	DefaultHandshakeTimeout = 5 * time.Second
	DefaultIdleTimeout      = 30 * time.Second
	keepAlivePeriod         = 10 * time.Second // QUIC PINGs, so that an idle member's path stays open
)

// Hub is the cluster's managed VPN hub; relay.go is how the relay reaches it.
type Hub struct {
	cfg      Config         // set at construction, defaults filled
	log      zerolog.Logger // set at construction
	m        *metrics       // set at construction
	clock    Clock          // set at construction
	tr       *quic.Transport
	batch    *quicsock.Conn // the socket under tr; nil when it is not a UDP socket
	ln       *quic.Listener
	endpoint contracts.VPNHubEndpoint
	limiter  *handshakeLimiter
	slots    handshakeSlots
	logs     logLimiter

	view atomic.Pointer[membershipView] // swapped under mu; read lock-free by handshakes
	// standby is written under mu (lead.go), read lock-free by handshakes and forward. False
	// until the relay says otherwise: a relay without HA leads from the start.
	standby atomic.Bool
	// tenure is the relay's tenure as the leader (feature.Tenure), set by UseTenure before the hub
	// runs; nil: always held (a hub outside a relay, a relay without HA).
	tenure feature.Tenure

	mu        sync.Mutex
	sessions  map[[32]byte]*session // guarded by mu: the current session of each member key
	lastHello map[[32]byte]int64    // guarded by mu: the greatest hello timestamp accepted per member key
	timer     Timer                 // guarded by mu: the next expiry
	stopped   bool                  // guarded by mu: Run ended; sessions are refused
	watchers  []*replicaWatcher     // guarded by mu: standbys the membership is copied to (replica.go)
	records   []replicaRecord       // guarded by mu: the view's records for them, built on demand; nil: not yet
	copied    stagedCopy            // guarded by mu: a standby's records from its leader, not yet a whole view

	routesMu sync.RWMutex
	routes   map[uint32]*session // guarded by routesMu: control address → session

	wg sync.WaitGroup // handshake and session goroutines
}

// Listen binds the hub's UDP socket and QUIC listener and registers the hub's metrics. The hub
// serves once Run is called.
func Listen(cfg Config, opts Options) (*Hub, error) {
	if opts.Clock == nil {
		opts.Clock = wallClock{}
	}
	if cfg.QueueLen <= 0 {
		cfg.QueueLen = DefaultQueueLen
	}
	if cfg.HandshakeTimeout <= 0 {
		cfg.HandshakeTimeout = DefaultHandshakeTimeout
	}
	if cfg.IdleTimeout <= 0 {
		cfg.IdleTimeout = DefaultIdleTimeout
	}
	if cfg.GlobalHandshakeRate <= 0 {
		cfg.GlobalHandshakeRate = DefaultGlobalHandshakeRate
	}
	if cfg.GlobalHandshakeBurst <= 0 {
		cfg.GlobalHandshakeBurst = DefaultGlobalHandshakeBurst
	}
	if cfg.MaxHandshakes <= 0 {
		cfg.MaxHandshakes = DefaultMaxHandshakes
	}
	if cfg.Key.Public == ([32]byte{}) {
		return nil, errors.New("vpnhub: no static key")
	}

	conn := cfg.Conn
	if conn == nil {
		addr, err := ParseListen(cfg.Listen)
		if err != nil {
			return nil, err
		}
		sock, err := net.ListenUDP("udp4", net.UDPAddrFromAddrPort(addr))
		if err != nil {
			return nil, fmt.Errorf("vpnhub: bind %s: %w", addr, err)
		}
		conn = sock
	}
	var batch *quicsock.Conn
	if sock, ok := conn.(*net.UDPConn); ok {
		batch = quicsock.New(sock) // the hub owns the socket either way: Run closes it
		conn = batch
	}
	bound, err := netip.ParseAddrPort(conn.LocalAddr().String())
	if err != nil || !bound.Addr().Unmap().Is4() || bound.Addr().IsUnspecified() {
		conn.Close()
		return nil, fmt.Errorf("vpnhub: socket bound to %s: %w", conn.LocalAddr(), ErrListenAddress)
	}
	report := bound.Addr().Unmap()
	if cfg.ReportAddress.IsValid() {
		report = cfg.ReportAddress
	}
	tlsConf, err := wire.HubTLSConfig()
	if err != nil {
		conn.Close()
		return nil, fmt.Errorf("vpnhub: certificate: %w", err)
	}
	h := &Hub{
		cfg: cfg, log: opts.Logger.With().Str("component", "vpnhub").Logger(), m: newMetrics(), clock: opts.Clock,
		endpoint: contracts.VPNHubEndpoint{Address: report.String(), QUICPort: int(bound.Port()),
			NoisePublicKey: contracts.EncodeKey32(cfg.Key.Public)},
		limiter:  newHandshakeLimiter(cfg.HandshakeRate, cfg.HandshakeBurst, cfg.GlobalHandshakeRate, cfg.GlobalHandshakeBurst, opts.Clock.Now),
		sessions: make(map[[32]byte]*session), lastHello: make(map[[32]byte]int64), routes: make(map[uint32]*session),
		batch: batch, slots: newHandshakeSlots(cfg.MaxHandshakes),
	}
	resetKey, tokenKey := quicKeys(&cfg.Key)
	h.tr = &quic.Transport{Conn: conn, ConnContext: h.admit, VerifySourceAddress: func(net.Addr) bool { return h.limiter.underPressure() },
		StatelessResetKey: &resetKey, TokenGeneratorKey: &tokenKey}
	h.ln, err = h.tr.Listen(tlsConf, &quic.Config{
		EnableDatagrams: true, InitialPacketSize: cfg.InitialPacketSize,
		HandshakeIdleTimeout: cfg.HandshakeTimeout, MaxIdleTimeout: cfg.IdleTimeout, KeepAlivePeriod: keepAlivePeriod,
		MaxIncomingStreams: 1, MaxIncomingUniStreams: -1, Tracer: cfg.QUICTracer,
	})
	if err != nil {
		h.tr.Close()
		conn.Close()
		return nil, fmt.Errorf("vpnhub: listen: %w", err)
	}
	if err := h.m.register(opts.Registerer); err != nil {
		h.Close()
		return nil, fmt.Errorf("register vpn hub metrics: %w", err)
	}
	return h, nil
}

// ParseListen reads a hub listen address: a concrete IPv4 literal and a port. An empty host or a
// wildcard is refused: the hub reports the address it bound, and the seeds' example binds the hub
// on its own address inside vpn.hubPrefix, apart from the relay's listener.
func ParseListen(s string) (netip.AddrPort, error) {
	host, port, err := net.SplitHostPort(s)
	if err != nil || host == "" || port == "" {
		return netip.AddrPort{}, ErrListenAddress
	}
	ap, err := netip.ParseAddrPort(s)
	if err != nil || !ap.Addr().Is4() || ap.Addr().IsUnspecified() || ap.Addr().IsMulticast() ||
		ap.Addr() == netip.AddrFrom4([4]byte{255, 255, 255, 255}) || strings.Contains(host, ":") {
		return netip.AddrPort{}, ErrListenAddress
	}
	return ap, nil
}

// Endpoint is what the relay reports to Cloudly with registerClusterVpnHub: the bound address and
// port and the static public key.
func (h *Hub) Endpoint() contracts.VPNHubEndpoint { return h.endpoint }

// Addr is the address and port the hub's socket is bound to.
func (h *Hub) Addr() netip.AddrPort {
	ap, _ := netip.ParseAddrPort(h.tr.Conn.LocalAddr().String())
	return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
}

// PushMembership serves pushClusterVpnMembership: a newer generation replaces the membership and
// closes at once every session whose member is gone (vpn-member-removed), expired
// (vpn-member-expired), now under another authority (vpn-authority-mismatch) or given another node
// id or control address (vpn-member-removed: it must join again to learn it). An older or equal
// generation changes nothing. Either way the answer is { appliedGeneration }, the generation held.
func (h *Hub) PushMembership(body json.RawMessage) (json.RawMessage, error) {
	m, err := contracts.ReadVPNMembershipPush(body)
	if err != nil {
		var inv *contracts.InvalidError
		if errors.As(err, &inv) {
			return nil, contracts.RelayRequestInvalid.Refuse("%s", strings.Join(inv.Reasons, "; "))
		}
		return nil, contracts.RelayRequestInvalid.Refuse("vpn membership unreadable")
	}
	now := h.clock.Now().UnixMilli()
	h.mu.Lock()
	if cur := h.view.Load(); cur != nil && m.Generation <= cur.generation {
		h.mu.Unlock()
		h.log.Info().Int64("generation", m.Generation).Int64("held", cur.generation).Str("outcome", "stale").
			Msg("vpn membership not newer than the one held")
		return contracts.EncodeVPNMembershipApplied(cur.generation), nil
	}
	victims := h.installLocked(newMembershipView(m), now)
	h.mu.Unlock()
	shutVictims(victims)
	h.log.Info().Int64("generation", m.Generation).Int("members", len(m.Members)).Int("closed", len(victims)).
		Str("outcome", "applied").Msg("vpn membership applied")
	return contracts.EncodeVPNMembershipApplied(m.Generation), nil
}

// victim is a session a change closes, and the refusal it is closed with.
type victim struct {
	s      *session
	reason *contracts.Refusal
}

// installLocked makes v the membership (nil: none) and takes every session it no longer admits
// out of the tables: a member gone (vpn-member-removed), now under another authority
// (vpn-authority-mismatch), given another node id or control address (vpn-member-removed: it
// must join again to learn it) or expired (vpn-member-expired). The standbys copying the
// membership are sent the change. The victims are shut by the caller once mu is released.
func (h *Hub) installLocked(v *membershipView, now int64) []victim {
	old := h.view.Load()
	h.view.Store(v)
	h.records = nil
	for key := range h.lastHello { // a key that leaves starts afresh if it comes back
		if _, ok := v.lookup(key); !ok {
			delete(h.lastHello, key)
		}
	}
	var victims []victim
	for key, s := range h.sessions {
		mem, ok := v.lookup(key)
		var r *contracts.Refusal
		switch {
		case v == nil:
			r = contracts.VPNMemberRemoved.Refuse("node %s: the hub holds no membership now", s.member.NodeID)
		case !ok:
			r = contracts.VPNMemberRemoved.Refuse("node %s is not in membership generation %d", s.member.NodeID, v.generation)
		case v.authorityID != s.authority:
			r = contracts.VPNAuthorityMismatch.Refuse("membership generation %d belongs to authority %s", v.generation, v.authorityID)
		case mem.NodeID != s.member.NodeID || mem.ControlAddress != s.member.ControlAddress:
			r = contracts.VPNMemberRemoved.Refuse("node %s changed in membership generation %d: join again", s.member.NodeID, v.generation)
		case now >= mem.ExpiresAt:
			r = contracts.VPNMemberExpired.Refuse("node %s expired at %d", mem.NodeID, mem.ExpiresAt)
		default:
			s.expiresAt.Store(mem.ExpiresAt)
			continue
		}
		h.detachLocked(s)
		victims = append(victims, victim{s, r})
	}
	h.rescheduleLocked(now)
	if v == nil {
		h.m.members.Set(0)
		h.m.generation.Set(-1)
	} else {
		h.m.members.Set(float64(len(v.members)))
		h.m.generation.Set(float64(v.generation))
	}
	h.replicateLocked(old, v)
	return victims
}

// shutVictims closes the sessions installLocked took out, each with its refusal.
func shutVictims(victims []victim) {
	for _, vi := range victims {
		vi.s.shut(contracts.VPNCloseCodeRefused, vi.reason, string(vi.reason.Name))
	}
}

// Run serves until ctx ends, then closes every session and the listener.
func (h *Hub) Run(ctx context.Context) error {
	h.log.Info().Str("listen", h.tr.Conn.LocalAddr().String()).Str("key", contracts.ShortKey(h.cfg.Key.Public)).
		Msg("vpn hub serving")
	acceptErr := make(chan error, 1)
	go func() {
		for {
			conn, err := h.ln.Accept(ctx)
			if err != nil {
				acceptErr <- err
				return
			}
			h.wg.Add(1)
			go h.serveConn(ctx, conn)
		}
	}()
	var err error
	select {
	case <-ctx.Done():
	case err = <-acceptErr:
		if ctx.Err() == nil {
			err = fmt.Errorf("vpnhub: accept: %w", err)
		}
	}
	h.mu.Lock()
	h.stopped = true
	all := make([]*session, 0, len(h.sessions))
	for _, s := range h.sessions {
		h.detachLocked(s)
		all = append(all, s)
	}
	if h.timer != nil {
		h.timer.Stop()
	}
	h.mu.Unlock()
	for _, s := range all {
		s.shut(contracts.VPNCloseCodeNone, nil, closeShutdown)
	}
	h.ln.Close()
	if err == nil {
		<-acceptErr
	}
	h.wg.Wait() // handshakes in flight end with ctx; their connections close while the socket is open
	h.tr.Close()
	h.tr.Conn.Close()
	h.log.Info().Msg("vpn hub stopped")
	if ctx.Err() != nil {
		return nil
	}
	return err
}

// Close releases the socket of a hub that was bound but will never Run (the relay failed to
// start). Run closes everything itself.
func (h *Hub) Close() error {
	h.ln.Close()
	h.tr.Close()
	return h.tr.Conn.Close()
}

// admit is QUIC's ConnContext: handshake admission before any TLS or Noise work. A handshake
// admitted holds one of the hub's handshake slots until its message 1 is judged or its connection
// ends (ratelimit.go).
func (h *Hub) admit(ctx context.Context, info *quic.ClientInfo) (context.Context, error) {
	outcome := outcomeRateLimited
	ap, err := netip.ParseAddrPort(info.RemoteAddr.String())
	if err == nil && h.limiter.allow(ap.Addr()) {
		release, ok := h.slots.take()
		if ok {
			context.AfterFunc(ctx, release) // the connection ended before its message 1 was judged
			return context.WithValue(ctx, slotKey{}, release), nil
		}
		outcome = outcomeBusy
	}
	h.m.handshake(outcome)
	if e := h.log.Debug(); e != nil {
		if h.logs.allow(int(dropReasons), h.clock.Now()) {
			e.Str("remote", info.RemoteAddr.String()).Str("outcome", outcome).Msg("vpn handshake refused")
		} else {
			e.Discard()
		}
	}
	if outcome == outcomeBusy {
		return nil, errors.New("vpnhub: too many handshakes in progress")
	}
	return nil, errors.New("vpnhub: handshake rate limit")
}

// slotKey is the context key of a connection's handshake slot: its release function.
type slotKey struct{}

// releaseSlot gives back conn's handshake slot, if it holds one.
func releaseSlot(conn *quic.Conn) {
	if release, ok := conn.Context().Value(slotKey{}).(func()); ok {
		release()
	}
}

// serveConn runs one connection: the Noise handshake, then the session.
func (h *Hub) serveConn(ctx context.Context, conn *quic.Conn) {
	defer h.wg.Done()
	stop := context.AfterFunc(ctx, func() { conn.CloseWithError(contracts.VPNCloseCodeNone, "hub shutting down") })
	s, ref, err := h.handshake(ctx, conn)
	stop()
	releaseSlot(conn) // message 1 is judged: what follows is a member's session or a close
	open := true
	if s != nil {
		// The session is routable before message 2 leaves, so that once the member's handshake
		// completes its peers reach it; what they send meanwhile waits in its queue, and what it
		// receives early waits in QUIC's datagram queue until it holds the keys.
		ref, open = h.register(s)
	}
	switch {
	case ref != nil:
		h.m.handshake(string(ref.Name))
		h.logRefusal(conn, ref)
		conn.CloseWithError(contracts.VPNCloseCodeRefused, wire.CloseReason(ref))
		return
	case err != nil:
		h.m.handshake(outcomeBroken)
		if e := h.log.Debug(); e != nil {
			e.Str("remote", conn.RemoteAddr().String()).Str("outcome", outcomeBroken).Str("error", err.Error()).Msg("vpn handshake broke off")
		}
		conn.CloseWithError(contracts.VPNCloseCodeNone, "handshake failed")
		return
	case !open:
		conn.CloseWithError(contracts.VPNCloseCodeNone, "hub shutting down")
		return
	}
	if err := wire.WriteFrame(s.stream, s.msg2); err != nil {
		h.m.handshake(outcomeBroken)
		s.shut(contracts.VPNCloseCodeNone, nil, closeLeft)
		return
	}
	s.stream.SetDeadline(time.Time{})
	h.m.handshake(outcomeAccepted)
	h.log.Info().Str("node", s.member.NodeID).Str("key", contracts.ShortKey(s.member.PublicKey)).
		Str("controlAddress", s.member.ControlAddress.String()).Int("mtu", s.mtu).Str("remote", conn.RemoteAddr().String()).
		Str("outcome", outcomeAccepted).Msg("vpn member joined")
	s.run()
}

func (h *Hub) logRefusal(conn *quic.Conn, ref *contracts.Refusal) {
	e := h.log.Info()
	if !h.logs.allow(int(dropReasons)+1, h.clock.Now()) {
		e = h.log.Debug() // a flood of refusals is counted, not logged line by line
	}
	e.Str("remote", conn.RemoteAddr().String()).Str("outcome", string(ref.Name)).Str("reason", ref.Reason).Msg("vpn handshake refused")
}

// handshake reads message 1 and judges it. An accepted handshake is a session that is not yet
// registered.
func (h *Hub) handshake(ctx context.Context, conn *quic.Conn) (*session, *contracts.Refusal, error) {
	if !h.serving() {
		return nil, standbyRefusal(), nil // before any Noise work: a standby serves no membership
	}
	deadline := time.Now().Add(h.cfg.HandshakeTimeout)
	hctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	stream, err := conn.AcceptStream(hctx)
	if err != nil {
		return nil, nil, fmt.Errorf("accept handshake stream: %w", err)
	}
	stream.SetDeadline(deadline)
	msg1, err := wire.ReadFrame(stream, wire.MaxHandshakeMessage)
	if err != nil {
		return nil, nil, fmt.Errorf("read message 1: %w", err)
	}
	mtu, err := wire.DatagramMTU(conn)
	if err != nil {
		return nil, nil, err
	}
	acc, ref := respond(&h.cfg.Key, h.view.Load(), msg1, h.clock.Now().UnixMilli(), mtu, nil)
	if ref != nil {
		return nil, ref, nil
	}
	return newSession(h, conn, stream, acc, mtu), nil, nil
}

// register makes s its member's current session, replacing any earlier one
// (vpn-member-replaced). It refuses s while the hub's relay stands by (vpn-hub-standby), when
// its hello's timestamp is not newer than the last one accepted for its key
// (vpn-handshake-replayed: docs/protocol.md#vpn-hub, so that a recorded message 1 can never displace a live
// session), or when the membership changed under the handshake (vpn-member-removed). open is
// false when the hub is stopping.
func (h *Hub) register(s *session) (ref *contracts.Refusal, open bool) {
	h.mu.Lock()
	old, ref, open := h.registerLocked(s)
	h.mu.Unlock()
	if old != nil {
		old.shut(contracts.VPNCloseCodeRefused,
			contracts.VPNMemberReplaced.Refuse("node %s opened a newer session", old.member.NodeID), string(contracts.VPNMemberReplaced))
	}
	return ref, open
}

func (h *Hub) registerLocked(s *session) (old *session, ref *contracts.Refusal, open bool) {
	if h.stopped {
		return nil, nil, false
	}
	if !h.serving() {
		return nil, standbyRefusal(), true
	}
	v := h.view.Load()
	var mem contracts.VPNMember
	ok := false
	if v != nil {
		mem, ok = v.byKey[s.member.PublicKey]
	}
	last, seen := h.lastHello[s.member.PublicKey]
	switch {
	case !ok:
		return nil, contracts.VPNMemberRemoved.Refuse("node %s left the membership during its handshake", s.member.NodeID), true
	case v.authorityID != s.authority || mem.NodeID != s.member.NodeID || mem.ControlAddress != s.member.ControlAddress:
		return nil, contracts.VPNMemberRemoved.Refuse("node %s changed during its handshake: join again", s.member.NodeID), true
	case seen && s.hello <= last:
		return nil, contracts.VPNHandshakeReplayed.Refuse("node %s: message 1 timestamp %d is not after %d", s.member.NodeID, s.hello, last), true
	}
	h.lastHello[s.member.PublicKey] = s.hello
	s.expiresAt.Store(mem.ExpiresAt)
	old = h.sessions[s.member.PublicKey]
	if old != nil {
		h.detachLocked(old)
	}
	h.sessions[s.member.PublicKey] = s
	h.routesMu.Lock()
	h.routes[s.addr] = s
	h.routesMu.Unlock()
	h.m.sessions.Inc()
	h.rescheduleLocked(h.clock.Now().UnixMilli())
	return old, nil, true
}

// detachLocked takes s out of the session and route tables, if it is still in them.
func (h *Hub) detachLocked(s *session) {
	if h.sessions[s.member.PublicKey] != s {
		return
	}
	delete(h.sessions, s.member.PublicKey)
	h.routesMu.Lock()
	if h.routes[s.addr] == s {
		delete(h.routes, s.addr)
	}
	h.routesMu.Unlock()
	h.m.sessions.Dec()
}

// detach is detachLocked for a session ending on its own.
func (h *Hub) detach(s *session) {
	h.mu.Lock()
	h.detachLocked(s)
	h.mu.Unlock()
}

// route returns the session at a control address.
func (h *Hub) route(addr uint32) *session {
	h.routesMu.RLock()
	s := h.routes[addr]
	h.routesMu.RUnlock()
	return s
}

// rescheduleLocked sets the expiry timer for the earliest member expiry among the sessions.
func (h *Hub) rescheduleLocked(nowMs int64) {
	if h.timer != nil {
		h.timer.Stop()
		h.timer = nil
	}
	next := int64(-1)
	for _, s := range h.sessions {
		if e := s.expiresAt.Load(); next < 0 || e < next {
			next = e
		}
	}
	if next < 0 || h.stopped {
		return
	}
	h.timer = h.clock.AfterFunc(expiryWait(next-nowMs), h.expire)
}

// maxExpiryWait bounds the expiry timer: a later expiry is looked at again after this long.
const maxExpiryWait = 24 * time.Hour

// expiryWait is how long to wait for an expiry dueMs milliseconds away. A far expiry (expiresAt
// is any safe integer, up to 2^53 ms) would overflow time.Duration, often to a negative wait that
// fires at once and reschedules itself forever; it waits maxExpiryWait instead.
func expiryWait(dueMs int64) time.Duration {
	if dueMs <= 0 {
		return 0
	}
	if dueMs >= int64(maxExpiryWait/time.Millisecond) {
		return maxExpiryWait
	}
	return time.Duration(dueMs) * time.Millisecond
}

// expire closes every session whose member has expired (vpn-member-expired).
func (h *Hub) expire() {
	now := h.clock.Now().UnixMilli()
	h.mu.Lock()
	var due []*session
	for _, s := range h.sessions {
		if now >= s.expiresAt.Load() {
			due = append(due, s)
		}
	}
	for _, s := range due {
		h.detachLocked(s)
	}
	h.rescheduleLocked(now)
	h.mu.Unlock()
	for _, s := range due {
		s.shut(contracts.VPNCloseCodeRefused,
			contracts.VPNMemberExpired.Refuse("node %s expired at %d", s.member.NodeID, s.expiresAt.Load()), string(contracts.VPNMemberExpired))
	}
}
