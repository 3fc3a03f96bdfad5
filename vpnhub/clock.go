package vpnhub

import "time"

// Clock is the hub's time source: member expiry and silent sessions are judged and scheduled with
// it. Tests inject a fake; nil means the wall clock.
type Clock interface {
	Now() time.Time
	// AfterFunc calls f in its own goroutine once d has passed.
	AfterFunc(d time.Duration, f func()) Timer
}

// Timer is a scheduled call that can be stopped.
type Timer interface {
	Stop() bool
}

type wallClock struct{}

func (wallClock) Now() time.Time                            { return time.Now() }
func (wallClock) AfterFunc(d time.Duration, f func()) Timer { return time.AfterFunc(d, f) }
