package typedsocket

import (
	"testing"
	"time"
)

// TestPaceAllowed: what a message may take, by how much of it has arrived. Time is the subject,
// and it is given, not waited for.
func TestPaceAllowed(t *testing.T) {
	p := &Pace{First: 2 * time.Second, MinRate: 32 << 10}
	for _, tc := range []struct {
		first    bool
		received int
		want     time.Duration
	}{
		{true, 0, 2 * time.Second},
		{true, 64 << 10, 2 * time.Second},   // the first message: within First, whatever its size
		{true, 8 << 20, 2 * time.Second},    // even past what the rate would allow
		{false, 0, 2 * time.Second},         // at least First
		{false, 32 << 10, 2 * time.Second},  // 1 s at the rate: First is more
		{false, 128 << 10, 4 * time.Second}, // past First, the rate
		{false, 8 << 20, 256 * time.Second}, // 8 MiB at 32 KiB/s
		{false, 8<<20 + 16<<10, 256*time.Second + 500*time.Millisecond},
	} {
		if got := p.allowed(tc.first, tc.received); got != tc.want {
			t.Errorf("allowed(first %v, %d bytes) = %s, want %s", tc.first, tc.received, got, tc.want)
		}
	}
	if got := (&Pace{MinRate: 1 << 10}).allowed(false, 0); got != time.Second {
		t.Errorf("without First a message is allowed %s at the least, want 1s", got)
	}
	if got := (&Pace{First: time.Second}).allowed(false, 1<<20); got != 0 {
		t.Errorf("without a rate only the first message is bounded; a later one allowed %s", got)
	}
}
