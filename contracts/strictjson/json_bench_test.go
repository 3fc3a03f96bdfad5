package strictjson

import (
	"testing"

	"code.foss.global/serve.zone/relay/testenv/frames"
)

// Benchmarks of the strict JSON scanner on what the relay reads most: the library's stream chunk
// frames (a Uint8Array of 64 KiB and 1 MiB, one member per byte; a Node.js Buffer of 512 KiB, the
// chunk size of the streams benchmark), a typical envelope with a session, and a route table of
// long strings. Each runs the scanner and, as the baseline of the same run, the slow reference
// (json_ref_test.go): compare the two, never absolute times (the machine is shared). The inputs
// are testenv/frames', which contracts' stream benchmarks read too.

func BenchmarkScanner(b *testing.B) {
	for _, in := range frames.Inputs() {
		for _, impl := range []struct {
			name  string
			valid func([]byte) error
		}{{"reference", refValid}, {"current", Valid}} {
			b.Run(in.Name+"/"+impl.name, func(b *testing.B) {
				b.SetBytes(int64(len(in.Raw)))
				b.ReportAllocs()
				for b.Loop() {
					if err := impl.valid(in.Raw); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}

// BenchmarkForEachMember walks the members of a frame the way typedsocket.Decode does.
func BenchmarkForEachMember(b *testing.B) {
	for _, in := range frames.Inputs() {
		b.Run(in.Name, func(b *testing.B) {
			b.SetBytes(int64(len(in.Raw)))
			b.ReportAllocs()
			for b.Loop() {
				n := 0
				if err := ForEachMember(in.Raw, func(key, value []byte) error { n++; return nil }); err != nil || n == 0 {
					b.Fatal(err)
				}
			}
		})
	}
}
