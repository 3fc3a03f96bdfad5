package relay

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sync/errgroup"

	"code.foss.global/serve.zone/relay/contracts"
)

// Serving and shutting down: the downstream listener's handler, the order a relay stops in, and
// the drain that lets every request in flight be answered first.

// ShutdownTimeout bounds a graceful shutdown: open connections get a close handshake until then.
const ShutdownTimeout = 5 * time.Second

// Bounds of the downstream HTTP server: headers in 10 s and 16 KiB, idle connections closed
// after 60 s (the admin listener has the same, package status).
const (
	headerTimeout  = 10 * time.Second
	idleTimeout    = 60 * time.Second
	maxHeaderBytes = 16 << 10
)

// Serve runs the relay until ctx ends, then shuts down within ShutdownTimeout: downstream
// connections get a close handshake (1001), the Cloudly session is closed, the components are
// stopped, listeners stop. A component that fails stops the relay the same way, and Serve returns
// its error.
func (r *Relay) Serve(ctx context.Context) error {
	serveCtx, cancelServe := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelServe()
	defer r.down.stop()

	// docs/hostile.md: idle 60 s, headers 10 s and 16 KiB on both servers; /v2/ sets its own progress
	// deadlines; every downstream connection is admitted (admission.go) before TLS.
	down := &http.Server{Handler: http.HandlerFunc(r.serveDownstream), ReadHeaderTimeout: headerTimeout, IdleTimeout: idleTimeout,
		MaxHeaderBytes: maxHeaderBytes, ErrorLog: newStdLogger(r.down.log),
		ConnContext: func(ctx context.Context, c net.Conn) context.Context {
			return context.WithValue(ctx, rawConnKey{}, c)
		}}
	var downLn net.Listener = listener{Listener: r.downLn, a: r.down.adm}
	if r.certs != nil {
		downLn = tls.NewListener(downLn, &tls.Config{MinVersion: tls.VersionTLS12, GetCertificate: r.certs.get,
			NextProtos: []string{"http/1.1"}})
	}

	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error { return ignoreClosed(down.Serve(downLn)) })
	g.Go(func() error { return r.admin.Serve(gctx) })
	elected := make(chan struct{}) // closed when the election has returned
	var termEnded atomic.Bool      // the election returned because the term ended
	electCtx, stopElection := context.WithCancel(serveCtx)
	defer stopElection()
	if r.elector == nil {
		close(elected)
		r.startLeading()
	} else {
		for _, w := range r.parts.lead {
			w.Leading(false) // a standby until elected
		}
		g.Go(func() error {
			defer close(elected)
			if err := r.elector.Run(electCtx, r.leadWhile); err != nil {
				return fmt.Errorf("election: %w", err)
			}
			if electCtx.Err() == nil {
				termEnded.Store(true)
				return ErrTermEnded // ends the relay as an error would: the group's context is done
			}
			return nil
		})
	}
	// Components run until the relay has closed what they serve and observe: downstream
	// connections and the Cloudly session.
	compCtx, stopComponents := context.WithCancel(serveCtx)
	defer stopComponents()
	for _, c := range r.parts.components {
		g.Go(func() error {
			if err := c.v.Run(compCtx); err != nil {
				return fmt.Errorf("%s: %w", c.name, err)
			}
			return nil
		})
	}
	g.Go(func() error { r.sweepStreams(gctx); return nil })
	r.log.relay.Info().Str("listen", r.downLn.Addr().String()).Str("admin", r.admin.Addr().String()).
		Str("cloudly", redactURL(r.cfg.CloudlyURL)).Msg("relay serving")

	<-gctx.Done()
	if termEnded.Load() {
		r.log.relay.Info().Str("outcome", "exit").Msg(ErrTermEnded.Error())
	}
	r.log.relay.Info().Msg("relay shutting down")
	deadline, cancel := context.WithTimeout(context.Background(), ShutdownTimeout)
	defer cancel()
	// The shutdown's bound and its steps' latencies are on the runtime's clock, as its timers are.
	begin := time.Now()
	step := func(what string) { r.log.relay.Debug().Dur("latency", time.Since(begin)).Msg("shutdown: " + what) }
	down.Shutdown(deadline)
	step("listener closed")
	r.drain(ShutdownTimeout / 2)
	if r.elector != nil {
		// Stepping down (docs/ha.md): Cloudly's socket closed first, the Lease released and the Pod
		// relabelled by the election's end, and only then the downstream connections, so that
		// nodes find the new leader attached or attaching.
		r.fence("stepping down")
		step("Cloudly session closed")
		stopElection()
		<-elected
		step("Lease released")
	}
	r.down.peers.closeAll(deadline)
	step("downstream connections closed")
	r.up.close(deadline, "relay shutting down")
	step("Cloudly session closed")
	stopComponents()
	r.admin.Shutdown(deadline)
	cancelServe()
	r.down.stop()
	err := g.Wait()
	step("components stopped, done")
	return err
}

// Run is Listen then Serve.
func (r *Relay) Run(ctx context.Context) error {
	if err := r.Listen(); err != nil {
		return err
	}
	return r.Serve(ctx)
}

// serveDownstream serves the downstream listener: /v2/ to registry forwarding, a WebSocket
// upgrade on every other path. Any other plain HTTP request is answered and its connection
// closed, so that an anonymous client holds no idle keep-alive connection outside every
// WebSocket bound.
func (r *Relay) serveDownstream(w http.ResponseWriter, req *http.Request) {
	if !r.leading.Load() {
		refuseStandby(w)
		return
	}
	if req.URL.Path == "/v2" || strings.HasPrefix(req.URL.Path, "/v2/") {
		if r.parts.registry == nil {
			w.Header().Set("Connection", "close")
			http.Error(w, "registry forwarding is off on this relay", http.StatusNotFound)
			return
		}
		r.parts.registry.ServeHTTP(w, req)
		return
	}
	if !isWebSocketUpgrade(req) {
		w.Header().Set("Connection", "close")
		w.Header().Set("Upgrade", "websocket")
		http.Error(w, "this endpoint serves TypedRequest over WebSocket", http.StatusUpgradeRequired)
		return
	}
	r.down.accept(w, req)
}

// drain refuses new requests, tells every node and ingress connection the relay is detaching
// (pushRelayUpstreamChanged { attached: false }), and waits, at most max, for their answers and
// for every request in flight in either direction to be answered. A peer's requests sent before
// its answer to the push are read, and answered, before the connection closes; a peer that honours
// the push sends nothing after it. So a shutdown loses no request without an answer.
func (r *Relay) drain(max time.Duration) {
	r.draining.Store(true)
	deadline := time.Now().Add(max)
	var acks sync.WaitGroup
	body := json.RawMessage(`{"attached":false}`)
	for _, p := range r.down.carried() {
		acks.Add(1)
		p.Call(contracts.MethodPushRelayUpstreamChanged, body, func(json.RawMessage, error) { acks.Done() })
	}
	acked := make(chan struct{})
	go func() { acks.Wait(); close(acked) }()
	select {
	case <-acked:
	case <-time.After(time.Until(deadline)):
	}
	r.log.relay.Debug().Dur("latency", max-time.Until(deadline)).Msg("shutdown: peers told, drain")
	for time.Now().Before(deadline) {
		if r.up.inflight()+r.down.inflight() == 0 {
			r.log.relay.Debug().Dur("latency", max-time.Until(deadline)).Msg("shutdown: nothing in flight")
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	r.log.relay.Warn().Msg("shutdown: requests still in flight after the drain time")
}
func ignoreClosed(err error) error {
	if errors.Is(err, http.ErrServerClosed) || errors.Is(err, net.ErrClosed) {
		return nil
	}
	return err
}
