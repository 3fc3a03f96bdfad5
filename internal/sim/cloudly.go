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
	"code.foss.global/serve.zone/relay/internal/typedsocket"
)

// Cloudly is a control-plane stand-in: a WebSocket server that accepts the relay's socket and
// plays Cloudly's side of the protocol — the client session, the relay registration with its
// sequence, node registrations, the configuration push — and can call the relay like Cloudly.
type Cloudly struct {
	ClusterID string                  // the cluster it serves (default "cluster-sim")
	Token     string                  // the machine JWT it accepts (default "sim-machine-jwt")
	Offer     contracts.ProtocolOffer // the offer it answers with (default: the relay's own)
	Origin    string                  // the relay origin it answers with

	log zerolog.Logger
	srv *http.Server
	ln  net.Listener

	mu          sync.Mutex
	conn        *typedsocket.Conn     // guarded by mu: the relay's newest socket
	attachedTo  *typedsocket.Conn     // guarded by mu: the socket whose registration was accepted
	sequences   []int64               // guarded by mu: registrationSequence of every registration
	refusals    []error               // guarded by mu: answers for the next registrations
	refuseAll   error                 // guarded by mu: the answer to every registration while set
	last        map[string][]byte     // guarded by mu: the newest request body per method
	handlers    map[string]MethodFunc // guarded by mu
	received    map[string]int        // guarded by mu: requests per method from the relay
	nodes       map[string]int        // guarded by mu: accepted registrations per node
	corestores  []contracts.CorestoreOrigin
	attachedSig chan struct{} // guarded by mu: closed on the next accepted registration

	registrations atomic.Int64 // accepted relay registrations
	slowness      atomic.Int64 // nanoseconds added before every answer
	unavailable   atomic.Bool  // refuse the relay's sockets, as an unreachable Cloudly would
}

// MethodFunc serves one method Cloudly receives.
type MethodFunc func(body json.RawMessage) (json.RawMessage, error)

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
		handlers: make(map[string]MethodFunc), received: make(map[string]int), nodes: make(map[string]int),
		last:        make(map[string][]byte),
		attachedSig: make(chan struct{}),
	}
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

// RefuseNextRegistration makes the next registerClusterRelay fail with err.
func (c *Cloudly) RefuseNextRegistration(err error) {
	c.mu.Lock()
	c.refusals = append(c.refusals, err)
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

// SetAvailable(false) drops the relay's socket and refuses new ones until SetAvailable(true): a
// Cloudly outage as the relay sees it.
func (c *Cloudly) SetAvailable(ok bool) {
	c.unavailable.Store(!ok)
	if !ok {
		c.Drop()
	}
}

// SetSlowness delays every answer by d.
func (c *Cloudly) SetSlowness(d time.Duration) { c.slowness.Store(int64(d)) }

// SetCorestores sets the Corestore origins pushed in the relay configuration.
func (c *Cloudly) SetCorestores(cs []contracts.CorestoreOrigin) {
	c.mu.Lock()
	c.corestores = cs
	c.mu.Unlock()
}

// Sequences returns the registrationSequence of every relay registration seen, in order.
func (c *Cloudly) Sequences() []int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]int64(nil), c.sequences...)
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

// Attached reports whether the relay's current socket holds an accepted registration.
func (c *Cloudly) Attached() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.conn != nil && c.conn == c.attachedTo
}

// Call calls the relay over its current socket, as Cloudly.
func (c *Cloudly) Call(ctx context.Context, method string, body json.RawMessage) (json.RawMessage, error) {
	c.mu.Lock()
	conn := c.conn
	c.mu.Unlock()
	if conn == nil {
		return nil, errors.New("sim cloudly: no relay socket")
	}
	return conn.Call(ctx, method, body)
}

// CallAsync calls the relay without waiting.
func (c *Cloudly) CallAsync(method string, body json.RawMessage, done func(typedsocket.Reply)) error {
	c.mu.Lock()
	conn := c.conn
	c.mu.Unlock()
	if conn == nil {
		return errors.New("sim cloudly: no relay socket")
	}
	return conn.CallAsync(method, body, 0, done)
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
		ReadLimit: 64 << 20, MaxQueue: 1 << 16, MaxQueueBytes: 256 << 20, MaxInflight: 1 << 16, Logger: c.log,
	})
	c.mu.Lock()
	c.conn = conn
	c.mu.Unlock()
	conn.Run(context.Background())
	c.mu.Lock()
	if c.conn == conn {
		c.conn = nil
	}
	c.mu.Unlock()
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
	c.received[req.Method]++
	if req.Method != contracts.MethodRegisterCloudlyClientSession { // never keep the machine JWT
		c.last[req.Method] = append([]byte(nil), req.Body...)
	}
	h := c.handlers[req.Method]
	c.mu.Unlock()
	if h != nil {
		answer(h(req.Body))
		return
	}
	switch req.Method {
	case contracts.MethodRegisterCloudlyClientSession:
		answer(c.clientSession(req.Body))
	case contracts.MethodRegisterClusterRelay:
		body, err := c.registerRelay(req.Body)
		answer(body, err)
		if err == nil {
			c.attach(conn)
		}
	case contracts.MethodRegisterPalletRuntimeSession:
		answer(c.registerNode(req.Body))
	case contracts.MethodGetClusterRouteTable:
		answer(json.RawMessage(`{"table":null}`), nil) // none computed yet, until ServeIngress says otherwise
	default:
		answer(json.RawMessage(`{"accepted":true}`), nil)
	}
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
	raw, _, _ := contracts.Lookup(body, "jwt")
	if jwt, err := contracts.ReadString(raw); err != nil || jwt != c.Token {
		return nil, &typedsocket.Error{Text: "unauthenticated: the machine JWT is not valid", Data: json.RawMessage("null")}
	}
	return json.Marshal(contracts.CloudlyClientSessionResponse{Protocol: c.Offer})
}

func (c *Cloudly) registerRelay(body json.RawMessage) (json.RawMessage, error) {
	if err := c.refuseOffer(body); err != nil {
		return nil, err // a refused offer consumes no sequence
	}
	if reasons := contracts.ValidateRegisterClusterRelayRequest(body, ""); len(reasons) > 0 {
		return nil, contracts.RelayRequestInvalid.Refuse("%s", reasons[0])
	}
	var reg contracts.RegisterClusterRelayRequest
	_ = json.Unmarshal(body, &reg)
	c.mu.Lock()
	c.sequences = append(c.sequences, reg.RegistrationSequence)
	refusal := c.refuseAll
	if refusal == nil && len(c.refusals) > 0 {
		refusal, c.refusals = c.refusals[0], c.refusals[1:]
	}
	c.mu.Unlock()
	if refusal != nil {
		return nil, refusal
	}
	return json.Marshal(contracts.RegisterClusterRelayResponse{Protocol: c.Offer, Origin: c.Origin})
}

func (c *Cloudly) attach(conn *typedsocket.Conn) {
	c.mu.Lock()
	c.attachedTo = conn
	close(c.attachedSig)
	c.attachedSig = make(chan struct{})
	cs := c.corestores
	c.mu.Unlock()
	c.registrations.Add(1)
	if cs == nil {
		cs = []contracts.CorestoreOrigin{}
	}
	cfg, _ := json.Marshal(map[string]any{"config": contracts.ClusterRelayConfig{
		ClusterID: c.ClusterID, Relay: &contracts.ClusterRelay{Origin: c.Origin}, Corestores: cs,
	}})
	conn.CallAsync(contracts.MethodPushClusterRelayConfig, cfg, 0, func(typedsocket.Reply) {})
}

// registerNode plays Cloudly's node registration: the offer first, then the bearer, then a
// session binding. The simulator's credential for node X is the bearer "bearer-X".
func (c *Cloudly) registerNode(body json.RawMessage) (json.RawMessage, error) {
	if err := c.refuseOffer(body); err != nil {
		return nil, err
	}
	var reg struct {
		Bearer               string `json:"bearer"`
		NodeID               string `json:"nodeId"`
		CredentialGeneration int    `json:"credentialGeneration"`
		NodeInstanceNonce    string `json:"nodeInstanceNonce"`
	}
	if json.Unmarshal(body, &reg) != nil || !contracts.IsClusterNodeID(reg.NodeID) || !contracts.IsCanonicalUUID(reg.NodeInstanceNonce) {
		return nil, &typedsocket.Error{Text: "registration-invalid: the registration body is not valid", Data: json.RawMessage("null")}
	}
	if reg.Bearer != "bearer-"+reg.NodeID {
		return nil, &typedsocket.Error{Text: "bearer-refused: the bearer is not the node's current credential", Data: json.RawMessage("null")}
	}
	c.mu.Lock()
	c.nodes[reg.NodeID]++
	epoch := c.nodes[reg.NodeID]
	c.mu.Unlock()
	return json.Marshal(map[string]any{
		"session": map[string]any{
			"controller":       map[string]any{"kind": "cloudly", "id": "cloudly-sim"},
			"clusterId":        c.ClusterID,
			"nodeId":           reg.NodeID,
			"runtimeNamespace": "rt-" + c.ClusterID,
			"generation":       reg.CredentialGeneration,
			"epoch":            epoch,
		},
		"protocol": c.Offer,
	})
}
