package contracts

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

// BenchmarkReadStreamFrameID reads a chunk frame's streamId from its request body, as Decode does
// after reading the frame.
func BenchmarkReadStreamFrameID(b *testing.B) {
	frame := libraryChunkFrame(64<<10, false)
	var request []byte
	if _, err := ReadObject(frame); err != nil {
		b.Fatal(err)
	}
	if err := ReadTolerant(frame, Req("request", &request)); err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(len(request)))
	b.ReportAllocs()
	for b.Loop() {
		if _, ok := ReadStreamFrameID(request, nil); !ok {
			b.Fatal("no stream id")
		}
	}
}

// BenchmarkLookupSession reads request.session.nodeId of a typical node request, as the relay
// does for each one it forwards.
func BenchmarkLookupSession(b *testing.B) {
	var request []byte
	if err := ReadTolerant([]byte(sessionRequestFrame), Req("request", &request)); err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(len(request)))
	b.ReportAllocs()
	for b.Loop() {
		if _, ok, err := ReadSessionNodeID(request); !ok || err != nil {
			b.Fatal(err)
		}
	}
}
