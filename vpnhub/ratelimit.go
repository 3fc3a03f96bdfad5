package vpnhub

import (
	"net/netip"
	"sync"
	"sync/atomic"
	"time"
)

// Handshake admission (docs/protocol.md#vpn-hub): a token bucket per source address, never stricter than
// WireGuard's 20 per second with a burst of 5. The check runs when QUIC sees a connection's first
// packet, before any TLS or Noise work. One global bucket measures the load of all sources
// together but never refuses: docs/protocol.md#vpn-hub admits every source up to its own 20/s, so that a flood of
// bogus initiations cannot starve members, which a shared refusal bucket would let a few dozen
// addresses do. While the global bucket is less than half full, new connections must prove their
// source address with a QUIC Retry (WireGuard's cookie under load), so a spoofed flood cannot
// spend a real member's per-source tokens.

// Admission defaults.
const (
	DefaultHandshakeRate        = 20  // per source address and second (WireGuard's)
	DefaultHandshakeBurst       = 5   // per source address (WireGuard's)
	DefaultGlobalHandshakeRate  = 500 // per second, all sources together
	DefaultGlobalHandshakeBurst = 100
	maxTrackedSources           = 4096 // buckets swept of idle sources beyond this
	DefaultMaxHandshakes        = 16   // handshakes in progress at once
)

type bucket struct {
	tokens float64
	last   time.Time
}

// take refills b at rate up to burst and takes one token if there is one.
func (b *bucket) take(now time.Time, rate, burst float64) bool {
	if b.last.IsZero() {
		b.tokens = burst
	} else if dt := now.Sub(b.last).Seconds(); dt > 0 {
		b.tokens = min(burst, b.tokens+dt*rate)
	}
	b.last = now
	if b.tokens < 1 {
		return false
	}
	b.tokens--
	return true
}

type handshakeLimiter struct {
	rate, burst             float64 // per source; set at construction
	globalRate, globalBurst float64 // set at construction
	now                     func() time.Time

	mu       sync.Mutex
	global   bucket                 // guarded by mu
	overflow bucket                 // guarded by mu: shared by sources beyond maxTrackedSources
	sources  map[netip.Addr]*bucket // guarded by mu
	swept    time.Time              // guarded by mu: the last sweep

	pressure atomic.Bool // the global bucket is below half
}

func newHandshakeLimiter(rate float64, burst int, globalRate float64, globalBurst int, now func() time.Time) *handshakeLimiter {
	return &handshakeLimiter{
		rate: max(rate, DefaultHandshakeRate), burst: float64(max(burst, DefaultHandshakeBurst)),
		globalRate: globalRate, globalBurst: float64(globalBurst), now: now,
		sources: make(map[netip.Addr]*bucket),
	}
}

// allow takes a token for a handshake from addr from its bucket. The global bucket only measures
// the load that turns on Retry (underPressure); it refuses nobody.
func (l *handshakeLimiter) allow(addr netip.Addr) bool {
	addr = addr.Unmap()
	now := l.now()
	l.mu.Lock()
	defer l.mu.Unlock()
	b := l.sources[addr]
	if b == nil {
		if len(l.sources) >= maxTrackedSources && now.Sub(l.swept) >= time.Second {
			l.sweepLocked(now)
		}
		if len(l.sources) < maxTrackedSources {
			b = &bucket{}
			l.sources[addr] = b
		} else {
			b = &l.overflow // a flood from more sources than tracked: they share one bucket
		}
	}
	if !b.take(now, l.rate, l.burst) {
		return false
	}
	l.global.take(now, l.globalRate, l.globalBurst)
	l.pressure.Store(l.global.tokens < l.globalBurst/2)
	return true
}

// sweepLocked forgets sources whose bucket has refilled: they are as good as new.
func (l *handshakeLimiter) sweepLocked(now time.Time) {
	l.swept = now
	full := time.Duration(l.burst / l.rate * float64(time.Second))
	for a, b := range l.sources {
		if now.Sub(b.last) >= full {
			delete(l.sources, a)
		}
	}
}

// underPressure reports whether new connections should prove their address with a Retry.
func (l *handshakeLimiter) underPressure() bool { return l.pressure.Load() }

// handshakeSlots bound the handshakes in progress. Each costs the hub CPU in several goroutines
// of quic-go's and crypto/tls's (key exchange, certificate signature) and then the Noise
// responder's, and Go's scheduler shares the process's CPU among runnable goroutines alike: with
// no bound, the hundreds a flood keeps in progress queue every member's packet behind them (on a
// starved machine, for longer than a session's idle timeout). The rate limits above bound how
// often a source may start a handshake, not how many are in progress: a thousand sources inside
// their own limits keep a thousand going. With the slots, the handshakes' share of the hub's work
// is at most MaxHandshakes's goroutines, whatever the flood; a connection beyond them is refused
// before any TLS work, which costs one CONNECTION_REFUSED packet from quic-go's server goroutine.
// Packets of established connections never wait for a slot: quic-go routes them by connection ID
// before its server sees a packet.
type handshakeSlots chan struct{}

func newHandshakeSlots(n int) handshakeSlots { return make(handshakeSlots, n) }

// take takes a slot if one is free; release gives it back, once however often it is called.
func (s handshakeSlots) take() (release func(), ok bool) {
	select {
	case s <- struct{}{}:
		return sync.OnceFunc(func() { <-s }), true
	default:
		return nil, false
	}
}

// logLimiter lets one log line per key through per interval: per-packet and per-handshake events
// are logged at most that often.
type logLimiter struct {
	last [16]atomic.Int64 // Unix ns of the last line per key
}

func (l *logLimiter) allow(key int, now time.Time) bool {
	last := &l.last[key%len(l.last)]
	prev := last.Load()
	return now.UnixNano()-prev >= int64(time.Second) && last.CompareAndSwap(prev, now.UnixNano())
}
