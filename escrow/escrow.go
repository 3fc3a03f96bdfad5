package escrow

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"code.foss.global/serve.zone/relay/contracts"
	"code.foss.global/serve.zone/relay/contracts/strictjson"
	"code.foss.global/serve.zone/relay/feature"
)

// Options configure an Escrow. The zero value is usable.
type Options struct {
	// Logger is the relay's logger; New adds component "escrow". The zero value logs nothing.
	Logger zerolog.Logger
	// Registerer receives the escrow's metrics; nil registers none.
	Registerer prometheus.Registerer
	// Now is the clock; nil is time.Now.
	Now func() time.Time
}

// Escrow holds DNS lease renewal runs in memory and releases them while the relay is detached.
// Its methods are safe for concurrent use; none blocks on a node.
type Escrow struct {
	log     zerolog.Logger   // set at construction
	now     func() time.Time // set at construction
	metrics *metrics         // set at construction
	kick    chan struct{}    // wakes Run after any change; buffered, never blocks
	up      feature.Upstream // set by UseUpstream, before anything runs; nil outside a relay
	tenure  feature.Tenure   // set by UseTenure, before anything runs; nil outside a relay: always held
	// replicas is the HA leader's acknowledgement from its standbys, set by UseReplicaSync before
	// anything runs; nil without HA.
	replicas feature.ReplicaSync

	mu       sync.Mutex
	sched    *scheduler // guarded by mu
	pairs    rebinds    // guarded by mu: detached re-binding (rebind.go)
	watchers []*watcher // guarded by mu: standbys copying the escrow (replica.go)
	armed    int64      // guarded by mu: the instant Run's timer is set for; math.MaxInt64 while none

	answersMu sync.Mutex
	answers   []answer // guarded by answersMu: node answers waiting for Run
	spare     []answer // guarded by answersMu: the previous batch's buffer, reused
}

// releaseBatch bounds the pushes Run takes from the scheduler at once, so that the first nodes of
// a burst (every node's slot opening on the same grid instant) are not kept waiting for the last,
// and answers get the lock in between.
const releaseBatch = 256

// New builds an Escrow. It fails only when its metrics cannot be registered.
func New(opts Options) (*Escrow, error) {
	m, err := newMetrics(opts.Registerer)
	if err != nil {
		return nil, fmt.Errorf("register escrow metrics: %w", err)
	}
	e := &Escrow{log: opts.Logger.With().Str("component", "escrow").Logger(), now: opts.Now, metrics: m, kick: make(chan struct{}, 1), armed: math.MaxInt64}
	if e.now == nil {
		e.now = time.Now
	}
	e.sched = newScheduler(e.droppedLocked)
	e.pairs = newRebinds()
	return e, nil
}

func (e *Escrow) nowMs() int64 { return e.now().UnixMilli() }

// changedLocked wakes Run when a change made something due before the instant its timer is
// set for, or due already by the clock: a timer runs on the monotonic clock, and when the wall
// clock the windows are read on has moved on further (a process resumed after a stop, a clock a
// test moves), a node that registers again gets what is due at once, not when the timer fires.
// Most changes (an acknowledgement, a hold while attached) do neither, and Run sleeps on.
func (e *Escrow) changedLocked() {
	if at, ok := e.sched.next(); ok && (at < e.armed || at <= e.nowMs()) {
		e.armed = at
		e.kickRun()
	}
}

func (e *Escrow) kickRun() {
	select {
	case e.kick <- struct{}{}:
	default:
	}
}

// Hold serves holdRuntimeNetworkDnsLeaseRenewals. fromCloudly is false when the request did not
// come on the attached Cloudly session. The answer is { held } with the number of renewals held,
// or a refusal named by the first rule broken, judged in this order: escrow-cloudly-only,
// escrow-run-invalid, escrow-node-not-carried, escrow-run-foreign-session, escrow-run-unordered,
// escrow-run-stale. A run replaces the node's run; an empty run clears it.
func (e *Escrow) Hold(fromCloudly bool, body json.RawMessage) (json.RawMessage, error) {
	node, run, err := e.hold(fromCloudly, body)
	ev := e.log.Info()
	outcome := "held"
	switch {
	case err != nil:
		outcome = string(err.(*contracts.Refusal).Name)
	case run == nil:
		outcome = "cleared"
	default:
		first, last, from, to := run.span()
		ev = ev.Int("renewals", len(run.renewals)).Int64("first_sequence", first).Int64("last_sequence", last).
			Int64("window_start", from).Int64("window_end", to)
	}
	e.metrics.held(outcome)
	if node != "" {
		ev = ev.Str("node", node)
	}
	ev.Str("method", contracts.MethodHoldRuntimeNetworkDnsLeaseRenewals).Str("outcome", outcome).Msg("hold")
	if err != nil {
		return nil, err
	}
	held := 0
	if run != nil {
		held = len(run.renewals)
	}
	return contracts.EncodeHoldRuntimeNetworkDnsLeaseRenewalsResponse(held), nil
}

// hold judges and applies a hold. It returns the node (once the request was readable) and the
// run held, nil for a cleared node.
func (e *Escrow) hold(fromCloudly bool, body json.RawMessage) (string, *heldRun, error) {
	if !fromCloudly {
		return "", nil, refuseNotFromCloudly()
	}
	req, err := contracts.ReadHoldRuntimeNetworkDnsLeaseRenewalsRequest(body)
	if err != nil {
		return "", nil, refuseInvalid(err)
	}
	if len(req.Renewals) == 0 {
		// Clearing needs no session: Cloudly may withdraw a run whatever the node's state.
		e.mu.Lock()
		e.sched.clear(req.NodeID)
		e.gaugesLocked()
		e.mu.Unlock()
		return req.NodeID, nil, nil
	}
	unordered := req.OrderReasons()
	var run *heldRun
	if len(unordered) == 0 {
		run = newHeldRun(&req)
	}
	_, lastExpires := req.Span()
	now := e.nowMs()
	var unverified []int64 // set once the run is held; said after the lock is given back
	defer func() { e.digestsUnverified(req.NodeID, unverified) }()

	e.mu.Lock()
	defer e.mu.Unlock()
	ns, carried := e.sched.carrier(req.NodeID)
	if !carried || ns.node.Context().Err() != nil {
		// A connection that has ended carries nothing, whether or not its end has been recorded.
		return req.NodeID, nil, refuseNotCarried(req.NodeID)
	}
	session := contracts.RuntimeSession{NodeID: ns.id, Controller: ns.controller, RuntimeNamespace: ns.namespace}
	if reasons := req.ScopeReasons(session); len(reasons) > 0 {
		return req.NodeID, nil, refuseForeign(reasons)
	}
	if len(unordered) > 0 {
		return req.NodeID, nil, refuseUnordered(unordered)
	}
	if lastExpires <= now {
		return req.NodeID, nil, refuseStale(lastExpires, now)
	}
	e.sched.hold(req.NodeID, run, now)
	e.replicateLocked(runKey(req.NodeID), run.appendHold(nil, req.NodeID))
	if ns.acked >= 0 {
		e.replicateLocked(ackKey(req.NodeID), appendAckRecord(nil, ns.acked, run.projection))
	}
	e.extendPairLocked(req.NodeID, lastExpires)
	e.gaugesLocked()
	e.changedLocked()
	unverified = req.UnverifiedDigests()
	return req.NodeID, run, nil
}

// digestsUnverified counts the renewals of a held run whose well-formed digest the relay's rule
// does not reproduce (contracts.RenewalDigestVerified is false: the rule is an assumption, so such
// a run is held and the node, which verifies digest and signature, decides), and says so once for
// the run: the method, the node and the first such sequence, never a digest or a body.
func (e *Escrow) digestsUnverified(node string, seqs []int64) {
	if len(seqs) == 0 {
		return
	}
	e.metrics.unverified.Add(float64(len(seqs)))
	e.metrics.unverifiedHeld.Add(int64(len(seqs)))
	e.log.Warn().Str("method", contracts.MethodHoldRuntimeNetworkDnsLeaseRenewals).Str("node", node).
		Int64("sequence", seqs[0]).Int("renewals", len(seqs)).Str("outcome", "digest-unverified").
		Msg("held renewals whose digest the relay's assumed rule does not reproduce; the node verifies them")
}

// setAttached records the upstream state: renewals are released only while detached.
func (e *Escrow) setAttached(attached bool) {
	now := e.nowMs()
	e.mu.Lock()
	e.sched.setAttached(attached, now)
	e.changedLocked()
	e.mu.Unlock()
}

// CustodyEnded drops every run: Cloudly said it does not dispatch to this relay.
func (e *Escrow) CustodyEnded() {
	e.mu.Lock()
	runs := e.sched.runs()
	e.sched.endCustody()
	e.gaugesLocked()
	e.mu.Unlock()
	if runs > 0 {
		e.log.Warn().Int("runs", runs).Str("outcome", dropCustody).Msg("custody ended: every run dropped")
	}
}

// NodeBound records that n carries its node's current session, on every accepted registration,
// a rotation on the same connection included. A new session has the current renewal pushed
// again while detached. The escrow follows the connection's end through n.Context(): once it
// ends, n carries the node no more. The node's run stays until its last window ends, for the node
// to come back to.
func (e *Escrow) NodeBound(n feature.Node) {
	s := n.Session()
	if !contracts.IsClusterNodeID(s.NodeID) {
		return
	}
	controller, err := strictjson.Canonicalize(s.Controller)
	if err != nil {
		controller = nil // no canonical form: no run is in its scope
	}
	id, conn := s.NodeID, n.ID()
	now := e.nowMs()
	e.mu.Lock()
	ns, carried := e.sched.carrier(id)
	follow := !carried || ns.conn != conn // a rotation on the same connection is followed already
	e.sched.bound(id, n, conn, s.Raw, controller, s.RuntimeNamespace, now)
	e.gaugesLocked()
	e.changedLocked()
	e.mu.Unlock()
	if follow {
		// After the binding: a connection that has ended already is let go at once.
		context.AfterFunc(n.Context(), func() { e.nodeGone(id, conn) })
	}
}

// nodeGone records that connection conn, which carried node id, has ended; a connection that no
// longer carries the node (superseded) changes nothing.
func (e *Escrow) nodeGone(id string, conn uint64) {
	now := e.nowMs()
	e.mu.Lock()
	e.sched.gone(id, conn, now)
	e.mu.Unlock()
}

// Run drives releases until ctx ends: one timer for the next due event across every node. It
// sends a burst of pushes before it looks at any answer, so that answers arriving during a burst
// (every node's slot opening on the same grid instant) do not compete with the pushes still to go.
func (e *Escrow) Run(ctx context.Context) error {
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	defer timer.Stop()
	var swept int64
	for ctx.Err() == nil {
		e.mu.Lock()
		if now := e.nowMs(); now-swept > pairSweepEvery {
			e.expirePairsLocked(now)
			swept = now
		}
		releases := e.sched.releases(e.nowMs(), releaseBatch)
		more := len(releases) == releaseBatch
		next, ok := e.sched.next()
		e.armed = math.MaxInt64
		if ok && !more {
			e.armed = next
		}
		e.gaugesLocked()
		e.mu.Unlock()
		e.send(releases)
		if more || e.recordAnswers() {
			continue
		}
		timer.Stop()
		if ok {
			timer.Reset(time.UnixMilli(next).Sub(e.now()))
		}
		select {
		case <-ctx.Done():
		case <-e.kick:
		case <-timer.C:
		}
	}
	return nil
}

// send pushes each release on its node's connection, never blocking on a node.
func (e *Escrow) send(releases []release) {
	if len(releases) == 0 {
		return
	}
	now := e.now()
	e.metrics.pushes.Add(int64(len(releases)))
	for _, r := range releases {
		if e.tenure != nil && !e.tenure.Held() {
			// Asked right before each push: a relay resumed after a stop, its tenure over,
			// releases nothing before it fences; the push counts as failed and stays due.
			e.answered(r, nil, contracts.RelayUpstreamDetached.Refuse("this relay's tenure as the leader has ended: it releases nothing"))
			continue
		}
		if r.attempt == 1 {
			e.metrics.delay.Observe(max(now.Sub(time.UnixMilli(r.dueAt)), 0).Seconds())
		}
		signed := r.run.envelope(r.idx)
		body := contracts.AppendApplyRuntimeNetworkDnsLeaseRenewalRequest(make([]byte, 0, len(r.session)+len(signed)+24), r.session, signed)
		r.node.Call(contracts.MethodApplyRuntimeNetworkDnsLeaseRenewal, body, func(resp json.RawMessage, err error) {
			e.answered(r, resp, err)
		})
	}
}

// answered queues a node's answer to a release for Run; it runs on the connection's goroutine
// and never blocks.
func (e *Escrow) answered(r release, resp json.RawMessage, err error) {
	e.answersMu.Lock()
	e.answers = append(e.answers, answer{r, resp, err})
	first := len(e.answers) == 1
	e.answersMu.Unlock()
	if first {
		e.kickRun()
	}
}

// answer is a node's answer to a release, waiting for Run.
type answer struct {
	r    release
	resp json.RawMessage
	err  error
}

// recordAnswers binds the queued answers to the renewals sent and records them: acknowledged, or
// retried later. It reports whether there were any.
func (e *Escrow) recordAnswers() bool {
	e.answersMu.Lock()
	if len(e.answers) == 0 {
		e.answersMu.Unlock()
		return false
	}
	batch := e.answers
	e.answers, e.spare = e.spare[:0], nil // the two buffers never alias
	e.answersMu.Unlock()
	type judged struct {
		outcome string
		refusal string
	}
	outcomes := make([]judged, len(batch))
	for i, a := range batch {
		outcomes[i].outcome, outcomes[i].refusal = releaseOutcome(a.resp, a.err, a.r.run.reference(a.r.idx))
	}
	now := e.nowMs()
	e.mu.Lock()
	for i, a := range batch {
		if e.sched.result(a.r, outcomes[i].outcome == outcomeAccepted || outcomes[i].outcome == outcomeReplay, now) {
			ns := e.sched.nodes[a.r.nodeID]
			e.replicateLocked(ackKey(a.r.nodeID), appendAckRecord(nil, ns.acked, ns.run.projection))
		}
	}
	e.mu.Unlock()
	for i, a := range batch {
		o := outcomes[i]
		e.metrics.released(o.outcome)
		if ev := e.log.Debug(); ev.Enabled() {
			if o.refusal != "" {
				ev = ev.Str("refusal", o.refusal)
			}
			rn := a.r.run.renewals[a.r.idx]
			ev.Str("method", contracts.MethodApplyRuntimeNetworkDnsLeaseRenewal).Str("node", a.r.nodeID).
				Int64("sequence", rn.sequence).Int64("window_start", rn.notBefore).Int64("window_end", rn.expiresAt).
				Int("attempt", a.r.attempt).Str("outcome", o.outcome).Msg("release")
		}
	}
	clear(batch)
	e.answersMu.Lock()
	e.spare = batch[:0]
	e.answersMu.Unlock()
	return true
}

// droppedLocked counts and logs a run the scheduler stopped holding; the node's re-binding pair
// goes with it, and the standbys hear of both.
func (e *Escrow) droppedLocked(node string, run *heldRun, why string) {
	e.metrics.droppedRun(why)
	e.replicateLocked(runKey(node), nil)
	e.replicateLocked(ackKey(node), nil)
	e.dropPairLocked(node)
	if why == dropCustody {
		return // CustodyEnded logs one line for all
	}
	ev := e.log.Info()
	if why == dropExpired {
		ev = e.log.Debug()
	}
	if ev.Enabled() {
		first, last, from, to := run.span()
		ev.Str("node", node).Int("renewals", len(run.renewals)).Int64("first_sequence", first).
			Int64("last_sequence", last).Int64("window_start", from).Int64("window_end", to).Str("outcome", why).Msg("run dropped")
	}
}

func (e *Escrow) gaugesLocked() {
	e.metrics.runs.Set(float64(e.sched.runs()))
	e.metrics.renewals.Set(float64(e.sched.renewals))
}
