package strictjson

import (
	"errors"
	"strconv"
	"testing"
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

// ReadObject reads every object a peer sends (envelope errors, registrations, statistics pages,
// …), so its repeated-key check must not cost members² string comparisons: with a scan per
// member, 100 000 keys (under 1 MB) took tens of seconds, and an 8 MiB frame (the registered
// message limit) about half an hour of one core. Cost is measured in BenchmarkReadObjectManyKeys
// (ns per member at 4 000 and 256 000 members: flat when linear, 64 times higher when quadratic);
// the test checks what the check decides, at every size.

// TestReadObjectManyKeys: every member of a large object is read, and a repeat is refused
// however many members precede it.
func TestReadObjectManyKeys(t *testing.T) {
	for _, n := range []int{1_000, 256_000} {
		members, err := ReadObject(manyKeysObject(n, ""))
		if err != nil || len(members) != n {
			t.Fatalf("ReadObject of %d members: %d members, %v", n, len(members), err)
		}
		if _, err := ReadObject(manyKeysObject(n, `,"a":1`)); !errors.Is(err, ErrDuplicateKey) {
			t.Fatalf("repeated key after %d members: err = %v, want ErrDuplicateKey", n, err)
		}
	}
}

// BenchmarkReadObjectManyKeys reports ReadObject's cost per member at two sizes 64 times apart:
// compare the two ns/member figures (benchstat) — about equal when linear.
func BenchmarkReadObjectManyKeys(b *testing.B) {
	for _, n := range []int{4_000, 256_000} {
		raw := manyKeysObject(n, "")
		b.Run(strconv.Itoa(n), func(b *testing.B) {
			b.SetBytes(int64(len(raw)))
			for b.Loop() {
				if _, err := ReadObject(raw); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(n), "ns/member")
		})
	}
}
