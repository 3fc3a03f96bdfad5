package sim

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coder/websocket"
	"github.com/rs/zerolog"

	"code.foss.global/serve.zone/relay/contracts"
	"code.foss.global/serve.zone/relay/contracts/strictjson"
	"code.foss.global/serve.zone/relay/internal/typedsocket"
)

// Node is a Pallet node stand-in: it dials the relay, registers its runtime session, answers
// Cloudly's pushes, reports to Cloudly, and registers again when the relay says it re-attached.
type Node struct {
	ID         string
	Bearer     string                  // default "bearer-<ID>", the credential the sim Cloudly accepts
	Offer      contracts.ProtocolOffer // default: the relay's offer
	Nonce      string                  // nodeInstanceNonce, one per process start
	Generation int                     // credential generation

	// AutoReregister registers again when the relay pushes pushRelayUpstreamChanged.
	AutoReregister bool
	// RenewalPreimage is the digest rule the node verifies a DNS lease renewal under, its
	// Cloudly's (EscrowRun.Preimage); nil: the relay's assumed rule. Set before renewals arrive.
	RenewalPreimage func(canonical []byte) []byte

	log zerolog.Logger

	mu       sync.Mutex
	conn     *typedsocket.Conn     // guarded by mu
	session  json.RawMessage       // guarded by mu: the newest accepted session binding
	handlers map[string]MethodFunc // guarded by mu
	received map[string]int        // guarded by mu: requests per method from the relay
	last     map[string][]byte     // guarded by mu: the newest body per method
	renewal  *admittedRenewal      // guarded by mu: the newest admitted DNS lease renewal
	// violations: the first few pushes from the relay no relay may send; guarded by mu
	violations []string

	streams *streams // set at construction: the node's VirtualStreams

	registrations atomic.Int64 // accepted registrations
	detached      atomic.Bool  // the relay said it is detaching: send nothing but registrations
	Now           func() int64 // Unix ms; default the wall clock
}

// NewNode returns a node stand-in with a fresh instance nonce.
func NewNode(id string, log zerolog.Logger) *Node {
	return &Node{
		ID: id, Bearer: "bearer-" + id, Offer: contracts.RelayOffer, Nonce: newUUID(), Generation: 1,
		AutoReregister: true, log: log.With().Str("component", "sim-node").Str("node", id).Logger(),
		handlers: make(map[string]MethodFunc), received: make(map[string]int), last: make(map[string][]byte),
		Now: nowMillis, streams: newStreams(),
	}
}

// Connect dials the relay's downstream WebSocket. A new connection starts attached: what an
// earlier connection was told (pushRelayUpstreamChanged { attached: false }) was that relay's
// state, not this one's (after a failover the node reaches another relay).
func (n *Node) Connect(ctx context.Context, url string) error {
	conn, err := dialRelay(ctx, url, n.serve, n.streams.serve, n.log)
	if err != nil {
		return fmt.Errorf("node %s dial relay: %w", n.ID, err)
	}
	n.mu.Lock()
	n.conn = conn
	n.mu.Unlock()
	n.detached.Store(false)
	return nil
}

// dialRelay opens a downstream connection to the relay, served by serve, as a peer of the
// simulator: its read limit is generous (the relay's limit is what is under test).
func dialRelay(ctx context.Context, url string, serve typedsocket.HandlerFunc, streams typedsocket.StreamHandlerFunc, log zerolog.Logger) (*typedsocket.Conn, error) {
	ws, _, err := websocket.Dial(ctx, url, nil)
	if err != nil {
		return nil, err
	}
	opts := typedsocket.Options{Handler: serve, ReadLimit: 64 << 20, Logger: log}
	if streams != nil {
		opts.Streams = streams
	}
	conn := typedsocket.New(ws, opts)
	go conn.Run(context.Background())
	return conn, nil
}

// Conn is the node's current connection.
func (n *Node) Conn() *typedsocket.Conn {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.conn
}

// Close closes the node's connection.
func (n *Node) Close() {
	if c := n.Conn(); c != nil {
		c.CloseNow()
		<-c.Done()
	}
}

// RegistrationBody is the node's registerPalletRuntimeSession request.
func (n *Node) RegistrationBody() json.RawMessage {
	b, _ := json.Marshal(map[string]any{
		"protocol":             n.Offer,
		"bearer":               n.Bearer,
		"credentialGeneration": n.Generation,
		"nodeInstanceNonce":    n.Nonce,
		"nodeId":               n.ID,
		"resolvedAuthorities":  []string{"network", "secrets", "storage"},
	})
	return b
}

// Register sends registerPalletRuntimeSession and keeps the session binding it is answered with.
func (n *Node) Register(ctx context.Context) (json.RawMessage, error) {
	c := n.Conn()
	if c == nil {
		return nil, errors.New("node not connected")
	}
	resp, err := c.Call(ctx, contracts.MethodRegisterPalletRuntimeSession, n.RegistrationBody())
	if err != nil {
		return nil, err
	}
	session, err := n.bindRegistration(resp)
	if err != nil {
		return nil, err
	}
	n.mu.Lock()
	n.session = session
	n.mu.Unlock()
	n.registrations.Add(1)
	return resp, nil
}

// bindRegistration checks the registration answer as Pallet does before it trusts the binding:
// exactly { session, protocol }, an offer it can serve, and a session for this node — an answer
// carried back to the wrong node, or reshaped on the way, is not this node's session.
func (n *Node) bindRegistration(resp json.RawMessage) (json.RawMessage, error) {
	var session, protocol []byte
	if strictjson.ReadExact(resp, strictjson.Req("session", &session), strictjson.Req("protocol", &protocol)) != nil {
		return nil, fmt.Errorf("node %s: registration answer must be exactly { session, protocol }", n.ID)
	}
	offer, err := contracts.ReadProtocolOffer(resp)
	if err != nil {
		return nil, fmt.Errorf("node %s: registration answer offer: %w", n.ID, err)
	}
	if r, _ := contracts.NegotiateProtocol(n.Offer, offer); r != nil {
		return nil, fmt.Errorf("node %s: %s", n.ID, contracts.DescribeProtocolRefusal(*r))
	}
	s, err := contracts.ReadRuntimeSession(session)
	if err != nil {
		return nil, fmt.Errorf("node %s: registration answer session: %w", n.ID, err)
	}
	if s.NodeID != n.ID {
		return nil, fmt.Errorf("node %s: registration answer binds node %s", n.ID, s.NodeID)
	}
	return session, nil
}

// checkSession is the node's routing rule for every Cloudly → node request: the node it names
// (request.session.nodeId, else request.nodeId) is this node. A request the relay carried to the
// wrong node is refused, never answered as if it were this node's.
func (n *Node) checkSession(body json.RawMessage) error {
	id, ok, err := contracts.ReadRouteNodeID(body)
	if err != nil || !ok || id != n.ID {
		return &typedsocket.Error{Text: "session-mismatch: the request names node " + id + ", not " + n.ID, Data: json.RawMessage("null")}
	}
	return nil
}

// Registrations is the number of accepted registrations.
func (n *Node) Registrations() int64 { return n.registrations.Load() }

// Session is the newest session binding.
func (n *Node) Session() json.RawMessage {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.session
}

// ErrRelayDetaching is a request the node did not send: the relay said it is detaching, as a
// Pallet node honours pushRelayUpstreamChanged { attached: false }.
var ErrRelayDetaching = errors.New("sim node: the relay is detaching; request not sent")

// Call sends a request through the relay.
func (n *Node) Call(ctx context.Context, method string, body json.RawMessage) (json.RawMessage, error) {
	c := n.Conn()
	if c == nil {
		return nil, errors.New("node not connected")
	}
	if n.detached.Load() && method != contracts.MethodRegisterPalletRuntimeSession {
		return nil, ErrRelayDetaching
	}
	return c.Call(ctx, method, body)
}

// Report sends a node → Cloudly request carrying the node's own session.
func (n *Node) Report(ctx context.Context, method string, fields map[string]any) (json.RawMessage, error) {
	body := map[string]any{"session": n.Session()}
	for k, v := range fields {
		body[k] = v
	}
	b, _ := json.Marshal(body)
	return n.Call(ctx, method, b)
}

// PushImage streams data to Cloudly in a pushImageVersion request's imageStream, chunkSize bytes
// a chunk, and checks that Cloudly received exactly those bytes.
func (n *Node) PushImage(ctx context.Context, data []byte, chunkSize int) error {
	if n.detached.Load() {
		return ErrRelayDetaching
	}
	return n.streams.pushImage(ctx, n.Conn(), n.Session(), data, chunkSize)
}

// SetStreamPace makes the node wait d between two chunks it streams: a slow writer.
func (n *Node) SetStreamPace(d time.Duration) { n.streams.pace.Store(int64(d)) }

// SetStreamIdle makes the node give up a stream it reads once its writer has sent nothing for d
// (default a minute): a writer that gives its streams less time than that, as the scenario's do,
// has given up by then.
func (n *Node) SetStreamIdle(d time.Duration) { n.streams.idle.Store(int64(d)) }

// StreamsReceived is the number of streams the node received whole.
func (n *Node) StreamsReceived() int64 { return n.streams.completed.Load() }

// StreamBytesKept is the memory the node holds of streams' bytes: streams being read (one cut by
// an outage is read until its writer has been silent for streamLinger) and streams read whole
// that nobody asked for yet.
func (n *Node) StreamBytesKept() int64 { return n.streams.kept.Load() }

// Handle answers method with f.
func (n *Node) Handle(method string, f MethodFunc) {
	n.mu.Lock()
	n.handlers[method] = f
	n.mu.Unlock()
}

// Received is how many requests of method reached the node.
func (n *Node) Received(method string) int {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.received[method]
}

// Last is the newest body of method that reached the node.
func (n *Node) Last(method string) []byte {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.last[method]
}

func (n *Node) serve(_ *typedsocket.Conn, req *typedsocket.Request) {
	n.mu.Lock()
	n.received[req.Method]++
	n.last[req.Method] = append([]byte(nil), req.Body...)
	h := n.handlers[req.Method]
	n.mu.Unlock()
	if h != nil {
		body, err := h(req.Body)
		req.Answer(typedsocket.Reply{Response: body, Err: err})
		return
	}
	switch req.Method {
	case contracts.MethodPushRelayUpstreamChanged:
		var attached []byte
		v, isBool := false, false
		if strictjson.ReadExact(req.Body, strictjson.Req("attached", &attached)) == nil {
			v, isBool = strictjson.ReadBool(attached)
		}
		if !isBool {
			n.mu.Lock()
			n.violations = firstFew(n.violations, "pushRelayUpstreamChanged is not exactly { attached: boolean }: "+string(req.Body))
			n.mu.Unlock()
			req.Fail(contracts.RelayRequestInvalid.Refuse("pushRelayUpstreamChanged must be exactly { attached: boolean }"))
			return
		}
		if !v {
			n.detached.Store(true) // before the answer: nothing is sent after it
			n.streams.abandon()    // Cloudly's socket is gone, and with it every stream from Cloudly
			req.Respond(json.RawMessage(`{}`))
			return
		}
		n.detached.Store(false)
		req.Respond(json.RawMessage(`{}`))
		if n.AutoReregister {
			go func() {
				ctx, cancel := context.WithTimeout(context.Background(), typedsocket.DefaultCallTimeout)
				defer cancel()
				if _, err := n.Register(ctx); err != nil {
					n.log.Debug().Err(err).Msg("re-registration failed")
				}
			}()
		}
	case MethodPushImageVersion:
		if err := n.checkSession(req.Body); err != nil {
			req.Fail(err)
			return
		}
		n.streams.receiveImage(req.Body, func(b json.RawMessage, err error) { req.Answer(typedsocket.Reply{Response: b, Err: err}) })
	case contracts.MethodApplyRuntimeNetworkDnsLeaseRenewal:
		body, err := n.admitRenewal(req.Body)
		req.Answer(typedsocket.Reply{Response: body, Err: err})
	default:
		if err := n.checkSession(req.Body); err != nil {
			req.Fail(err)
			return
		}
		req.Respond(json.RawMessage(`{"status":"accepted"}`))
	}
}

// Violations lists what the relay sent the node that no relay may send (malformed pushes): the
// first 64.
func (n *Node) Violations() []string {
	n.mu.Lock()
	defer n.mu.Unlock()
	return append([]string(nil), n.violations...)
}

var nopLog = zerolog.Nop()

func newUUID() string {
	var b [16]byte
	rand.Read(b[:])
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}
