package relay

import (
	"context"
	"crypto/x509"
	"encoding/json"
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coder/websocket"
	"github.com/rs/zerolog"

	"code.foss.global/serve.zone/relay/contracts"
	"code.foss.global/serve.zone/relay/feature"
	"code.foss.global/serve.zone/relay/internal/backoff"
	"code.foss.global/serve.zone/relay/internal/typedsocket"
	"code.foss.global/serve.zone/relay/status"
)

// Upstream socket limits. One socket carries the whole cluster, so its queue and inflight bounds
// are far larger than a node's; they still bound memory.
const (
	upstreamMaxQueue      = 1 << 16
	upstreamMaxQueueBytes = 256 << 20
	upstreamMaxInflight   = 1 << 16
	attachTimeout         = 30 * time.Second
	dialTimeout           = 15 * time.Second
)

// upstreamHooks are what the relay does with the Cloudly session, handed in at construction as
// the downstream's are (downstreamHooks): the narrow seam between one Cloudly session and
// everything else.
type upstreamHooks struct {
	// serve serves one of Cloudly's requests, on the socket's read loop.
	serve func(req *typedsocket.Request)
	// serveStream forwards one of Cloudly's stream frames; c is the socket it came on.
	serveStream func(c *typedsocket.Conn, f *typedsocket.StreamFrame)
	// registration is the registerClusterRelay body with registrationSequence seq.
	registration func(seq int64) json.RawMessage
	// accepted runs on the socket's read loop when Cloudly accepts its registration, before
	// Cloudly's next message is served.
	accepted func()
	// attached runs once the session is attached (after the hub report is sent), detached once
	// it is lost.
	attached func(up feature.Upstream)
	detached func()
	// undispatched: Cloudly refused the relay with one of the three undispatched refusals.
	undispatched func(name contracts.RefusalName)
	// dropped counts a frame dropped without an answer, by reason.
	dropped func(reason string)
}

// upstreamConfig is what one upstream is told.
type upstreamConfig struct {
	url       string         // --cloudly-url
	tokenFile string         // --cloudly-token-file: the machine JWT, re-read at every attach
	roots     *x509.CertPool // Cloudly's certificate roots; nil: the system's
	allowHTTP bool           // --insecure-plaintext: an http origin is canonical too
	readLimit int64          // --max-message-bytes
	timings   timings        // the socket's; zero means the docs/protocol.md#framing-typedrequest-over-websocket defaults
	// dial opens the TCP connection to Cloudly; nil: a net.Dialer. Tests dial an in-memory pipe.
	dial func(ctx context.Context, network, addr string) (net.Conn, error)
	// tenure is asked before anything is sent to Cloudly (lead.go); nil: always held.
	tenure feature.Tenure
	// hub reports the VPN hub after each accepted registration (hubreport.go); nil: no hub.
	hub *hubReporter
	// local is the streams parts hold on the socket (localstreams.go); nil: none can be opened.
	local *localStreams
	// now is the clock the session's history and state are read on; nil: time.Now.
	now func() time.Time
}

// upstream is one session with Cloudly (docs/protocol.md#upstream-session). Its session loop (run) owns dialling,
// registration and backoff; other goroutines only read the current socket.
type upstream struct {
	hooks  upstreamHooks    // set at construction
	cfg    upstreamConfig   // set at construction
	log    zerolog.Logger   // set at construction
	m      *upstreamMetrics // set at construction
	local  *localStreams    // set at construction: cfg.local (nil only in the seam's own tests)
	tenure feature.Tenure   // set at construction: cfg.tenure, or always
	hub    *hubReporter     // set at construction: cfg.hub, or one that reports nothing
	now    func() time.Time // set at construction: cfg.now, or time.Now

	sock atomic.Pointer[socket] // the socket in use, attached or not; nil between sockets
	// state is the session as the status page shows it; replaced whole on attach and detach.
	state atomic.Pointer[sessionState]
	hist  *status.SessionLog // set at construction: why detached, retries, outages
	// registrations counts registerClusterRelay bodies made: the next registrationSequence,
	// once per registration in the whole process (docs/protocol.md#upstream-session), whichever socket sends it.
	registrations atomic.Int64
	stopping      atomic.Bool // set by close: the session ends for shutdown or a step down
	runMu         sync.Mutex
	cancel        context.CancelFunc // guarded by runMu: ends run
	done          chan struct{}      // guarded by runMu: closed when run has returned; nil while not running
}

// sessionState is what the status page shows of the session: attached since when, with which
// registrationSequence and origin, or detached since when.
type sessionState struct {
	attached bool
	since    time.Time
	sequence int64
	origin   string
}

// socket is one dialled Cloudly socket, from dial to loss.
type socket struct {
	conn *typedsocket.Conn // set at construction
	raw  net.Conn          // set at construction: the TCP socket under conn, closed when a close overruns
	// origin is the cluster's relay origin Cloudly's acceptance named ("" when it named none);
	// written on conn's read loop before accepted is set, never after.
	origin   string
	accepted atomic.Bool // set on conn's read loop when Cloudly accepts this socket's registration
}

func newUpstream(cfg upstreamConfig, log zerolog.Logger, m *upstreamMetrics, hooks upstreamHooks) *upstream {
	u := &upstream{hooks: hooks, cfg: cfg, log: log.With().Str("component", "upstream").Logger(), m: m,
		hist: status.NewSessionLog(cfg.url), local: cfg.local, tenure: cfg.tenure, hub: cfg.hub, now: cfg.now}
	if u.now == nil {
		u.now = time.Now
	}
	if u.tenure == nil {
		u.tenure = always{}
	}
	if u.hub == nil {
		u.hub = &hubReporter{}
	}
	return u
}

// Attached reports whether the relay holds an accepted registration with Cloudly.
func (u *upstream) Attached() bool { return u.attached() != nil }

// attached is the current socket when Cloudly accepted its registration, else nil.
func (u *upstream) attached() *typedsocket.Conn {
	if s := u.sock.Load(); s != nil && s.accepted.Load() {
		return s.conn
	}
	return nil
}

// Call forwards a request to Cloudly (see Upstream): the relay's own, or the ingress's, which
// states no node.
func (u *upstream) Call(method string, body json.RawMessage, done func(json.RawMessage, error)) {
	u.callFor(nil, "", method, body, done)
}

// callFor is Call with the request charged to share (nil: not charged) until written: the share
// of the downstream peer it is sent for. node, when not "", is the node connection it is sent
// for, stated in the envelope's relayNodeId. It returns the call in flight (zero when done was
// called already).
func (u *upstream) callFor(share typedsocket.Share, node, method string, body json.RawMessage, done func(json.RawMessage, error)) typedsocket.Pending {
	conn := u.attached()
	if !u.tenure.Held() {
		done(nil, contracts.RelayUpstreamDetached.Refuse("this relay's tenure as the leader has ended"))
		return typedsocket.Pending{}
	}
	if conn == nil {
		done(nil, contracts.RelayUpstreamDetached.Refuse("the relay has no Cloudly session"))
		return typedsocket.Pending{}
	}
	k, err := conn.CallAsync(method, body, func(rep typedsocket.Reply) { done(rep.Response, upstreamError(rep.Err, method)) },
		typedsocket.Charge(share), typedsocket.ForNode(node))
	if err != nil {
		done(nil, upstreamError(err, method))
	}
	return k
}

// sendFrame forwards a downstream peer's stream frame to Cloudly whole, charged to share until
// written.
func (u *upstream) sendFrame(share typedsocket.Share, frame []byte) error {
	conn := u.attached()
	if !u.tenure.Held() {
		return contracts.RelayUpstreamDetached.Refuse("this relay's tenure as the leader has ended")
	}
	if conn == nil {
		return contracts.RelayUpstreamDetached.Refuse("the relay has no Cloudly session")
	}
	return upstreamError(conn.SendFrame(frame, typedsocket.Charge(share)), contracts.MethodVirtualStream)
}

// inflight is the number of Cloudly's requests on the current socket not answered yet.
func (u *upstream) inflight() int64 {
	if s := u.sock.Load(); s != nil {
		return s.conn.Inflight()
	}
	return 0
}

// queueLen is the number of frames waiting to be written to Cloudly.
func (u *upstream) queueLen() int {
	if s := u.sock.Load(); s != nil {
		return s.conn.QueueLen()
	}
	return 0
}

// pendingCalls is the number of calls to Cloudly awaiting its answer.
func (u *upstream) pendingCalls() int {
	if s := u.sock.Load(); s != nil {
		return s.conn.Pending()
	}
	return 0
}

// upstreamError names a local failure of a call to Cloudly; Cloudly's own errors pass untouched.
func upstreamError(err error, method string) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, typedsocket.ErrOverShare):
		return contracts.RelayNodeBusy.Refuse("this connection's share of the relay's memory is spent")
	case errors.Is(err, typedsocket.ErrQueueFull):
		return contracts.RelayUpstreamBusy.Refuse("the Cloudly socket's send queue is full")
	case errors.Is(err, typedsocket.ErrTimeout):
		return contracts.RelayCallTimeout.Refuse("Cloudly did not answer %s in time", method)
	case errors.Is(err, typedsocket.ErrMalformedAnswer):
		return contracts.RelayRequestInvalid.Refuse("Cloudly's answer to %s was malformed", method)
	case errors.Is(err, typedsocket.ErrClosed):
		return contracts.RelayUpstreamDetached.Refuse("the Cloudly session was lost before the answer")
	}
	return err
}

// start runs the session loop until close; a closed session may start again (an HA relay that
// leads again). Starting a running session does nothing.
func (u *upstream) start(ctx context.Context) {
	u.runMu.Lock()
	defer u.runMu.Unlock()
	if u.done != nil {
		return
	}
	u.stopping.Store(false)
	ctx, u.cancel = context.WithCancel(ctx)
	done := make(chan struct{})
	u.done = done
	go func() { u.run(ctx); close(done) }()
}

// close ends the session: the current socket gets a close handshake (1001) with reason, and is cut
// under it when ctx ends first (a handshake may outlast the shutdown time); then the session loop
// stops. It returns once the loop has. Closing a session that is not running does nothing.
func (u *upstream) close(ctx context.Context, reason string) {
	u.runMu.Lock()
	defer u.runMu.Unlock()
	if u.done == nil {
		return
	}
	u.stopping.Store(true)
	if s := u.sock.Load(); s != nil {
		go s.conn.Close(websocket.StatusGoingAway, reason)
		select {
		case <-s.conn.Done():
		case <-ctx.Done():
			if s.raw != nil {
				s.raw.Close()
			}
			s.conn.CloseNow()
		}
	}
	u.cancel()
	<-u.done
	u.done = nil
	u.hist.Stopped(u.now())
}

// run keeps the relay attached until ctx ends: dial, register, serve, and on loss wait and again.
func (u *upstream) run(ctx context.Context) {
	bo := backoff.New()
	for {
		wait := u.session(ctx, bo)
		if ctx.Err() != nil {
			return
		}
		u.log.Info().Dur("wait", wait).Msg("re-dialling Cloudly")
		u.hist.Waiting(u.now().Add(wait))
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
}
