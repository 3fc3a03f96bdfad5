package strictjson

import (
	"testing"
)

// Benchmarks of the strict JSON scanner on what the relay reads most: the library's stream chunk
// frames (a Uint8Array of 64 KiB and 1 MiB, one member per byte; a Node.js Buffer of 512 KiB, the
// chunk size of the streams benchmark), a typical envelope with a session, and a route table of
// long strings. Each runs the scanner and, as the baseline of the same run, the slow reference
// (json_ref_test.go): compare the two, never absolute times (the machine is shared).

type scanInput struct {
	name string
	raw  []byte
}

func scanInputs() []scanInput {
	return []scanInput{
		{"chunk-uint8array-64KiB", libraryChunkFrame(64<<10, false)},
		{"chunk-uint8array-1MiB", libraryChunkFrame(1<<20, false)},
		{"chunk-buffer-512KiB", libraryChunkFrame(512<<10, true)},
		{"envelope-session", []byte(sessionRequestFrame)},
		{"route-table", routeTableBody(40)},
	}
}

func BenchmarkScanner(b *testing.B) {
	for _, in := range scanInputs() {
		for _, impl := range []struct {
			name  string
			valid func([]byte) error
		}{{"reference", refValid}, {"current", Valid}} {
			b.Run(in.name+"/"+impl.name, func(b *testing.B) {
				b.SetBytes(int64(len(in.raw)))
				b.ReportAllocs()
				for b.Loop() {
					if err := impl.valid(in.raw); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}

// BenchmarkForEachMember walks the members of a frame the way typedsocket.Decode does.
func BenchmarkForEachMember(b *testing.B) {
	for _, in := range scanInputs() {
		b.Run(in.name, func(b *testing.B) {
			b.SetBytes(int64(len(in.raw)))
			b.ReportAllocs()
			for b.Loop() {
				n := 0
				if err := ForEachMember(in.raw, func(key, value []byte) error { n++; return nil }); err != nil || n == 0 {
					b.Fatal(err)
				}
			}
		})
	}
}
