package relay

import (
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// Refuse before working (docs/hostile.md): under load — the unregistered connections' part of the
// budget, or the descriptor cap, past three quarters — a connection the relay will refuse anyway
// costs it as little as can be:
//   - At accept, before TLS, the HTTP request and the upgrade: a token bucket per source address
//     (--upgrade-rate-per-source, --upgrade-burst-per-source); past it the connection is closed
//     without a word (reason "rate").
//   - An unregistered connection that sends anything but a registration the relay would forward
//     is closed at once, nothing more read from it and nothing answered (judge).
//   - An unregistered connection closed for any reason gets no close handshake.
// Below the mark nothing of this applies: a reconnect storm of nodes behind one translated
// address is never throttled while the relay has room for it.

// Defaults of the bucket (decisions.md): four upgrades a second from one address, sixteen at once.
const (
	DefaultUpgradeRatePerSource  = 4.0
	DefaultUpgradeBurstPerSource = 16
)

// maxRateSources bounds the buckets kept at once; past it full ones (as good as new) are dropped,
// and when none is, a new source is refused until one is.
const maxRateSources = MaxUnregistered

// pressed reports whether the relay is under load: the unregistered connections' part of the
// budget or the descriptor cap past three quarters.
func (a *admission) pressed() bool {
	if a.headers != nil {
		if used, limit := a.headers.Used(), a.headers.Limit(); used > limit/4*3 {
			return true
		}
	}
	a.mu.Lock()
	open := a.open
	a.mu.Unlock()
	return open > a.max/4*3
}

// sourceRates is a token bucket per source address.
type sourceRates struct {
	limit rate.Limit // set at construction
	burst int        // set at construction

	mu      sync.Mutex
	buckets map[string]*rate.Limiter // guarded by mu
}

func newSourceRates(perSecond float64, burst int) *sourceRates {
	return &sourceRates{limit: rate.Limit(perSecond), burst: burst, buckets: make(map[string]*rate.Limiter)}
}

// allow takes a token of source's bucket at now, and reports whether there was one.
func (s *sourceRates) allow(source string, now time.Time) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	b := s.buckets[source]
	if b == nil {
		if len(s.buckets) >= maxRateSources {
			s.sweepLocked(now)
			if len(s.buckets) >= maxRateSources {
				return false
			}
		}
		b = rate.NewLimiter(s.limit, s.burst)
		s.buckets[source] = b
	}
	return b.AllowN(now, 1)
}

// sweepLocked drops the buckets that have refilled: a new one would be the same.
func (s *sourceRates) sweepLocked(now time.Time) {
	for k, b := range s.buckets {
		if b.TokensAt(now) >= float64(s.burst) {
			delete(s.buckets, k)
		}
	}
}

// len is the number of buckets kept.
func (s *sourceRates) len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.buckets)
}

// judge judges each message of p by the method it requests (typedsocket.Options.Judge). A
// connection that has not registered may send only registrations:
//   - At a message that is no request at all — a malformed one, an answer, a stream frame — it is
//     closed, nothing answered and nothing more read (reason "not-registration"): no client that
//     means well sends one before it has registered, and the answer or close frame would cost
//     the relay more than the peer.
//   - A request it may not send (any but a registration; a registration while its last one is
//     still at Cloudly, or past MaxRegistrationsPerConnection) is refused by name, as the seeds
//     ask of a route-table read from a connection that is not the ingress, at most
//     RefusedUnregisteredRate a second and RefusedUnregisteredBurst at once: a client that got its
//     order wrong, or an ingress Cloudly refused that keeps asking for its table, learns why. One
//     that sends them faster is closed unanswered (reason "refusals").
//   - Under load it is closed at the first of those (reasons "not-registration", "registrations").
//
// An honest peer sends its registration and waits for the answer; a flooder's junk costs it its
// connection, not the relay its reading and answering.
func (d *downstream) judge(p *peer, method string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.role != roleNone {
		return true
	}
	registration := isRegistration(method)
	refused := !registration || p.pending > 0 || p.registrations >= MaxRegistrationsPerConnection
	switch {
	case method == "":
	case d.adm.pressed():
		if registration {
			if !refused {
				return true
			}
			d.m.unregistered.WithLabelValues("registrations").Inc()
			return false
		}
	case !refused:
		return true
	default:
		if p.refusals == nil {
			p.refusals = rate.NewLimiter(RefusedUnregisteredRate, RefusedUnregisteredBurst)
		}
		if p.refusals.AllowN(d.cfg.now(), 1) {
			return true
		}
		d.m.unregistered.WithLabelValues("refusals").Inc()
		return false
	}
	d.m.unregistered.WithLabelValues("not-registration").Inc()
	return false
}

// isRegistration reports whether method registers what a connection carries.
func isRegistration(method string) bool {
	r, ok := ruleFor(method)
	return ok && r.role != roleNone
}
