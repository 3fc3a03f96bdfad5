package relay

import (
	"sync"

	"code.foss.global/serve.zone/relay/contracts"
)

// custody is whether Cloudly dispatches to this relay (docs/protocol.md#refusals-that-end-custody). It ends when Cloudly refuses
// the relay's registration with one of the three undispatched refusals, or pushes relay: null
// (relay-cluster-not-enabled); while it is ended, escrow holds nothing and node registrations are
// refused with that name. It resumes when Cloudly accepts a registration of the relay again, or
// enables the relay in a configuration push. No I/O; safe from any goroutine.
type custody struct {
	mu    sync.Mutex
	ended contracts.RefusalName // guarded by mu: "" while Cloudly dispatches to the relay
}

// endedBy is the refusal that ended custody, or "" while it is held.
func (c *custody) endedBy() contracts.RefusalName {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.ended
}

// end ends custody by name, and reports whether it was held until now.
func (c *custody) end(name contracts.RefusalName) (wasHeld bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	wasHeld = c.ended == ""
	c.ended = name
	return wasHeld
}

// resume holds custody again, whatever ended it.
func (c *custody) resume() {
	c.mu.Lock()
	c.ended = ""
	c.mu.Unlock()
}

// resumeFrom holds custody again if name ended it, and reports whether it did.
func (c *custody) resumeFrom(name contracts.RefusalName) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.ended != name {
		return false
	}
	c.ended = ""
	return true
}
