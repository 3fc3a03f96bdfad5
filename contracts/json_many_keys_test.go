package contracts

import (
	"errors"
	"strconv"
	"testing"
	"time"
)

// manyKeysObject is a JSON object of n distinct short keys: about 9 bytes a member, so a registered
// peer's 8 MiB frame holds close to a million of them.
func manyKeysObject(n int, extra string) []byte {
	b := []byte("{")
	for i := 0; i < n; i++ {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, '"')
		b = strconv.AppendInt(b, int64(i), 36)
		b = append(b, `":0`...)
	}
	return append(append(b, extra...), '}')
}

// TestReadObjectManyKeysIsNotQuadratic: ReadObject reads every object a peer sends (envelope
// errors, registrations, statistics pages, …), so its repeated-key check must not cost
// members² string comparisons: with a scan per member, 100 000 keys (under 1 MB) took tens of
// seconds, and a 8 MiB frame (SPEC §2 --max-message-bytes) about half an hour of one core.
// Judged by growth in the same run, not by wall time: 64 times the members costs about 64 times
// as much when linear (a little more with cache misses and the GC of a larger heap: 16 times
// the members measured up to 65 times under load) and 4 096 times when quadratic; the bound sits
// eight times from each.
func TestReadObjectManyKeysIsNotQuadratic(t *testing.T) {
	cost := func(n int) time.Duration {
		raw := manyKeysObject(n, "")
		best := time.Duration(1<<63 - 1)
		for range 3 {
			start := time.Now()
			members, err := ReadObject(raw)
			best = min(best, time.Since(start))
			if err != nil || len(members) != n {
				t.Fatalf("ReadObject of %d members: %d members, %v", n, len(members), err)
			}
		}
		return best
	}
	small, large := cost(4_000), cost(256_000)
	if growth := float64(large) / float64(small); growth > 512 {
		t.Fatalf("64× the members cost %.0f× as much (%v → %v): the repeated-key check is quadratic", growth, small, large)
	}
	// The check still refuses a repeat, however many members precede it.
	if _, err := ReadObject(manyKeysObject(1000, `,"a":1`)); !errors.Is(err, ErrDuplicateKey) {
		t.Fatalf("repeated key after 1000 members: err = %v, want ErrDuplicateKey", err)
	}
}
