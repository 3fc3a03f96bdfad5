// Package await is the tests' one way to wait for a state that no event announces: a metric, a
// count kept by another process, a file. It polls; tests that have an event wait on it instead.
package await

import (
	"testing"
	"time"
)

// Until polls cond until it holds, or fails tb after timeout, naming what it waited for. The
// polls start a millisecond apart and double to at most 20 ms, so that a state reached at once
// costs nothing and a slow one costs little CPU.
func Until(tb testing.TB, what string, timeout time.Duration, cond func() bool) {
	tb.Helper()
	if !Within(timeout, cond) {
		tb.Fatalf("timed out after %s waiting for %s", timeout, what)
	}
}

// Within polls cond as Until does and reports whether it held before timeout.
func Within(timeout time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(timeout)
	for pause := time.Millisecond; !cond(); pause = min(2*pause, 20*time.Millisecond) {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(pause) // the poll: the state this waits for announces itself to no one
	}
	return true
}
