package relay

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/coder/websocket"

	"code.foss.global/serve.zone/relay/contracts"
	"code.foss.global/serve.zone/relay/internal/backoff"
	"code.foss.global/serve.zone/relay/internal/typedsocket"
	"code.foss.global/serve.zone/relay/status"
)

// Attaching one socket to Cloudly (docs/protocol.md#upstream-session): dial, registerCloudlyClientSession,
// registerClusterRelay, each answer judged; then the session until the socket is lost. Every
// failure is recorded in the session's history (package status) and answered with the wait
// before the next socket.

// attachStep is a step of attaching a socket: the two calls it takes.
type attachStep uint8

const (
	stepClientSession attachStep = iota // registerCloudlyClientSession
	stepRegistration                    // registerClusterRelay
)

func (s attachStep) String() string {
	if s == stepRegistration {
		return status.StepRegistration
	}
	return status.StepClientSession
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
	u.hist.Dialling()
	ws, raw, state, err := u.dial(ctx, pongs)
	u.hist.Connected(state)
	if err != nil {
		if ctx.Err() == nil {
			u.hist.Failed(u.now(), status.DialFailure(err))
		}
		u.log.Warn().Err(err).Str("outcome", "dial-failed").Msg("cannot reach Cloudly")
		return bo.Next()
	}
	s := &socket{raw: raw}
	s.conn = typedsocket.New(ws, typedsocket.Options{
		Handler:       typedsocket.HandlerFunc(func(_ *typedsocket.Conn, req *typedsocket.Request) { u.hooks.serve(req) }),
		Streams:       typedsocket.StreamHandlerFunc(u.hooks.serveStream),
		Dropped:       u.hooks.dropped,
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
	u.hub.report(u, u.state.Load().sequence) // without waiting for the answer
	u.hooks.attached(u)

	<-s.conn.Done()
	u.sock.CompareAndSwap(s, nil)
	if was := u.state.Load(); was != nil {
		u.state.Store(&sessionState{since: u.now(), sequence: was.sequence, origin: was.origin})
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
		u.hist.Failed(u.now(), status.Failure{Kind: status.FailLost, Message: msg})
		u.log.Warn().Err(cause).Str("outcome", "detached").Msg("Cloudly session lost")
	}
	u.hooks.detached()
	return bo.Next()
}

// attach opens the Cloudly client session on s and registers the relay. It reports whether Cloudly
// accepted the registration, or how long to wait before the next socket.
func (u *upstream) attach(ctx context.Context, s *socket, bo *backoff.Backoff) (time.Duration, bool) {
	jwt, err := ReadToken(u.cfg.tokenFile)
	if err != nil {
		u.hist.Failed(u.now(), status.Failure{Kind: status.FailToken, Message: err.Error()})
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

	seq := u.registrations.Add(1) - 1
	body := u.hooks.registration(seq)
	resp, err = s.conn.Call(ctx, contracts.MethodRegisterClusterRelay, body, typedsocket.Observe(func(rep typedsocket.Reply) {
		u.observeRegistration(s, rep)
	}))
	if err != nil {
		return u.refused(stepRegistration, err, bo), false
	}
	if !s.accepted.Load() {
		_, err := u.judge(stepRegistration, resp)
		return u.unusable(stepRegistration, err, bo), false
	}
	u.state.Store(&sessionState{attached: true, since: u.now(), sequence: seq, origin: s.origin})
	u.hist.Attached(u.now())
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
	u.hooks.accepted()
}

// judge reads the answer to an attach step — Cloudly's offer; the registration's also names the
// cluster's relay origin, optional (docs/protocol.md#attaching: recorded when present, never a reason to
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
		u.hist.Failed(u.now(), status.Failure{Kind: status.FailOffer, Step: step.String(), Message: contracts.DescribeProtocolRefusal(*refusal)})
		u.log.Warn().Stringer("step", step).Msg(contracts.DescribeProtocolRefusal(*refusal))
		return contracts.RefusedOfferRetryInterval
	}
	u.hist.Failed(u.now(), status.Failure{Kind: status.FailMalformed, Step: step.String(), Message: "Cloudly's answer carries no readable offer"})
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
			u.hist.Failed(u.now(), status.Failure{Kind: status.FailStep, Step: step.String(), Message: err.Error()})
		}
		u.log.Warn().Err(err).Stringer("step", step).Str("outcome", "failed").Msg("attach failed")
		return bo.Next()
	}
	if pr, ok := contracts.ReadProtocolRefusal(remote.Data); ok {
		// A refusal stands until an operator upgrades one of the two sides, so the relay waits.
		count(contracts.ProtocolIncompatibleCode)
		u.hist.Failed(u.now(), status.Failure{Kind: status.FailOffer, Step: step.String(), Message: contracts.DescribeProtocolRefusal(pr)})
		u.log.Warn().Stringer("step", step).Msg(contracts.DescribeProtocolRefusal(pr))
		return contracts.RefusedOfferRetryInterval
	}
	label := contracts.RefusalLabel(err)
	count(label)
	u.hist.Failed(u.now(), status.Failure{Kind: status.FailRefused, Step: step.String(), Refusal: string(remote.Name()), Message: remote.Text})
	u.log.Warn().Stringer("step", step).Str("refusal", label).Str("outcome", "refused").Msg("Cloudly refused the relay")
	if name := remote.Name(); contracts.IsUndispatchedRefusal(name) {
		u.hooks.undispatched(name)
	}
	return bo.Next()
}
