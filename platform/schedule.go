package platform

import "time"

// schedule is one node's timing: when its desired state is next handed to its Corestore (now,
// or after a backoff while Corestore cannot take it) and when its backups and restores are next
// listed. It does no I/O and reads no clock: every input carries now, and the node's loops wait
// for what it answers. Not safe for concurrent use; the node guards it with its mutex.
type schedule struct {
	stateDue   time.Time // zero: nothing to hand over
	stateTries int       // hand-overs failed in a row
	listDue    time.Time // zero: not listing (detached, or no credential yet)

	// jitter is uniform in [0, n); set at construction (tests fix it).
	jitter func(n int64) int64
}

// Backoff of a failed hand-over (project-defined): full jitter below a ceiling that starts at
// stateRetryBase and doubles to stateRetryCap.
const (
	stateRetryBase = 250 * time.Millisecond
	stateRetryCap  = 30 * time.Second
)

// newState: a newer desired state waits; it is handed over at once, whatever failed before.
func (s *schedule) newState(now time.Time) {
	s.stateDue, s.stateTries = now, 0
}

// stateHanded: Corestore took the newest state.
func (s *schedule) stateHanded() {
	s.stateDue, s.stateTries = time.Time{}, 0
}

// stateFailed: Corestore could not take it; it is tried again after a backoff.
func (s *schedule) stateFailed(now time.Time) time.Duration {
	ceiling := stateRetryCap
	if s.stateTries < 20 {
		if c := stateRetryBase << s.stateTries; c < ceiling {
			ceiling = c
		}
	}
	s.stateTries++
	wait := time.Duration(s.jitter(int64(ceiling) + 1))
	s.stateDue = now.Add(wait)
	return wait
}

// listFrom: listing runs from now + first (attach, or the credential's arrival), unless a
// listing is due sooner already.
func (s *schedule) listFrom(now time.Time, first time.Duration) {
	if at := now.Add(first); s.listDue.IsZero() || at.Before(s.listDue) {
		s.listDue = at
	}
}

// listed: the next listing is every after now.
func (s *schedule) listed(now time.Time, every time.Duration) { s.listDue = now.Add(every) }

// stopListing: detached; listing waits for the next attach.
func (s *schedule) stopListing() { s.listDue = time.Time{} }

// wait is how long until due from now, and whether anything is due at all.
func wait(due, now time.Time) (time.Duration, bool) {
	if due.IsZero() {
		return 0, false
	}
	return max(due.Sub(now), 0), true
}
