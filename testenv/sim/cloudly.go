package sim

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coder/websocket"
	"github.com/rs/zerolog"

	"code.foss.global/serve.zone/relay/contracts"
	"code.foss.global/serve.zone/relay/contracts/strictjson"
	"code.foss.global/serve.zone/relay/internal/typedsocket"
)

// Cloudly is a control-plane stand-in: a WebSocket server that accepts the relay's socket and
// plays Cloudly's side of the protocol — the client session, the relay registration with its
// sequence (judged exact-key, as the seed's validator does), the hub report, node registrations,
// the configuration push — and can call the relay like Cloudly.
type Cloudly struct {
	ClusterID string                  // the cluster it serves (default "cluster-sim")
	Token     string                  // the machine JWT it accepts (default "sim-machine-jwt")
	Offer     contracts.ProtocolOffer // the offer it answers with (default: the relay's own)
	Origin    string                  // the relay origin it answers with

	log zerolog.Logger
	srv *http.Server
	ln  net.Listener

	mu          sync.Mutex
	conn        *typedsocket.Conn          // guarded by mu: the relay's newest socket
	attachedTo  *typedsocket.Conn          // guarded by mu: the socket whose registration was accepted
	attachedAll map[*typedsocket.Conn]bool // guarded by mu: every open socket whose registration was accepted
	sequences   newest[int64]              // guarded by mu: registrationSequence of the newest registrations
	refuseAll   error                      // guarded by mu: the answer to every registration while set
	last        map[string][]byte          // guarded by mu: the newest request body per method
	lastNode    map[string][]byte          // guarded by mu: the newest request's relayNodeId per method, raw; empty: none
	handlers    map[string]MethodFunc      // guarded by mu
	async       map[string]AsyncMethodFunc // guarded by mu
	received    map[string]int             // guarded by mu: requests per method from the relay
	nodes       map[string]int             // guarded by mu: accepted registrations per node
	sessions    map[string][]byte          // guarded by mu: the current session binding per node
	authed      map[*typedsocket.Conn]bool // guarded by mu: sockets whose client session was accepted
	lastSeq     int64                      // guarded by mu: the last accepted registrationSequence; -1 none
	violations  []string                   // guarded by mu: the first few things the relay sent out of Cloudly's order
	corestores  []contracts.CorestoreOrigin
	attachedSig chan struct{}                  // guarded by mu: closed on the next accepted registration
	hub         *contracts.ClusterVpnHubReport // guarded by mu: the hub the newest accepted report named
	hubSig      chan struct{}                  // guarded by mu: closed on the next accepted hub report
	afterAccept []afterCall                    // guarded by mu: sent right after every accepted registration
	ha          haJudge                        // guarded by mu: who registered on which socket, and acted after (cloudlyha.go)

	streams  *streams         // set at construction: VirtualStreams on the relay's socket
	platform *PlatformCloudly // set at construction: the platform agent's side (platformcloudly.go)

	registrations atomic.Int64 // accepted relay registrations
	twoAttached   atomic.Int64 // registrations accepted while another accepted socket was still open
	slowness      atomic.Int64 // nanoseconds added before every answer
	direct        atomic.Bool  // nodes may talk to this Cloudly without a relay (AcceptNodesDirectly)
	unavailable   atomic.Bool  // refuse the relay's sockets, as an unreachable Cloudly would
	disabled      atomic.Bool  // the operator disabled the relay: config pushes carry relay: null
	configPushes  atomic.Int64 // pushClusterRelayConfig answered without error
	deadTimeout   atomic.Int64 // nanoseconds: the sockets' typedsocket DeadTimeout; zero: its default
}

// afterCall is a request Cloudly sends on the relay's socket right after accepting its registration.
type afterCall struct {
	method string
	body   json.RawMessage
	done   func(typedsocket.Reply)
}

// MethodFunc serves one method Cloudly receives.
type MethodFunc func(body json.RawMessage) (json.RawMessage, error)

// AsyncMethodFunc serves one method Cloudly receives and answers it later, from any goroutine,
// through reply (exactly once). It runs on the socket's read loop and must not block.
type AsyncMethodFunc func(body json.RawMessage, reply func(json.RawMessage, error))

// NewCloudly starts a Cloudly stand-in on a loopback port.
func NewCloudly(log zerolog.Logger) (*Cloudly, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	c := &Cloudly{
		ClusterID: "cluster-sim", Token: "sim-machine-jwt", Offer: contracts.RelayOffer,
		Origin: "https://relay.cluster-sim.serve.zone:8443",
		log:    log.With().Str("component", "sim-cloudly").Logger(), ln: ln,
		handlers: make(map[string]MethodFunc), async: make(map[string]AsyncMethodFunc), received: make(map[string]int), nodes: make(map[string]int),
		sessions: make(map[string][]byte), authed: make(map[*typedsocket.Conn]bool), lastSeq: -1,
		attachedAll: make(map[*typedsocket.Conn]bool),
		last:        make(map[string][]byte),
		lastNode:    make(map[string][]byte),
		attachedSig: make(chan struct{}),
		hubSig:      make(chan struct{}),
		streams:     newStreams(),
	}
	c.platform = newPlatformCloudly(c)
	c.srv = &http.Server{Handler: http.HandlerFunc(c.accept), ReadHeaderTimeout: 5 * time.Second}
	go c.srv.Serve(ln)
	return c, nil
}

// URL is the ws:// URL the relay dials.
func (c *Cloudly) URL() string { return "ws://" + c.ln.Addr().String() + "/" }

// Close stops the stand-in and drops the relay's socket.
func (c *Cloudly) Close() {
	c.srv.Close()
	c.Drop()
}

// Drop closes the relay's current socket without a handshake, as a crashed Cloudly would.
func (c *Cloudly) Drop() {
	c.mu.Lock()
	conn := c.conn
	c.mu.Unlock()
	if conn != nil {
		conn.CloseNow()
		<-conn.Done()
	}
}

// Handle serves method with f instead of the default answer.
func (c *Cloudly) Handle(method string, f MethodFunc) {
	c.mu.Lock()
	c.handlers[method] = f
	c.mu.Unlock()
}

// HandleAsync serves method with f, which may hold its answer: Cloudly keeps reading meanwhile.
// The request body is handed to f and not kept by Cloudly, so that what a held request costs is
// the relay's alone.
func (c *Cloudly) HandleAsync(method string, f AsyncMethodFunc) {
	c.mu.Lock()
	c.async[method] = f
	c.mu.Unlock()
}

// SetRegistrationRefusal answers every registerClusterRelay with err until it is set to nil.
func (c *Cloudly) SetRegistrationRefusal(err error) {
	c.mu.Lock()
	c.refuseAll = err
	c.mu.Unlock()
}

// Last is the newest request body of method Cloudly received.
func (c *Cloudly) Last(method string) []byte {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.last[method]
}

// LastRelayNode is the relayNodeId the newest request of method stated in its envelope, decoded;
// "" when it stated none.
func (c *Cloudly) LastRelayNode(method string) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	raw := c.lastNode[method] // reused by the next request: read under mu
	if len(raw) == 0 {
		return ""
	}
	s, err := strictjson.ReadString(raw)
	if err != nil {
		return "unreadable " + string(raw)
	}
	return s
}

// SetAvailable(false) drops the relay's socket and refuses new ones until SetAvailable(true): a
// Cloudly outage as the relay sees it.
func (c *Cloudly) SetAvailable(ok bool) {
	c.unavailable.Store(!ok)
	if !ok {
		c.Drop()
	}
}

// Available reports whether Cloudly accepts the relay's sockets: false from SetAvailable(false)
// until SetAvailable(true), before the relay's socket is dropped.
func (c *Cloudly) Available() bool { return !c.unavailable.Load() }

// SetDeadTimeout sets how long the relay's sockets accepted from now on may be silent before
// this Cloudly drops them (typedsocket's DeadTimeout, 45 s by default). A test that stalls
// Cloudly's read loop on purpose, for as long as a busy machine takes, sets it out of the way.
func (c *Cloudly) SetDeadTimeout(d time.Duration) { c.deadTimeout.Store(int64(d)) }

// SetSlowness delays every answer by d.
func (c *Cloudly) SetSlowness(d time.Duration) { c.slowness.Store(int64(d)) }

// SetCorestores sets the Corestore origins pushed in the relay configuration.
func (c *Cloudly) SetCorestores(cs []contracts.CorestoreOrigin) {
	c.mu.Lock()
	c.corestores = cs
	c.mu.Unlock()
}

// Sequences returns the registrationSequence of the relay registrations seen, in order: the
// newest 64.
func (c *Cloudly) Sequences() []int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.sequences.all()
}

// Registrations is the number of accepted relay registrations.
func (c *Cloudly) Registrations() int64 { return c.registrations.Load() }

// Received returns how many requests of method Cloudly received from the relay.
func (c *Cloudly) Received(method string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.received[method]
}

// NodeRegistrations returns how many registrations of node Cloudly accepted.
func (c *Cloudly) NodeRegistrations(node string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.nodes[node]
}

// WaitAttached waits until the relay's current socket holds an accepted registration, or until
// ctx ends.
func (c *Cloudly) WaitAttached(ctx context.Context) error {
	c.mu.Lock()
	sig := c.attachedSig
	attached := c.conn != nil && c.conn == c.attachedTo
	c.mu.Unlock()
	if attached {
		return nil
	}
	select {
	case <-sig:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("relay did not attach: %w", ctx.Err())
	}
}

// VPNHub is the hub the relay's newest accepted registerClusterVpnHub named: where nodes dial it
// and its Noise key. ok is false before the first.
func (c *Cloudly) VPNHub() (hub contracts.ClusterVpnHubReport, ok bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.hub == nil {
		return contracts.ClusterVpnHubReport{}, false
	}
	return *c.hub, true
}

// WaitVPNHub waits until the relay has reported its hub (now or before), or until ctx ends.
func (c *Cloudly) WaitVPNHub(ctx context.Context) (contracts.ClusterVpnHubReport, error) {
	c.mu.Lock()
	sig, hub := c.hubSig, c.hub
	c.mu.Unlock()
	if hub != nil {
		return *hub, nil
	}
	select {
	case <-sig:
		h, _ := c.VPNHub()
		return h, nil
	case <-ctx.Done():
		return contracts.ClusterVpnHubReport{}, fmt.Errorf("relay did not report its VPN hub: %w", ctx.Err())
	}
}

// Attached reports whether the relay's current socket holds an accepted registration.
func (c *Cloudly) Attached() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.conn != nil && c.conn == c.attachedTo
}

// ErrNoRelaySocket: Cloudly has no socket to the relay (it dropped it, or the relay has not dialed
// yet); the call was not sent.
var ErrNoRelaySocket = errors.New("sim cloudly: no relay socket")

// Call calls the relay over its current socket, as Cloudly.
func (c *Cloudly) Call(ctx context.Context, method string, body json.RawMessage) (json.RawMessage, error) {
	c.mu.Lock()
	conn := c.conn
	c.mu.Unlock()
	if conn == nil {
		return nil, ErrNoRelaySocket
	}
	return conn.Call(ctx, method, body)
}

// CallAsync calls the relay without waiting.
// QueueLen is the number of frames waiting to be written to the relay (0 without a socket).
func (c *Cloudly) QueueLen() int {
	c.mu.Lock()
	conn := c.conn
	c.mu.Unlock()
	if conn == nil {
		return 0
	}
	return conn.QueueLen()
}

func (c *Cloudly) CallAsync(method string, body json.RawMessage, done func(typedsocket.Reply)) error {
	c.mu.Lock()
	conn := c.conn
	c.mu.Unlock()
	if conn == nil {
		return ErrNoRelaySocket
	}
	_, err := conn.CallAsync(method, body, done)
	return err
}

func (c *Cloudly) accept(w http.ResponseWriter, r *http.Request) {
	if c.unavailable.Load() {
		http.Error(w, "unavailable", http.StatusServiceUnavailable)
		return
	}
	ws, err := websocket.Accept(w, r, nil)
	if err != nil {
		return
	}
	conn := typedsocket.New(ws, typedsocket.Options{
		Handler:   typedsocket.HandlerFunc(c.serve),
		Streams:   typedsocket.StreamHandlerFunc(c.serveStream),
		ReadLimit: 64 << 20, MaxQueue: 1 << 16, MaxQueueBytes: 256 << 20, MaxInflight: 1 << 16, Logger: c.log,
		DeadTimeout: time.Duration(c.deadTimeout.Load()),
	})
	c.mu.Lock()
	c.conn = conn
	c.mu.Unlock()
	conn.Run(context.Background())
	c.mu.Lock()
	current := c.conn == conn
	if current {
		c.conn = nil
	}
	delete(c.authed, conn)
	delete(c.attachedAll, conn)
	c.forgetLocked(conn)
	c.mu.Unlock()
	if current {
		c.streams.abandon() // what was streaming to Cloudly came over this socket
	}
}

// PushImage streams data to node in a pushImageVersion request's imageStream, through the relay,
// and checks the node received exactly those bytes.
func (c *Cloudly) PushImage(ctx context.Context, node string, data []byte, chunkSize int) error {
	c.mu.Lock()
	conn := c.conn
	c.mu.Unlock()
	return c.streams.pushImage(ctx, conn, c.Session(node), data, chunkSize)
}

// StreamBytesKept is the memory Cloudly holds of streams' bytes: streams being read and streams
// read whole that nobody asked for yet.
func (c *Cloudly) StreamBytesKept() int64 { return c.streams.kept.Load() }

// TapStreams hands f every stream frame Cloudly receives, as it arrived (nil: stop). Tests use it
// to see what the relay forwarded; f runs on the read loop and must not block.
func (c *Cloudly) TapStreams(f func(frame []byte)) {
	c.streams.mu.Lock()
	c.streams.tap = f
	c.streams.mu.Unlock()
}

// SendStreamFrame sends frame, as given, on the relay's socket.
func (c *Cloudly) SendStreamFrame(frame []byte) error {
	c.mu.Lock()
	conn := c.conn
	c.mu.Unlock()
	if conn == nil {
		return typedsocket.ErrClosed
	}
	return conn.SendFrame(frame)
}

// SetStreamPace makes Cloudly wait d between two chunks it streams: a slow writer.
func (c *Cloudly) SetStreamPace(d time.Duration) { c.streams.pace.Store(int64(d)) }

// StreamsReceived is the number of streams Cloudly received whole.
func (c *Cloudly) StreamsReceived() int64 { return c.streams.completed.Load() }

// Session is the session binding Cloudly issued node's newest accepted registration, or nil:
// what Cloudly → node requests carry.
func (c *Cloudly) Session(node string) json.RawMessage {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.sessions[node]
}

// Violations lists what the relay sent out of Cloudly's order: a request before its client
// session, a forwarded request before its registration, a registrationSequence that did not
// advance. It keeps the first 64.
func (c *Cloudly) Violations() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]string(nil), c.violations...)
}

func (c *Cloudly) violation(err *typedsocket.Error) error {
	c.mu.Lock()
	c.violations = firstFew(c.violations, err.Text)
	c.mu.Unlock()
	return err
}

// CallAfterAccepting has Cloudly send method with body on the relay's socket right after every
// registration it accepts (after the configuration push), before the relay can have recorded its
// attachment; done gets each answer.
func (c *Cloudly) CallAfterAccepting(method string, body json.RawMessage, done func(typedsocket.Reply)) {
	c.mu.Lock()
	c.afterAccept = append(c.afterAccept, afterCall{method, body, done})
	c.mu.Unlock()
}

// DisableRelay plays an operator disabling the relay: every configuration push carries
// relay: null, and node registrations are refused relay-cluster-not-enabled.
func (c *Cloudly) DisableRelay() { c.disabled.Store(true) }

// ConfigPushes is the number of pushClusterRelayConfig the relay answered without error.
func (c *Cloudly) ConfigPushes() int64 { return c.configPushes.Load() }

// AcceptNodesDirectly lets nodes talk to this Cloudly with no relay between them, the baseline of
// the benchmarks: a socket that opened no client session is served as a node's own. A relay's
// socket is judged as before.
func (c *Cloudly) AcceptNodesDirectly() { c.direct.Store(true) }

// gate is Cloudly's order on one socket: the client session first, then the relay's
// registration, and only then anything the relay forwards or asks for itself.
func (c *Cloudly) gate(conn *typedsocket.Conn, method string) error {
	c.mu.Lock()
	authed, attached := c.authed[conn], c.attachedTo == conn
	c.mu.Unlock()
	switch {
	case method == contracts.MethodRegisterCloudlyClientSession:
		return nil
	case !authed && c.direct.Load():
		return nil // a node's own socket, no relay between (AcceptNodesDirectly)
	case !authed:
		return c.violation(&typedsocket.Error{Text: "unauthenticated: " + method + " before registerCloudlyClientSession on this socket", Data: json.RawMessage("null")})
	case method == contracts.MethodRegisterClusterRelay:
		return nil
	case !attached:
		return c.violation(&typedsocket.Error{Text: "relay-not-connected: " + method + " on a socket whose relay registration Cloudly did not accept", Data: json.RawMessage("null")})
	}
	return nil
}

func (c *Cloudly) serve(conn *typedsocket.Conn, req *typedsocket.Request) {
	answer := func(body json.RawMessage, err error) {
		if d := time.Duration(c.slowness.Load()); d > 0 {
			time.AfterFunc(d, func() { req.Answer(typedsocket.Reply{Response: body, Err: err}) })
			return
		}
		req.Answer(typedsocket.Reply{Response: body, Err: err})
	}
	c.mu.Lock()
	c.actedLocked(conn, req.Method)
	c.received[req.Method]++
	if req.Method != contracts.MethodRegisterCloudlyClientSession { // never keep the machine JWT
		c.last[req.Method] = append([]byte(nil), req.Body...)
	}
	c.lastNode[req.Method] = append(c.lastNode[req.Method][:0], req.RelayNodeRaw...) // its buffer reused
	h := c.handlers[req.Method]
	ah := c.async[req.Method]
	c.mu.Unlock()
	if err := c.gate(conn, req.Method); err != nil {
		answer(nil, err)
		return
	}
	err := c.judgeRelayNode(req)
	req.RelayNodeRaw = nil // a sub-slice of the frame: never held while the request waits
	if err != nil {
		answer(nil, err)
		return
	}
	if ah != nil {
		body := req.Body
		req.Body = nil
		ah(body, answer)
		return
	}
	if h != nil {
		answer(h(req.Body))
		return
	}
	switch req.Method {
	case contracts.MethodRegisterCloudlyClientSession:
		body, err := c.clientSession(req.Body)
		if err == nil {
			c.mu.Lock()
			c.authed[conn] = true
			c.mu.Unlock()
		}
		answer(body, err)
	case contracts.MethodRegisterClusterRelay:
		body, err := c.registerRelay(conn, req.Body)
		cfg := c.configPush() // built first: the push leaves right behind the answer, as Cloudly's does
		answer(body, err)
		if err == nil {
			c.attach(conn, cfg)
		}
	case contracts.MethodRegisterClusterVpnHub:
		answer(c.registerHub(req.Body))
	case contracts.MethodRegisterPalletRuntimeSession:
		answer(c.registerNode(req.Body))
	case MethodPushImageVersion:
		if _, err := c.fromNode(req.Method, req.Body); err != nil {
			answer(nil, err)
			return
		}
		c.streams.receiveImage(req.Body, answer)
	case contracts.MethodGetClusterRouteTable:
		answer(json.RawMessage(`{"table":null}`), nil) // none computed yet, until ServeIngress says otherwise
	case contracts.MethodGetClusterPlatformDesiredState, contracts.MethodBeginSecretRecipientEnrollment,
		contracts.MethodCompleteSecretRecipientEnrollment, contracts.MethodBackupServiceDatabaseClosure,
		contracts.MethodRestoreServiceDatabaseClosure:
		c.platform.serve(conn, req.Method, req.Body, answer)
	default:
		answer(c.fromNode(req.Method, req.Body))
	}
}

// fromNode answers a forwarded node → Cloudly request as a Cloudly built from the seeds judges
// the session: the requests that must carry one (contracts.RequiresSession: "Every request carries
// `session`", "carries the exact current session") are refused without it, and a session, wherever
// one is carried, must name a node Cloudly issued a session to (the sim does not compare the whole
// binding: tests send placeholder sessions). Every other request is the connection's
// ("Current-peer"), and the relay's relayNodeId names it (judgeRelayNode).
func (c *Cloudly) fromNode(method string, body json.RawMessage) (json.RawMessage, error) {
	id, ok, err := contracts.ReadSessionNodeID(body)
	if err != nil {
		return nil, &typedsocket.Error{Text: "request-invalid: the request's session is unreadable", Data: json.RawMessage("null")}
	}
	if !ok && contracts.RequiresSession(method) {
		err := &typedsocket.Error{Text: "session-mismatch: " + method + " carries no session", Data: json.RawMessage("null")}
		if !c.direct.Load() {
			return nil, c.violation(&typedsocket.Error{Text: "the relay forwarded " + method + " without the session it requires", Data: json.RawMessage("null")})
		}
		return nil, err
	}
	if ok {
		c.mu.Lock()
		_, known := c.sessions[id]
		c.mu.Unlock()
		if !known {
			return nil, &typedsocket.Error{Text: "session-mismatch: no session was issued to node " + id, Data: json.RawMessage("null")}
		}
	}
	return json.RawMessage(`{"accepted":true}`), nil
}

// refuseOffer judges a peer's offer the way every Cloudly carrier does: read as data, negotiate.
func (c *Cloudly) refuseOffer(body json.RawMessage) error {
	offer, err := contracts.ReadProtocolOffer(body)
	if err != nil {
		return contracts.RelayRequestInvalid.Refuse("%v", err)
	}
	if r, _ := contracts.NegotiateProtocol(c.Offer, offer); r != nil {
		return r
	}
	return nil
}

func (c *Cloudly) clientSession(body json.RawMessage) (json.RawMessage, error) {
	if err := c.refuseOffer(body); err != nil {
		return nil, err
	}
	var protocol, jwtRaw []byte
	if strictjson.ReadExact(body, strictjson.Req("protocol", &protocol), strictjson.Req("jwt", &jwtRaw)) != nil {
		return nil, contracts.RelayRequestInvalid.Refuse("registerCloudlyClientSession must use its exact schema { protocol, jwt }")
	}
	if jwt, err := strictjson.ReadString(jwtRaw); err != nil || jwt != c.Token {
		return nil, &typedsocket.Error{Text: "unauthenticated: the machine JWT is not valid", Data: json.RawMessage("null")}
	}
	return json.Marshal(contracts.CloudlyClientSessionResponse{Protocol: c.Offer})
}

func (c *Cloudly) registerRelay(conn *typedsocket.Conn, body json.RawMessage) (json.RawMessage, error) {
	if err := c.refuseOffer(body); err != nil {
		return nil, err // a refused offer consumes no sequence
	}
	// Exact-key at every level, as the seed's validator: a member the seed does not spell (the
	// project's old relay.vpnHub guess, say) gets the registration refused, as a real Cloudly
	// would, and is recorded as a violation so that the test that caused it fails.
	if reasons := contracts.ValidateRegisterClusterRelayRequest(body, ""); len(reasons) > 0 {
		return nil, c.violation(&typedsocket.Error{Text: "relay-request-invalid: " + reasons[0], Data: json.RawMessage(`{"code":"relay-request-invalid"}`)})
	}
	var reg contracts.RegisterClusterRelayRequest
	_ = json.Unmarshal(body, &reg)
	c.mu.Lock()
	c.sequences.add(reg.RegistrationSequence)
	// registrationSequence counts up once per registration within one relay process and restarts
	// at 0 with a new process: anything else that does not exceed the last accepted one is
	// relay-sequence-not-advancing.
	if reg.RegistrationSequence != 0 && reg.RegistrationSequence <= c.lastSeq {
		last := c.lastSeq
		c.mu.Unlock()
		return nil, c.violation(&typedsocket.Error{Text: fmt.Sprintf("%s: registrationSequence %d does not exceed the last accepted %d",
			contracts.RelaySequenceNotAdvancing, reg.RegistrationSequence, last), Data: json.RawMessage("null")})
	}
	refusal := c.refuseAll
	c.mu.Unlock()
	if refusal != nil {
		return nil, refusal
	}
	c.mu.Lock()
	// Accepted: the socket is the relay's before the answer leaves, so whatever the relay sends
	// once it reads the answer is judged as coming from the registered relay.
	c.lastSeq, c.attachedTo = reg.RegistrationSequence, conn
	c.judgeOneAttachedLocked(conn)
	c.acceptedLocked(conn, reg.Relay.NodeID)
	c.mu.Unlock()
	return json.Marshal(contracts.RegisterClusterRelayResponse{Protocol: c.Offer, Origin: c.Origin})
}

// judgeOneAttachedLocked records, as a violation, a registration accepted on conn while another
// socket whose registration was accepted is still open: two relays attached to one cluster at
// once (docs/ha.md: the invariant every HA test checks here). A socket counts as closed from the
// moment it ends on this side (its context is cancelled), before its goroutines have unwound.
// The registration is still accepted, as Cloudly takes the newest connection.
func (c *Cloudly) judgeOneAttachedLocked(conn *typedsocket.Conn) {
	for other := range c.attachedAll {
		if other == conn {
			continue
		}
		if other.Context().Err() != nil {
			delete(c.attachedAll, other)
			continue
		}
		if c.overlapStoppedLocked(other) {
			continue // judged by what it sends once resumed (cloudlyha.go)
		}
		c.twoAttached.Add(1)
		c.violations = firstFew(c.violations, "two relays attached at once: a registration was accepted while another accepted socket is still open")
	}
	c.attachedAll[conn] = true
}

// TwoAttached is how many registrations Cloudly accepted while another socket holding an
// accepted registration was still open (also listed in Violations); the goal is 0.
func (c *Cloudly) TwoAttached() int64 { return c.twoAttached.Load() }

// AttachedSockets is the number of open sockets holding an accepted registration now: 0 or 1
// unless two relays are attached at once. A relay the test has stopped (SetRelayStopped) is not
// counted while it is stopped.
func (c *Cloudly) AttachedSockets() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for conn := range c.attachedAll {
		if conn.Context().Err() == nil && !c.stoppedLocked(conn) {
			n++
		}
	}
	return n
}

// registerHub serves registerClusterVpnHub (project-defined, docs/protocol.md#attaching): the hub of the
// cluster this Cloudly serves, read exactly; the newest replaces the one before. It answers {}.
// The gate has already checked it comes from the attached relay.
func (c *Cloudly) registerHub(body json.RawMessage) (json.RawMessage, error) {
	r, err := contracts.ReadRegisterClusterVpnHubRequest(body)
	if err != nil {
		return nil, c.violation(&typedsocket.Error{Text: "relay-request-invalid: " + err.Error(), Data: json.RawMessage(`{"code":"relay-request-invalid"}`)})
	}
	if r.Hub.ClusterID != c.ClusterID {
		return nil, c.violation(&typedsocket.Error{Text: fmt.Sprintf("relay-request-invalid: the hub names cluster %s; the relay's machine identity is of %s",
			r.Hub.ClusterID, c.ClusterID), Data: json.RawMessage(`{"code":"relay-request-invalid"}`)})
	}
	c.mu.Lock()
	c.hub = &r
	close(c.hubSig)
	c.hubSig = make(chan struct{})
	c.mu.Unlock()
	return json.RawMessage(`{}`), nil
}

// configPush is the pushClusterRelayConfig body Cloudly sends after accepting a registration.
func (c *Cloudly) configPush() json.RawMessage {
	c.mu.Lock()
	cs := c.corestores
	c.mu.Unlock()
	if cs == nil {
		cs = []contracts.CorestoreOrigin{}
	}
	relay := &contracts.ClusterRelay{Origin: c.Origin}
	if c.disabled.Load() {
		relay = nil
	}
	cfg, _ := json.Marshal(map[string]any{"config": contracts.ClusterRelayConfig{ClusterID: c.ClusterID, Relay: relay, Corestores: cs}})
	return cfg
}

func (c *Cloudly) attach(conn *typedsocket.Conn, cfg json.RawMessage) {
	c.mu.Lock()
	close(c.attachedSig)
	c.attachedSig = make(chan struct{})
	after := append([]afterCall(nil), c.afterAccept...)
	c.mu.Unlock()
	c.registrations.Add(1)
	conn.CallAsync(contracts.MethodPushClusterRelayConfig, cfg, func(rep typedsocket.Reply) {
		if rep.Err == nil {
			c.configPushes.Add(1)
		}
	})
	for _, a := range after {
		conn.CallAsync(a.method, a.body, a.done)
	}
}

// registerNode plays Cloudly's node registration: the offer first, then the bearer, then a
// session binding. The simulator's credential for node X is the bearer "bearer-X".
func (c *Cloudly) registerNode(body json.RawMessage) (json.RawMessage, error) {
	if err := c.refuseOffer(body); err != nil {
		return nil, err
	}
	if c.disabled.Load() {
		return nil, contracts.RelayClusterNotEnabled.Refuse("the relay of cluster %s is disabled", c.ClusterID)
	}
	var reg struct {
		Bearer               string   `json:"bearer"`
		NodeID               string   `json:"nodeId"`
		CredentialGeneration int      `json:"credentialGeneration"`
		NodeInstanceNonce    string   `json:"nodeInstanceNonce"`
		ResolvedAuthorities  []string `json:"resolvedAuthorities"`
	}
	var protocol, bearer, generation, nonce, nodeID, authorities []byte
	if strictjson.ReadExact(body, strictjson.Req("protocol", &protocol), strictjson.Req("bearer", &bearer),
		strictjson.Req("credentialGeneration", &generation), strictjson.Req("nodeInstanceNonce", &nonce),
		strictjson.Req("nodeId", &nodeID), strictjson.Req("resolvedAuthorities", &authorities)) != nil ||
		json.Unmarshal(body, &reg) != nil || !contracts.IsClusterNodeID(reg.NodeID) || !contracts.IsCanonicalUUID(reg.NodeInstanceNonce) ||
		!canonicalAuthorities(reg.ResolvedAuthorities) {
		return nil, &typedsocket.Error{Text: "registration-invalid: the registration body is not valid", Data: json.RawMessage("null")}
	}
	if reg.Bearer != "bearer-"+reg.NodeID {
		return nil, &typedsocket.Error{Text: "bearer-refused: the bearer is not the node's current credential", Data: json.RawMessage("null")}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.nodes[reg.NodeID]++
	session, _ := json.Marshal(map[string]any{
		"controller":       map[string]any{"kind": "cloudly", "id": "cloudly-sim"},
		"clusterId":        c.ClusterID,
		"nodeId":           reg.NodeID,
		"runtimeNamespace": "rt-" + c.ClusterID,
		"generation":       reg.CredentialGeneration,
		"epoch":            c.nodes[reg.NodeID],
	})
	c.sessions[reg.NodeID] = session
	return json.Marshal(map[string]any{"session": json.RawMessage(session), "protocol": c.Offer})
}

// canonicalAuthorities: resolvedAuthorities is a strictly increasing (sorted, duplicate-free)
// subset of network, secrets, storage.
func canonicalAuthorities(a []string) bool {
	if a == nil {
		return false
	}
	allowed := map[string]bool{"network": true, "secrets": true, "storage": true}
	for i, v := range a {
		if !allowed[v] || i > 0 && a[i-1] >= v {
			return false
		}
	}
	return true
}
