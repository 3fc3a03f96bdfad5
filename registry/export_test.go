package registry

import (
	"net/netip"
	"time"
)

// LoopbackIsPublic makes a registry treat loopback addresses as public, so that a test's storage
// on loopback can stand in for public storage; every other address keeps the rule.
func LoopbackIsPublic(o *Options) {
	o.publicAddr = func(a netip.Addr) bool { return a.Unmap().IsLoopback() || publicAddr(a) }
}

// PublicAddr is the address rule for redirects off the upstream's origin.
var PublicAddr = publicAddr

// Clock makes a registry keep its cache's disk pause by now instead of time.Now.
func Clock(o *Options, now func() time.Time) { o.now = now }

// FetchWaiters is how many requests wait for a fetch slot, so that a test can see every caller
// beyond the slots parked in the relay, not yet at the upstream.
func (r *Registry) FetchWaiters() int {
	p := r.fetches
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for _, s := range p.sources {
		n += s.waiters.Len()
	}
	return n
}
