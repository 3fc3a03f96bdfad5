package typedsocket

import (
	"strconv"
	"testing"
	"time"
)

// TestDecodeErrorWithManyKeysIsCheap: Decode runs on the read loop for every frame any peer sends,
// a registered node's up to --max-message-bytes (8 MiB, SPEC §2) and an anonymous one's up to
// 64 KiB. An answer whose error object carries many keys is malformed, but reading it must not
// cost members² key comparisons (contracts.ReadObject's repeated-key check): 100 000 keys, under
// 1 MB, took tens of seconds of one core, and the read loop answered nothing meanwhile.
func TestDecodeErrorWithManyKeysIsCheap(t *testing.T) {
	frame := []byte(`{"method":"m","request":{},"response":null,"correlation":{"id":"x","phase":"response"},"error":{"text":"t"`)
	for i := 0; i < 100_000; i++ {
		frame = append(frame, `,"`...)
		frame = strconv.AppendInt(frame, int64(i), 36)
		frame = append(frame, `":0`...)
	}
	frame = append(frame, "}}"...)
	start := time.Now()
	_, err := Decode(frame)
	if d := time.Since(start); d > 3*time.Second {
		t.Fatalf("Decode of a %d-byte frame took %v", len(frame), d)
	}
	if err == nil {
		t.Fatal("Decode accepted an error object with unknown keys")
	}
}
