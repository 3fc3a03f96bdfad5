package relay

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coder/websocket"
	"github.com/rs/zerolog"

	"code.foss.global/serve.zone/relay/contracts"
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

// upstream is the relay's one session with Cloudly (SPEC §4). The session loop (run) owns
// dialling, registration and backoff; other goroutines only read the attached connection.
type upstream struct {
	r   *Relay         // set at construction
	log zerolog.Logger // set at construction

	mu      sync.Mutex
	conn    *typedsocket.Conn             // guarded by mu: the attached session, nil while detached
	custody contracts.RefusalName         // guarded by mu: "" while Cloudly dispatches to the relay
	config  *contracts.ClusterRelayConfig // guarded by mu: the newest pushClusterRelayConfig
	origin  string                        // guarded by mu: the cluster's relay origin

	sequence int64                            // owned by run: the next registrationSequence
	current  atomic.Pointer[typedsocket.Conn] // the socket in use, attached or not
	accepted atomic.Pointer[typedsocket.Conn] // set on current's read loop when Cloudly accepts its registration
	stopping atomic.Bool                      // set when the relay shuts down
	tlsConf  *tls.Config                      // set at construction
	raw      atomic.Value                     // net.Conn: the socket under current
}

func newUpstream(r *Relay) (*upstream, error) {
	u := &upstream{r: r, log: r.log.With().Str("component", "upstream").Logger()}
	tlsConf := &tls.Config{MinVersion: tls.VersionTLS12}
	if r.cfg.CloudlyCAFile != "" {
		pool, err := x509.SystemCertPool()
		if err != nil {
			pool = x509.NewCertPool()
		}
		pem, err := os.ReadFile(r.cfg.CloudlyCAFile)
		if err != nil {
			return nil, &ConfigError{Flag: "cloudly-ca-file", Reason: "cannot read " + r.cfg.CloudlyCAFile}
		}
		if !pool.AppendCertsFromPEM(pem) {
			return nil, &ConfigError{Flag: "cloudly-ca-file", Reason: r.cfg.CloudlyCAFile + " holds no PEM certificate"}
		}
		tlsConf.RootCAs = pool
	}
	u.tlsConf = tlsConf
	return u, nil
}

// dialClient is an HTTP client for one dial that keeps the socket it opens (below TLS), so that the
// send loop can cork it (every node's traffic shares this socket: bursts leave in one write) and a
// shutdown can close it under the WebSocket when the close handshake overruns.
func (u *upstream) dialClient() (*http.Client, **typedsocket.CorkConn) {
	raw := new(*typedsocket.CorkConn)
	var d net.Dialer
	t := &http.Transport{
		TLSClientConfig: u.tlsConf, Proxy: http.ProxyFromEnvironment, DisableKeepAlives: true,
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			c, err := d.DialContext(ctx, network, addr)
			if err != nil {
				return nil, err
			}
			*raw = typedsocket.NewCorkConn(c)
			return *raw, nil
		},
	}
	return &http.Client{Transport: t}, raw
}

// Attached reports whether the relay holds an accepted registration with Cloudly.
func (u *upstream) Attached() bool { return u.attached() != nil }

func (u *upstream) attached() *typedsocket.Conn {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.conn
}

// custodyEnded returns the undispatched refusal that ended the relay's custody, or "".
func (u *upstream) custodyEnded() contracts.RefusalName {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.custody
}

// Call forwards a request to Cloudly (see Upstream).
func (u *upstream) Call(method string, body json.RawMessage, done func(json.RawMessage, error)) {
	u.callFor(nil, method, body, done)
}

// callFor is Call with the request charged to share (nil: not charged) until written: the share
// of the downstream peer it is sent for. It returns the call in flight (zero when done was called
// already).
func (u *upstream) callFor(share typedsocket.Share, method string, body json.RawMessage, done func(json.RawMessage, error)) typedsocket.Pending {
	conn := u.attached()
	if conn == nil {
		done(nil, contracts.RelayUpstreamDetached.Refuse("the relay has no Cloudly session"))
		return typedsocket.Pending{}
	}
	k, err := conn.CallFor(share, method, body, 0, func(rep typedsocket.Reply) { done(rep.Response, upstreamError(rep.Err, method)) })
	if err != nil {
		done(nil, upstreamError(err, method))
	}
	return k
}

// sendFrame forwards a node's stream frame to Cloudly whole, charged to the node's share until
// written.
func (u *upstream) sendFrame(p *peer, frame []byte) error {
	conn := u.attached()
	if conn == nil {
		return contracts.RelayUpstreamDetached.Refuse("the relay has no Cloudly session")
	}
	return upstreamError(conn.SendFrameFor(p.share, frame), contracts.MethodVirtualStream)
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

// run keeps the relay attached until ctx ends: dial, register, serve, and on loss wait and again.
func (u *upstream) run(ctx context.Context) {
	bo := backoff.New()
	for {
		wait := u.session(ctx, bo)
		if ctx.Err() != nil {
			return
		}
		u.log.Info().Dur("wait", wait).Msg("re-dialling Cloudly")
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
}

// session runs one socket from dial to loss and returns how long to wait before the next.
func (u *upstream) session(ctx context.Context, bo *backoff.Backoff) time.Duration {
	dctx, cancel := context.WithTimeout(ctx, dialTimeout)
	client, raw := u.dialClient()
	ws, _, err := websocket.Dial(dctx, u.r.cfg.CloudlyURL, &websocket.DialOptions{HTTPClient: client})
	cancel()
	if err != nil {
		u.log.Warn().Err(err).Str("outcome", "dial-failed").Msg("cannot reach Cloudly")
		return bo.Next()
	}
	conn := typedsocket.New(ws, typedsocket.Options{
		Handler:       typedsocket.HandlerFunc(u.serve),
		Streams:       typedsocket.StreamHandlerFunc(u.r.serveCloudlyStream),
		Dropped:       u.r.countDropped,
		ReadLimit:     u.r.cfg.MaxMessageBytes,
		MaxQueue:      upstreamMaxQueue,
		MaxQueueBytes: upstreamMaxQueueBytes,
		MaxInflight:   upstreamMaxInflight,
		BusyError:     contracts.RelayNodeBusy.Refuse("the relay has too many Cloudly requests in flight"),
		Logger:        u.log,
		PingInterval:  u.r.pingInterval,
		DeadTimeout:   u.r.deadTimeout,
		CallTimeout:   u.r.callTimeout,
		Cork:          *raw,
	})
	u.current.Store(conn)
	u.raw.Store(*raw)
	go conn.Run(ctx)
	defer func() {
		conn.CloseNow()
		<-conn.Done()
		u.current.Store(nil)
		u.accepted.Store(nil)
	}()

	if wait, ok := u.attach(ctx, conn, bo); !ok {
		return wait
	}
	bo.Reset()
	<-conn.Done()
	u.detach(context.Cause(conn.Context()), ctx.Err() != nil || u.stopping.Load())
	return bo.Next()
}

// attach opens the Cloudly client session and registers the relay on conn.
func (u *upstream) attach(ctx context.Context, conn *typedsocket.Conn, bo *backoff.Backoff) (time.Duration, bool) {
	jwt, err := ReadToken(u.r.cfg.CloudlyTokenFile)
	if err != nil {
		u.log.Error().Err(err).Msg("cannot open a Cloudly session")
		return bo.Next(), false
	}
	cctx, cancel := context.WithTimeout(ctx, attachTimeout)
	defer cancel()
	resp, err := conn.Call(cctx, contracts.MethodRegisterCloudlyClientSession, contracts.EncodeCloudlyClientSessionRequest(contracts.RelayOffer, jwt))
	if err != nil {
		return u.refused("cloudly client session", err, bo), false
	}
	if wait, ok := u.judgeOffer("cloudly client session", resp, bo); !ok {
		return wait, false
	}

	seq := u.sequence
	u.sequence++
	reg := contracts.RegisterClusterRelayRequest{
		Protocol: contracts.RelayOffer,
		Relay: contracts.ClusterRelayRegistration{
			Version: u.r.cfg.BuildVersion, NodeID: u.r.cfg.NodeID,
			ListenAddress: u.r.cfg.AdvertiseAddress, ListenPort: u.r.listenPort(),
		},
		RegistrationSequence: seq,
	}
	if hub := u.r.feats.Hub; hub != nil {
		ep := hub.Endpoint()
		reg.Relay.VPNHub = &ep
	}
	body, _ := json.Marshal(reg)
	resp, err = u.register(cctx, conn, body)
	if err != nil {
		return u.refused("cluster relay registration", err, bo), false
	}
	if wait, ok := u.judgeOffer("cluster relay registration", resp, bo); !ok {
		return wait, false
	}
	origin, ok := u.originOf(resp)
	if !ok {
		u.r.metrics.upstreamRegs.WithLabelValues("failed").Inc()
		u.log.Warn().Str("outcome", "malformed").Msg("Cloudly's registration answer names no canonical origin")
		return bo.Next(), false
	}
	u.r.metrics.upstreamRegs.WithLabelValues("accepted").Inc()
	u.setAttached(conn, origin, seq)
	return 0, true
}

// register sends registerClusterRelay on conn. An acceptance is recorded on conn's read loop,
// before it reads Cloudly's next message: Cloudly may send requests right after accepting, and
// they must be served as coming from the attached session (escrow holds) even though this
// goroutine has not recorded the attachment yet. Custody resumes there too, so that the
// configuration push that follows an acceptance (relay: null ends it again) is not undone.
func (u *upstream) register(ctx context.Context, conn *typedsocket.Conn, body json.RawMessage) (json.RawMessage, error) {
	return conn.CallObserved(ctx, contracts.MethodRegisterClusterRelay, body, func(rep typedsocket.Reply) {
		if rep.Err == nil && u.acceptable(rep.Response) {
			// Cloudly dispatches to the relay again: custody resumes here, ordered before the
			// configuration push that follows the acceptance, which may end it again (relay: null).
			u.mu.Lock()
			u.custody = ""
			u.mu.Unlock()
			u.accepted.Store(conn)
		}
	})
}

// acceptable reports whether a registerClusterRelay answer is one attach accepts: a compatible
// offer and a canonical origin. No side effects: it runs on the read loop.
func (u *upstream) acceptable(resp json.RawMessage) bool {
	offer, err := contracts.ReadProtocolOffer(resp)
	if err != nil {
		return false
	}
	if refusal, _ := contracts.NegotiateProtocol(contracts.RelayOffer, offer); refusal != nil {
		return false
	}
	_, ok := u.originOf(resp)
	return ok
}

// originOf reads the canonical origin Cloudly's registration answer names (https, or http on an
// insecure-plaintext relay).
func (u *upstream) originOf(resp json.RawMessage) (string, bool) {
	var answer contracts.RegisterClusterRelayResponse
	if json.Unmarshal(resp, &answer) != nil {
		return "", false
	}
	ok := contracts.IsCanonicalOrigin(answer.Origin, "https") ||
		u.r.cfg.InsecurePlaintext && contracts.IsCanonicalOrigin(answer.Origin, "http")
	return answer.Origin, ok
}

// judgeOffer negotiates the offer Cloudly answered with, from the relay's side.
func (u *upstream) judgeOffer(what string, resp json.RawMessage, bo *backoff.Backoff) (time.Duration, bool) {
	offer, err := contracts.ReadProtocolOffer(resp)
	if err != nil {
		u.log.Warn().Str("step", what).Str("outcome", "malformed").Msg("Cloudly's answer carries no readable offer")
		return bo.Next(), false
	}
	refusal, _ := contracts.NegotiateProtocol(contracts.RelayOffer, offer)
	if refusal != nil {
		u.log.Warn().Str("step", what).Msg(contracts.DescribeProtocolRefusal(*refusal))
		return contracts.RefusedOfferRetryInterval, false
	}
	return 0, true
}

// refused handles a refused or failed attach step and returns the wait before the next try.
func (u *upstream) refused(what string, err error, bo *backoff.Backoff) time.Duration {
	var remote *typedsocket.Error
	if !errors.As(err, &remote) {
		if what == "cluster relay registration" {
			u.r.metrics.upstreamRegs.WithLabelValues("failed").Inc()
		}
		u.log.Warn().Err(err).Str("step", what).Str("outcome", "failed").Msg("attach failed")
		return bo.Next()
	}
	if pr, ok := contracts.ReadProtocolRefusal(remote.Data); ok {
		// A refusal stands until an operator upgrades one of the two sides, so the relay waits.
		u.log.Warn().Str("step", what).Msg(contracts.DescribeProtocolRefusal(pr))
		if what == "cluster relay registration" {
			u.r.metrics.upstreamRegs.WithLabelValues(contracts.ProtocolIncompatibleCode).Inc()
		}
		return contracts.RefusedOfferRetryInterval
	}
	name := remote.Name()
	if what == "cluster relay registration" {
		outcome := string(name)
		if outcome == "" {
			outcome = "refused"
		}
		u.r.metrics.upstreamRegs.WithLabelValues(outcome).Inc()
	}
	u.log.Warn().Str("step", what).Str("refusal", string(name)).Str("outcome", "refused").Msg("Cloudly refused the relay")
	if contracts.IsUndispatchedRefusal(name) {
		u.endCustody(name)
	}
	return bo.Next()
}

// endCustody: Cloudly says it does not dispatch to this relay. Drop what is held for the nodes,
// refuse new node registrations with the same name, and keep re-registering.
func (u *upstream) endCustody(name contracts.RefusalName) {
	u.mu.Lock()
	was := u.custody
	u.custody = name
	u.mu.Unlock()
	if was == "" {
		u.log.Warn().Str("refusal", string(name)).Msg("custody ended: escrowed runs dropped, node registrations refused")
	}
	if e := u.r.feats.Escrow; e != nil {
		e.EndCustody()
	}
}

func (u *upstream) setAttached(conn *typedsocket.Conn, origin string, seq int64) {
	u.mu.Lock()
	u.conn, u.origin = conn, origin // custody resumed on the read loop (register)
	u.mu.Unlock()
	u.r.metrics.attached.Set(1)
	u.r.metrics.attaches.Inc()
	u.log.Info().Int64("sequence", seq).Str("origin", origin).Str("outcome", "attached").Msg("registered with Cloudly")
	if e := u.r.feats.Escrow; e != nil {
		e.SetAttached(true)
	}
	if in := u.r.feats.Ingress; in != nil {
		in.Attached(u)
	}
	u.r.announceAttached()
}

func (u *upstream) detach(cause error, shuttingDown bool) {
	u.mu.Lock()
	u.conn = nil
	u.mu.Unlock()
	u.r.metrics.attached.Set(0)
	u.r.metrics.detaches.Inc()
	if shuttingDown {
		u.log.Info().Str("outcome", "detached").Msg("Cloudly session closed for shutdown")
	} else {
		u.log.Warn().Err(cause).Str("outcome", "detached").Msg("Cloudly session lost")
	}
	if e := u.r.feats.Escrow; e != nil {
		e.SetAttached(false)
	}
}

// serve answers Cloudly's requests on the socket: the methods the relay serves itself, refusals
// for local-only methods, and everything else routed to the node it names.
func (u *upstream) serve(c *typedsocket.Conn, req *typedsocket.Request) {
	f := u.r.feats
	reply := func(body json.RawMessage, err error) { u.r.answer(req, body, err) }
	switch m := req.Method; {
	case m == contracts.MethodPushClusterRelayConfig:
		reply(u.pushConfig(req.Body))
	case m == contracts.MethodHoldRuntimeNetworkDnsLeaseRenewals && f.Escrow != nil:
		reply(f.Escrow.Hold(c == u.accepted.Load(), req.Body))
	case m == contracts.MethodPushClusterVpnMembership:
		if f.Hub == nil {
			reply(nil, contracts.RelayVPNHubOff.Refuse("this relay runs no VPN hub"))
			return
		}
		reply(f.Hub.PushMembership(req.Body))
	case m == contracts.MethodPushClusterRouteTable && f.Ingress != nil:
		reply(f.Ingress.PushRouteTable(req.Body))
	case m == contracts.MethodGetClusterTrafficStatistics && f.Ingress != nil:
		f.Ingress.TrafficStatistics(req.Body, reply)
	case contracts.IsIsolatedRestoreMethod(m) && f.Restore != nil:
		f.Restore.Serve(m, req.Body, reply)
	case contracts.IsServedToCloudly(m):
		reply(nil, contracts.RelayMethodUnknown.Refuse("%s (this relay has that part off)", m))
	case contracts.IsLocalOnlyMethod(m):
		reply(nil, contracts.RelayMethodLocalOnly.Refuse("%s belongs to a controller on the node's own host", m))
	default:
		u.r.routeToNode(req)
	}
}

// pushConfig serves pushClusterRelayConfig: the newest push replaces the previous one.
func (u *upstream) pushConfig(body json.RawMessage) (json.RawMessage, error) {
	cfg, err := contracts.ReadClusterRelayConfigPush(body, u.r.cfg.InsecurePlaintext)
	if err != nil {
		return nil, contracts.RelayRequestInvalid.Refuse("%v", err)
	}
	if cfg.ClusterID != u.r.cfg.ClusterID {
		return nil, contracts.RelayRequestInvalid.Refuse("config names cluster %s; this relay serves %s", cfg.ClusterID, u.r.cfg.ClusterID)
	}
	u.mu.Lock()
	u.config = &cfg
	wasDisabled := u.custody == contracts.RelayClusterNotEnabled
	u.mu.Unlock()
	if r := u.r.feats.Restore; r != nil {
		r.SetCorestores(cfg.Corestores)
	}
	switch {
	case cfg.Relay == nil:
		// The operator disabled the relay: the same as hearing relay-cluster-not-enabled.
		u.endCustody(contracts.RelayClusterNotEnabled)
	case wasDisabled:
		u.mu.Lock()
		u.custody = ""
		u.mu.Unlock()
		u.log.Info().Msg("relay enabled again: custody resumed")
	}
	u.log.Info().Int("corestores", len(cfg.Corestores)).Bool("enabled", cfg.Relay != nil).Msg("relay configuration applied")
	return json.RawMessage(`{}`), nil
}
