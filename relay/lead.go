package relay

import (
	"context"
	"errors"
	"net"
	"net/http"
	"time"

	"code.foss.global/serve.zone/relay/feature"
)

// Several relays per cluster (docs/ha.md). Without an Elector the relay leads from the start. With
// one, it stands by until elected: every listener bound, nothing dialled, every downstream
// connection refused 503 relay-standby; elected, it dials Cloudly and admits; when the leadership
// ends — the Lease lost, or a step down — it fences itself before anything else: the parts stop
// acting for the cluster (escrow releases nothing), the Cloudly socket is closed (1001), and then
// the downstream connections, so that nodes come back through the Service to the new leader.

// Elector decides whether this relay leads its cluster, for one term. Run competes until ctx
// ends; once elected, it calls lead once with a context that ends when the leadership does, and
// waits for lead to return — the relay has fenced itself then — and returns: the term is over,
// and the relay ends (Serve returns ErrTermEnded), so that its process comes back a standby whose
// registrationSequence starts at 0 and no process leads twice. Ready says why the relay could not
// lead now (nil: it could); Status is the status page's ha section. An Elector that also
// implements feature.Tenure is the relay's tenure: every send to Cloudly, and every part that
// acts for the cluster, asks it first.
type Elector interface {
	Run(ctx context.Context, lead func(ctx context.Context)) error
	Ready() error
	Status() any
}

// fenceTimeout bounds the Cloudly socket's close handshake when the leadership ends: the Lease
// expires for the others a lease duration after the last renewal, and the socket must be gone
// before.
const fenceTimeout = time.Second

// standbyRetryAfter is the Retry-After of a standby's refusal: the leader is a Service away.
const standbyRetryAfter = "1"

// ErrTermEnded is what Serve returns when the relay's election term has ended and it has fenced
// itself: it has led once, and its process exits (status 0) to come back a standby, as
// kube-controller-manager and kube-scheduler do when they lose their lease.
var ErrTermEnded = errors.New("the term ended: exiting so the container restarts as a standby with registrationSequence 0")

// always is the tenure of a relay without HA: it leads from start to end.
type always struct{}

func (always) Held() bool { return true }

// errTenureEnded is a write to Cloudly refused because the relay's tenure has ended: the socket
// fails, and with it anything queued on it.
var errTenureEnded = errors.New("relay: this relay's tenure has ended: nothing more goes to Cloudly")

// tenuredConn is the TCP connection to Cloudly, under TLS and the WebSocket: every write asks the
// tenure first, the last point before bytes leave for Cloudly, so that a process resumed after a
// stop sends nothing — not a frame queued before the stop, not a ping's answer — once its tenure
// has run out. A refused write fails the socket.
type tenuredConn struct {
	net.Conn
	tenure feature.Tenure
}

func (c tenuredConn) Write(p []byte) (int, error) {
	if !c.tenure.Held() {
		c.Conn.Close()
		return 0, errTenureEnded
	}
	return c.Conn.Write(p)
}

// startLeading makes the relay act for the cluster: the parts hear it, and the upstream dials,
// until the downstream's context ends (the relay has stopped serving).
func (r *Relay) startLeading() {
	r.leading.Store(true)
	for _, w := range r.parts.lead {
		w.Leading(true)
	}
	r.up.start(r.down.ctx)
	r.log.relay.Info().Str("outcome", "leader").Msg("leading: dialling Cloudly")
}

// fence ends the relay's acting for the cluster: the parts first (escrow stops releasing before
// the Cloudly socket goes, whose loss would otherwise look like an outage), then the socket.
func (r *Relay) fence(reason string) {
	if !r.leading.Swap(false) {
		return
	}
	for _, w := range r.parts.lead {
		w.Leading(false)
	}
	ctx, cancel := context.WithTimeout(context.Background(), fenceTimeout)
	defer cancel()
	r.up.close(ctx, reason)
	r.log.relay.Info().Str("outcome", "standby").Msg("standing by: " + reason)
}

// leadWhile leads until ctx ends, then fences the relay and closes its downstream connections
// (unless it is shutting down, which closes them itself in its own order).
func (r *Relay) leadWhile(ctx context.Context) {
	r.startLeading()
	<-ctx.Done()
	r.fence("the Lease is lost")
	if !r.draining.Load() {
		r.down.peers.closeEach(closeStandingDown, "this relay stands by: reconnect to the elected one")
	}
}

// refuseStandby answers a downstream request while the relay stands by.
func refuseStandby(w http.ResponseWriter) {
	w.Header().Set("Retry-After", standbyRetryAfter)
	w.Header().Set("Connection", "close")
	http.Error(w, "relay-standby: this relay is not the elected one", http.StatusServiceUnavailable)
}
