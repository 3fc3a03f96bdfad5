package ha

import (
	"sync"
	"time"

	"k8s.io/utils/clock"
)

// A hold survives a failover once it is answered (docs/ha.md): the escrow applies a hold, which the
// leader queues to every standby, then asks Sync to call it back once every standby with a
// complete copy has acknowledged everything queued to it so far — or once the bound
// (--ha-replication-ack) has passed, when the standbys that missed it are closed (they copy the
// whole state again when they come back). Sync never blocks: its caller answers Cloudly from done.
//
// A standby still copying the whole state is not waited for: the hold is in what it is being
// sent, and a big snapshot over a slow link must not make every hold in the meantime close it.

// Why a hold was answered unreplicated (relay_ha_holds_unreplicated_total{reason}).
const (
	unreplicatedNoStandby = "no-standby" // no standby with a complete copy was connected
	unreplicatedAckMissed = "ack-missed" // a standby did not acknowledge within the bound, or went away first
)

// sync calls done(true) once every standby with a complete copy has acknowledged every record
// queued to it before the call; done(false) at once when there is none, or once one misses the
// bound or goes away first. done is called exactly once, never with a lock of the replication
// held.
func (r *replication) sync(done func(replicated bool)) {
	r.mu.Lock()
	var feeds []*feed
	for _, f := range r.byPod {
		if f.isReady() {
			feeds = append(feeds, f)
		}
	}
	r.mu.Unlock()
	if len(feeds) == 0 {
		r.unreplicated(unreplicatedNoStandby, "")
		done(false)
		return
	}
	w := &syncWait{r: r, done: done, pending: make(map[*feed]struct{}, len(feeds))}
	w.mu.Lock()
	for _, f := range feeds {
		switch f.await(w) {
		case awaitPending:
			w.pending[f] = struct{}{}
		case awaitGone:
			w.missed, w.missedPod = true, f.pod
		}
	}
	if len(w.pending) == 0 {
		w.finished = true
		w.mu.Unlock()
		w.report()
		return
	}
	w.timer = r.cfg.clock.AfterFunc(r.cfg.ackTimeout, func() { go w.expire() }) // off the clock's goroutine
	w.mu.Unlock()
}

// syncWait is one Sync call waiting for acknowledgements.
type syncWait struct {
	r         *replication // set at construction
	done      func(bool)   // set at construction
	mu        sync.Mutex   // guards the fields below
	timer     clock.Timer  // the bound
	pending   map[*feed]struct{}
	missed    bool
	missedPod string
	finished  bool
}

// acked: f acknowledged what w waits for (missed: f went away first).
func (w *syncWait) resolved(f *feed, missed bool) {
	w.mu.Lock()
	if w.finished {
		w.mu.Unlock()
		return
	}
	if _, ok := w.pending[f]; !ok {
		w.mu.Unlock()
		return
	}
	delete(w.pending, f)
	if missed {
		w.missed, w.missedPod = true, f.pod
	}
	if len(w.pending) > 0 {
		w.mu.Unlock()
		return
	}
	w.finished = true
	if w.timer != nil {
		w.timer.Stop()
	}
	w.mu.Unlock()
	w.report()
}

// expire: the bound passed. Every standby still pending is closed, and the hold answered.
func (w *syncWait) expire() {
	w.mu.Lock()
	if w.finished {
		w.mu.Unlock()
		return
	}
	w.finished, w.missed = true, true
	var late []*feed
	for f := range w.pending {
		late = append(late, f)
		w.missedPod = f.pod
	}
	w.mu.Unlock()
	for _, f := range late {
		w.r.log.Warn().Str("pod", f.pod).Dur("wait", w.r.cfg.ackTimeout).Str("outcome", reasonOf(errAckMissed)).
			Msg("a standby did not acknowledge a hold in time: closed; it copies the whole state again when it comes back")
		f.end(errAckMissed)
	}
	w.report()
}

func (w *syncWait) report() {
	if w.missed {
		w.r.unreplicated(unreplicatedAckMissed, w.missedPod)
	}
	w.done(!w.missed)
}

// unreplicated counts and notes a hold answered before every standby had it.
func (r *replication) unreplicated(reason, pod string) {
	r.m.unreplicated.WithLabelValues(reason).Inc()
	r.mu.Lock()
	r.lastUnreplicated = &EventStatus{At: r.cfg.clock.Now().UTC().Truncate(time.Millisecond), Reason: reason, Pod: pod}
	r.mu.Unlock()
}
