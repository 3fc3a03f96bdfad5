package relay

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coder/websocket"
	"github.com/rs/zerolog"

	"code.foss.global/serve.zone/relay/contracts"
	"code.foss.global/serve.zone/relay/feature"
	"code.foss.global/serve.zone/relay/internal/backoff"
	"code.foss.global/serve.zone/relay/internal/typedsocket"
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

// upstreamHost is what an upstream needs of the relay: the narrow seam between one Cloudly
// session and everything else. The relay implements it.
type upstreamHost interface {
	// serveCloudly serves one of Cloudly's requests, on the socket's read loop.
	serveCloudly(req *typedsocket.Request)
	// serveCloudlyStream forwards one of Cloudly's stream frames; c is the socket it came on.
	serveCloudlyStream(c *typedsocket.Conn, f *typedsocket.StreamFrame)
	// nextRegistration is the registerClusterRelay body to send next. registrationSequence counts
	// once per registration in the whole process (SPEC §4), whichever socket sends it.
	nextRegistration() (seq int64, body json.RawMessage)
	// registrationAccepted runs on the socket's read loop when Cloudly accepts its registration,
	// before Cloudly's next message is served.
	registrationAccepted()
	// upstreamAttached runs once the session is attached, upstreamDetached once it is lost.
	upstreamAttached(up feature.Upstream)
	upstreamDetached()
	// undispatched: Cloudly refused the relay with one of the three undispatched refusals.
	undispatched(name contracts.RefusalName)
	// countDropped counts a frame dropped without an answer, by reason.
	countDropped(reason string)
}

// upstreamConfig is what one upstream is told.
type upstreamConfig struct {
	url       string         // --cloudly-url
	tokenFile string         // --cloudly-token-file: the machine JWT, re-read at every attach
	roots     *x509.CertPool // Cloudly's certificate roots; nil: the system's
	allowHTTP bool           // --insecure-plaintext: an http origin is canonical too
	readLimit int64          // --max-message-bytes
	timings   timings        // the socket's; zero means the SPEC §2 defaults
	// dial opens the TCP connection to Cloudly; nil: a net.Dialer. Tests dial an in-memory pipe.
	dial func(ctx context.Context, network, addr string) (net.Conn, error)
}

// upstream is one session with Cloudly (SPEC §4). Its session loop (run) owns dialling,
// registration and backoff; other goroutines only read the current socket.
type upstream struct {
	host upstreamHost     // set at construction
	cfg  upstreamConfig   // set at construction
	log  zerolog.Logger   // set at construction
	m    *upstreamMetrics // set at construction
	// local is the streams parts hold on the socket (localstreams.go); set by New.
	local *localStreams
	// tenure is asked before anything is sent to Cloudly (lead.go); set at construction (always),
	// and by New to the elector's, before anything runs.
	tenure feature.Tenure

	sock atomic.Pointer[socket] // the socket in use, attached or not; nil between sockets
	// state is the session as the status page shows it; replaced whole on attach and detach.
	state    atomic.Pointer[sessionState]
	hist     *sessionLog // set at construction: why detached, retries, outages (sessionlog.go)
	stopping atomic.Bool // set by close: the session ends for shutdown or a step down
	runMu    sync.Mutex
	cancel   context.CancelFunc // guarded by runMu: ends run
	done     chan struct{}      // guarded by runMu: closed when run has returned; nil while not running
}

// sessionState is what the status page shows of the session: attached since when, with which
// registrationSequence and origin, or detached since when.
type sessionState struct {
	Attached bool      `json:"attached"`
	Since    time.Time `json:"since"`
	Sequence int64     `json:"sequence"`
	Origin   string    `json:"origin,omitempty"`
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

// attachStep is a step of attaching a socket: the two calls it takes.
type attachStep uint8

const (
	stepClientSession attachStep = iota // registerCloudlyClientSession
	stepRegistration                    // registerClusterRelay
)

func (s attachStep) String() string {
	if s == stepRegistration {
		return "cluster relay registration"
	}
	return "cloudly client session"
}

func newUpstream(host upstreamHost, cfg upstreamConfig, log zerolog.Logger, m *upstreamMetrics) *upstream {
	return &upstream{host: host, cfg: cfg, log: log.With().Str("component", "upstream").Logger(), m: m, hist: newSessionLog(cfg.url), tenure: always{}}
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
	k, err := conn.CallForNode(share, node, method, body, 0, func(rep typedsocket.Reply) { done(rep.Response, upstreamError(rep.Err, method)) })
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
	return upstreamError(conn.SendFrameFor(share, frame), contracts.MethodVirtualStream)
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
	u.hist.stopped(time.Now())
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
		u.hist.waiting(time.Now().Add(wait))
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
}

// dial opens a WebSocket to Cloudly and returns it with the TCP socket under it (below TLS), so
// that the send loop can cork it (every node's traffic shares this socket: bursts leave in one
// write) and a shutdown can close it under the WebSocket when the close handshake overruns.
func (u *upstream) dial(ctx context.Context, pongs *typedsocket.Pongs) (*websocket.Conn, *typedsocket.CorkConn, *tls.ConnectionState, error) {
	// Set by the transport's dial goroutine, which can outlive websocket.Dial when ctx ends.
	var raw atomic.Pointer[typedsocket.CorkConn]
	var d net.Dialer
	t := &http.Transport{
		TLSClientConfig: &tls.Config{MinVersion: tls.VersionTLS12, RootCAs: u.cfg.roots},
		Proxy:           http.ProxyFromEnvironment, DisableKeepAlives: true,
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			dial := d.DialContext
			if u.cfg.dial != nil {
				dial = u.cfg.dial
			}
			c, err := dial(ctx, network, addr)
			if err != nil {
				return nil, err
			}
			cc := typedsocket.NewCorkConn(tenuredConn{Conn: c, tenure: u.tenure})
			raw.Store(cc)
			return cc, nil
		},
	}
	ctx, cancel := context.WithTimeout(ctx, dialTimeout)
	defer cancel()
	ws, resp, err := websocket.Dial(ctx, u.cfg.url, &websocket.DialOptions{HTTPClient: &http.Client{Transport: t}, OnPingReceived: pongs.OnPingReceived})
	var state *tls.ConnectionState
	if resp != nil {
		state = resp.TLS
	}
	return ws, raw.Load(), state, err
}

// session runs one socket from dial to loss and returns how long to wait before the next.
func (u *upstream) session(ctx context.Context, bo *backoff.Backoff) time.Duration {
	pongs := new(typedsocket.Pongs)
	u.hist.dialling()
	ws, raw, state, err := u.dial(ctx, pongs)
	u.hist.connected(state)
	if err != nil {
		if ctx.Err() == nil {
			u.hist.failed(time.Now(), dialFailure(err))
		}
		u.log.Warn().Err(err).Str("outcome", "dial-failed").Msg("cannot reach Cloudly")
		return bo.Next()
	}
	s := &socket{raw: raw}
	s.conn = typedsocket.New(ws, typedsocket.Options{
		Handler:       typedsocket.HandlerFunc(func(_ *typedsocket.Conn, req *typedsocket.Request) { u.host.serveCloudly(req) }),
		Streams:       typedsocket.StreamHandlerFunc(u.host.serveCloudlyStream),
		Dropped:       u.host.countDropped,
		ReadLimit:     u.cfg.readLimit,
		MaxQueue:      upstreamMaxQueue,
		MaxQueueBytes: upstreamMaxQueueBytes,
		MaxInflight:   upstreamMaxInflight,
		BusyError:     contracts.RelayNodeBusy.Refuse("the relay has too many Cloudly requests in flight"),
		Logger:        u.log,
		PingInterval:  u.cfg.timings.pingInterval,
		DeadTimeout:   u.cfg.timings.deadTimeout,
		CallTimeout:   u.cfg.timings.callTimeout,
		Cork:          raw,
		Pongs:         pongs,
	})
	u.sock.Store(s)
	go s.conn.Run(ctx)
	defer func() {
		s.conn.CloseNow()
		<-s.conn.Done()
		u.sock.CompareAndSwap(s, nil)
	}()

	if wait, ok := u.attach(ctx, s, bo); !ok {
		return wait
	}
	bo.Reset()
	u.host.upstreamAttached(u)

	<-s.conn.Done()
	u.sock.CompareAndSwap(s, nil)
	if was := u.state.Load(); was != nil {
		u.state.Store(&sessionState{Since: time.Now(), Sequence: was.Sequence, Origin: was.Origin})
	}
	u.m.attached.Set(0)
	u.m.detaches.Inc()
	if ctx.Err() != nil || u.stopping.Load() {
		u.log.Info().Str("outcome", "detached").Msg("Cloudly session closed for shutdown")
	} else {
		cause := context.Cause(s.conn.Context())
		msg := "closed"
		if cause != nil {
			msg = cause.Error()
		}
		u.hist.failed(time.Now(), sessionFailure{Kind: failLost, Message: msg})
		u.log.Warn().Err(cause).Str("outcome", "detached").Msg("Cloudly session lost")
	}
	u.host.upstreamDetached()
	return bo.Next()
}

// attach opens the Cloudly client session on s and registers the relay. It reports whether Cloudly
// accepted the registration, or how long to wait before the next socket.
func (u *upstream) attach(ctx context.Context, s *socket, bo *backoff.Backoff) (time.Duration, bool) {
	jwt, err := ReadToken(u.cfg.tokenFile)
	if err != nil {
		u.hist.failed(time.Now(), sessionFailure{Kind: failToken, Message: err.Error()})
		u.log.Error().Err(err).Msg("cannot open a Cloudly session")
		return bo.Next(), false
	}
	ctx, cancel := context.WithTimeout(ctx, attachTimeout)
	defer cancel()
	resp, err := s.conn.Call(ctx, contracts.MethodRegisterCloudlyClientSession, contracts.EncodeCloudlyClientSessionRequest(contracts.RelayOffer, jwt))
	if err != nil {
		return u.refused(stepClientSession, err, bo), false
	}
	if _, err := u.judge(stepClientSession, resp); err != nil {
		return u.unusable(stepClientSession, err, bo), false
	}

	seq, body := u.host.nextRegistration()
	resp, err = s.conn.CallObserved(ctx, contracts.MethodRegisterClusterRelay, body, func(rep typedsocket.Reply) {
		u.observeRegistration(s, rep)
	})
	if err != nil {
		return u.refused(stepRegistration, err, bo), false
	}
	if !s.accepted.Load() {
		_, err := u.judge(stepRegistration, resp)
		return u.unusable(stepRegistration, err, bo), false
	}
	u.state.Store(&sessionState{Attached: true, Since: time.Now(), Sequence: seq, Origin: s.origin})
	u.hist.attached(time.Now())
	u.m.attached.Set(1)
	u.m.attaches.Inc()
	ev := u.log.Info().Int64("sequence", seq)
	if s.origin != "" {
		ev = ev.Str("origin", s.origin)
	}
	ev.Str("outcome", "attached").Msg("registered with Cloudly")
	return 0, true
}

// observeRegistration records an acceptance on the socket's read loop, before it reads Cloudly's
// next message: Cloudly may send requests right after accepting, and they must be served as coming
// from the attached session (escrow holds) although the session goroutine has not seen the answer
// yet. Custody resumes there too, ordered before the configuration push that follows an
// acceptance, which may end it again (relay: null).
func (u *upstream) observeRegistration(s *socket, rep typedsocket.Reply) {
	if rep.Err != nil {
		return
	}
	origin, err := u.judge(stepRegistration, rep.Response)
	if err != nil {
		return
	}
	s.origin = origin
	u.m.registrations.WithLabelValues("accepted").Inc() // counted before Attached() reports it
	s.accepted.Store(true)
	u.host.registrationAccepted()
}

// judge reads the answer to an attach step — Cloudly's offer; the registration's also names the
// cluster's relay origin, optional (SPEC §4 step 3: recorded when present, never a reason to
// refuse) — and negotiates the offer from the relay's side. No side effects: it runs on the read
// loop too.
func (u *upstream) judge(step attachStep, resp json.RawMessage) (origin string, err error) {
	var offer contracts.ProtocolOffer
	if step == stepRegistration {
		answer, err := contracts.ReadRegisterClusterRelayResponse(resp, u.cfg.allowHTTP)
		if err != nil {
			return "", err
		}
		offer, origin = answer.Protocol, answer.Origin
	} else if offer, err = contracts.ReadProtocolOffer(resp); err != nil {
		return "", err
	}
	if refusal, _ := contracts.NegotiateProtocol(contracts.RelayOffer, offer); refusal != nil {
		return "", refusal
	}
	return origin, nil
}

// unusable handles an answer Cloudly gave that the relay cannot attach with: no readable offer, or
// an offer the relay refuses. It returns the wait before the next try.
func (u *upstream) unusable(step attachStep, err error, bo *backoff.Backoff) time.Duration {
	var refusal *contracts.ProtocolRefusal
	if errors.As(err, &refusal) {
		// A refusal stands until an operator upgrades one of the two sides, so the relay waits.
		u.hist.failed(time.Now(), sessionFailure{Kind: failOffer, Step: step.String(), Message: contracts.DescribeProtocolRefusal(*refusal)})
		u.log.Warn().Stringer("step", step).Msg(contracts.DescribeProtocolRefusal(*refusal))
		return contracts.RefusedOfferRetryInterval
	}
	u.hist.failed(time.Now(), sessionFailure{Kind: failMalformed, Step: step.String(), Message: "Cloudly's answer carries no readable offer"})
	u.log.Warn().Stringer("step", step).Str("outcome", "malformed").Msg("Cloudly's answer carries no readable offer")
	return bo.Next()
}

// refused handles a refused or failed attach step and returns the wait before the next try.
func (u *upstream) refused(step attachStep, err error, bo *backoff.Backoff) time.Duration {
	count := func(outcome string) {
		if step == stepRegistration {
			u.m.registrations.WithLabelValues(outcome).Inc()
		}
	}
	var remote *typedsocket.Error
	if !errors.As(err, &remote) {
		count("failed")
		if !u.stopping.Load() { // a call cut by a shutdown is no failure
			u.hist.failed(time.Now(), sessionFailure{Kind: failStep, Step: step.String(), Message: err.Error()})
		}
		u.log.Warn().Err(err).Stringer("step", step).Str("outcome", "failed").Msg("attach failed")
		return bo.Next()
	}
	if pr, ok := contracts.ReadProtocolRefusal(remote.Data); ok {
		// A refusal stands until an operator upgrades one of the two sides, so the relay waits.
		count(contracts.ProtocolIncompatibleCode)
		u.hist.failed(time.Now(), sessionFailure{Kind: failOffer, Step: step.String(), Message: contracts.DescribeProtocolRefusal(pr)})
		u.log.Warn().Stringer("step", step).Msg(contracts.DescribeProtocolRefusal(pr))
		return contracts.RefusedOfferRetryInterval
	}
	label := contracts.RefusalLabel(err)
	count(label)
	u.hist.failed(time.Now(), sessionFailure{Kind: failRefused, Step: step.String(), Refusal: string(remote.Name()), Message: remote.Text})
	u.log.Warn().Stringer("step", step).Str("refusal", label).Str("outcome", "refused").Msg("Cloudly refused the relay")
	if name := remote.Name(); contracts.IsUndispatchedRefusal(name) {
		u.host.undispatched(name)
	}
	return bo.Next()
}
