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
// members² string comparisons. With the linear scan per member, 100 000 keys (under 1 MB) took
// tens of seconds; a 8 MiB frame (SPEC §2 --max-message-bytes) about half an hour of one core.
func TestReadObjectManyKeysIsNotQuadratic(t *testing.T) {
	raw := manyKeysObject(100_000, "")
	start := time.Now()
	members, err := ReadObject(raw)
	if err != nil || len(members) != 100_000 {
		t.Fatalf("ReadObject: %d members, %v", len(members), err)
	}
	if d := time.Since(start); d > 3*time.Second {
		t.Fatalf("ReadObject of %d bytes took %v: the repeated-key check is quadratic", len(raw), d)
	}
	// The check still refuses a repeat, however many members precede it.
	if _, err := ReadObject(manyKeysObject(1000, `,"a":1`)); !errors.Is(err, ErrDuplicateKey) {
		t.Fatalf("repeated key after 1000 members: err = %v, want ErrDuplicateKey", err)
	}
}
