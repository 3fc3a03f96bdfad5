package platform

import (
	"context"
	"math/rand/v2"
	"sync"
	"time"

	"code.foss.global/serve.zone/relay/contracts"
)

// node is one node with a Corestore: its desired state, credential and listings, and the two
// goroutines that carry them — stateLoop hands the desired state over, workLoop lists and carries
// closures, up to MaxNodeClosures at once — so that a slow closure never holds a desired state back, and one
// node's Corestore never holds up another node's.
type node struct {
	p      *Platform          // set at construction
	id     string             // set at construction
	ctx    context.Context    // set at construction: ends when the node leaves the configuration or the agent closes
	cancel context.CancelFunc // set at construction
	kick   chan struct{}      // set at construction, capacity 1: stateLoop has news
	work   chan struct{}      // set at construction, capacity 1: workLoop has news

	mu         sync.Mutex
	origin     string           // guarded by mu: from the newest configuration
	sched      schedule         // guarded by mu
	credential contracts.Secret // guarded by mu: zero until Cloudly pushed one
	session    uint64           // guarded by mu: the attached session it lists for; 0 detached
	desired    []byte           // guarded by mu: the newest desired-state body for this node
	desiredRev int64            // guarded by mu: the revision of desired; 0 none yet
	handedRev  int64            // guarded by mu: the revision Corestore took last
	handOver   string           // guarded by mu: outcome of the last hand-over
	delivered  int64            // guarded by mu: backups Cloudly accepted and Corestore heard of
	settled    int64            // guarded by mu: restores written into Corestore
	lastBackup string           // guarded by mu: outcome of the last backup
	lastRestor string           // guarded by mu: outcome of the last restore
	listing    string           // guarded by mu: outcome of the last listing
}

func (p *Platform) newNode(id, origin string) *node {
	n := &node{p: p, id: id, origin: origin, kick: make(chan struct{}, 1), work: make(chan struct{}, 1),
		sched: schedule{jitter: rand.Int64N}}
	n.ctx, n.cancel = context.WithCancel(p.ctx)
	return n
}

func (n *node) start() {
	n.p.goDo(n.stateLoop)
	n.p.goDo(n.workLoop)
}

func (n *node) stop() { n.cancel() }

func poke(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// setDesired records a newer desired state for the node; stateLoop hands it over.
func (n *node) setDesired(rev int64, body []byte) {
	n.mu.Lock()
	if rev <= n.desiredRev {
		n.mu.Unlock()
		return
	}
	n.desired, n.desiredRev = body, rev
	n.sched.newState(n.p.clock.Now())
	n.mu.Unlock()
	poke(n.kick)
}

// setCredential replaces the node's Corestore credential.
func (n *node) setCredential(c contracts.Secret) {
	n.mu.Lock()
	n.credential = c
	if n.session != 0 {
		n.sched.listFrom(n.p.clock.Now(), 0)
	}
	if n.desiredRev > n.handedRev && n.sched.stateDue.IsZero() {
		n.sched.newState(n.p.clock.Now())
	}
	n.mu.Unlock()
	poke(n.kick)
	poke(n.work)
}

func (n *node) dropCredential() {
	n.mu.Lock()
	n.credential = contracts.Secret{}
	n.mu.Unlock()
}

// attached: listing starts, within FirstList (at once when the credential is there already).
func (n *node) attached(session uint64) {
	n.mu.Lock()
	n.session = session
	n.sched.listFrom(n.p.clock.Now(), 0)
	n.mu.Unlock()
	poke(n.work)
}

func (n *node) detached() {
	n.mu.Lock()
	n.session = 0
	n.sched.stopListing()
	n.mu.Unlock()
}

func (n *node) setOrigin(origin string) {
	n.mu.Lock()
	changed := n.origin != origin
	n.origin = origin
	if changed && n.desiredRev > 0 {
		n.sched.newState(n.p.clock.Now()) // a new Corestore hears the newest state too
	}
	n.mu.Unlock()
	if changed {
		poke(n.kick)
	}
}

// sleep waits d (forever when !ok), a poke on ch, or the node's end; it reports false on the end.
func (n *node) sleep(d time.Duration, ok bool, ch chan struct{}) bool {
	if ok && d <= 0 {
		return n.ctx.Err() == nil
	}
	var timer <-chan time.Time
	if ok {
		t := n.p.clock.NewTimer(d)
		defer t.Stop()
		timer = t.C()
	}
	select {
	case <-n.ctx.Done():
		return false
	case <-ch:
	case <-timer:
	}
	return true
}

// stateLoop hands the newest desired state to the node's Corestore whenever one is due.
func (n *node) stateLoop() {
	for n.ctx.Err() == nil { // a hand-over cut short by the end is due still: the loop must not spin on it
		standby := n.p.isStandby() // p.mu before n.mu, never inside it (Configured holds p.mu, then n.mu)
		n.mu.Lock()
		d, due := wait(n.sched.stateDue, n.p.clock.Now())
		if n.credential.IsZero() || n.desired == nil || standby {
			due = false
		}
		n.mu.Unlock()
		if !due || d > 0 {
			if !n.sleep(d, due, n.kick) {
				return
			}
			continue
		}
		n.handOverState()
	}
}

func (n *node) handOverState() {
	n.mu.Lock()
	body, rev, origin, cred := n.desired, n.desiredRev, n.origin, n.credential
	n.mu.Unlock()
	ctx, cancel := n.p.withTimeout(n.ctx, n.p.opts.CallTimeout)
	start := n.p.clock.Now()
	err := n.p.cs.PutDesiredState(ctx, origin, cred, body)
	cancel()
	if n.ctx.Err() != nil {
		return
	}
	out := outcome(err, outcomeHanded)
	n.p.metrics.handOvers.WithLabelValues(out).Inc()
	n.mu.Lock()
	changed := n.handOver != out
	n.handOver = out
	var retry time.Duration
	if err == nil {
		n.handedRev = max(n.handedRev, rev)
		if rev == n.desiredRev {
			n.sched.stateHanded()
		}
	} else if rev == n.desiredRev {
		retry = n.sched.stateFailed(n.p.clock.Now())
	}
	n.mu.Unlock()
	ev := n.p.log.Debug().Dur("wait", retry)
	if err != nil && changed {
		ev = n.p.log.Info().Dur("wait", retry) // then counted only, until it changes
	}
	ev.Str("node", n.id).Str("op", "desired-state").Int("bytes", len(body)).Str("outcome", out).Dur("latency", n.p.clock.Since(start)).
		Msg("desired state handed to Corestore")
}

// workLoop lists the node's backups and restores whenever a listing is due, and carries their
// closures, up to MaxNodeClosures at once.
func (n *node) workLoop() {
	for n.ctx.Err() == nil {
		standby := n.p.isStandby()
		n.mu.Lock()
		d, due := wait(n.sched.listDue, n.p.clock.Now())
		if n.credential.IsZero() || n.session == 0 || standby {
			due = false
		}
		session := n.session
		n.mu.Unlock()
		if !due || d > 0 {
			if !n.sleep(d, due, n.work) {
				return
			}
			continue
		}
		n.list(session)
		n.mu.Lock()
		if n.session == session {
			n.sched.listed(n.p.clock.Now(), n.p.opts.ListInterval)
		}
		n.mu.Unlock()
	}
}

// list carries what the node's Corestore lists: ready backups to Cloudly, then wanted restores
// from it.
func (n *node) list(session uint64) {
	n.mu.Lock()
	origin, cred := n.origin, n.credential
	n.mu.Unlock()
	ctx, cancel := n.p.withTimeout(n.ctx, n.p.opts.CallTimeout)
	raw, err := n.p.cs.ReadyBackups(ctx, origin, cred)
	cancel()
	var backups []contracts.CorestoreBackup
	if err == nil {
		backups, _, err = contracts.ReadCorestoreBackups(raw)
		if err != nil {
			err = contracts.RestoreNodeRefused.Refuse("Corestore's backup listing is not readable")
		}
	}
	n.noteListing(err)
	carry(n, session, backups, func(b contracts.CorestoreBackup) { n.backup(origin, cred, b) })
	ctx, cancel = n.p.withTimeout(n.ctx, n.p.opts.CallTimeout)
	raw, err = n.p.cs.WantedRestores(ctx, origin, cred)
	cancel()
	var restores []contracts.CorestoreRestore
	if err == nil {
		restores, _, err = contracts.ReadCorestoreRestores(raw)
		if err != nil {
			err = contracts.RestoreNodeRefused.Refuse("Corestore's restore listing is not readable")
		}
	}
	n.noteListing(err)
	carry(n, session, restores, func(r contracts.CorestoreRestore) { n.restore(origin, cred, r) })
}

// carry runs do for each item, up to MaxNodeClosures at once (each still waits for a slot of its
// own, slots.go), while session is the current one; it returns when every one it started ended.
func carry[T any](n *node, session uint64, items []T, do func(T)) {
	next := make(chan T)
	var wg sync.WaitGroup
	for range min(n.p.opts.MaxNodeClosures, len(items)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for it := range next {
				do(it)
			}
		}()
	}
	for _, it := range items {
		if !n.p.current(session) || n.ctx.Err() != nil {
			break
		}
		next <- it
	}
	close(next)
	wg.Wait()
}

func (n *node) noteListing(err error) {
	out := outcome(err, outcomeListed)
	n.p.metrics.listings.WithLabelValues(out).Inc()
	n.mu.Lock()
	changed := n.listing != out
	n.listing = out
	n.mu.Unlock()
	if err != nil && changed {
		n.p.log.Info().Str("node", n.id).Str("outcome", out).Msg("cannot list the node's Corestore backups or restores")
	}
}
