package vpnhub

import (
	"sync/atomic"
	"testing"
	"time"
)

// countingClock is the wall clock that counts the timers the hub schedules.
type countingClock struct{ timers atomic.Int64 }

func (c *countingClock) Now() time.Time { return time.Now() }
func (c *countingClock) AfterFunc(d time.Duration, f func()) Timer {
	c.timers.Add(1)
	return time.AfterFunc(d, f)
}

// A member whose expiresAt is far in the future (9999-12-31T23:59:59.999Z, a common "never"
// sentinel, and a non-negative safe integer ReadVPNMembershipPush accepts) must not make the
// expiry timer fire again and again: SPEC §7 closes a member's session when it passes expiresAt,
// not before, and the hub must not spin meanwhile.
func TestFarFutureExpiryDoesNotSpinTheExpiryTimer(t *testing.T) {
	clock := &countingClock{}
	th := startHub(t, func(c *Config) { c.Clock = clock })
	k := testKey(t, 2)
	m := testMember(k, "node-a", 2)
	m.ExpiresAt = 253402300799999 // 9999-12-31T23:59:59.999Z
	th.push(t, 1, m)
	c := th.mustDial(t, k, "node-a")
	before := clock.timers.Load()
	time.Sleep(300 * time.Millisecond)
	if n := clock.timers.Load() - before; n > 2 {
		t.Fatalf("the hub scheduled %d expiry timers in 300 ms for one member expiring in the year 9999", n)
	}
	select {
	case <-c.Done():
		t.Fatalf("session ended: %v", c.Err())
	default:
	}
}
