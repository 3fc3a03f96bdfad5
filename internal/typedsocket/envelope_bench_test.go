package typedsocket

import (
	"testing"

	"code.foss.global/serve.zone/relay/testenv/frames"
)

// BenchmarkDecode reads the frames the relay reads most: the library's stream chunks and their
// answers, and a typical node request with its session (testenv/frames). Compare runs of the
// same command (benchstat), never absolute times: the machine is shared.
func BenchmarkDecode(b *testing.B) {
	for _, c := range []struct {
		name  string
		frame []byte
	}{
		{"chunk-uint8array-64KiB", frames.ChunkFrame(64<<10, false)},
		{"chunk-uint8array-1MiB", frames.ChunkFrame(1<<20, false)},
		{"chunk-buffer-512KiB", frames.ChunkFrame(512<<10, true)},
		{"chunk-answer", []byte(`{"method":"##VirtualStream##","request":null,"response":{"streamId":"uni_5d0c9b3e2a714f86b1e0c7d2",` +
			`"cycleId":"uni_0f3a","cycle":"response","mainPurpose":"feedback","next":false,"backpressure":false}}`)},
		{"request-session", []byte(frames.SessionRequest)},
	} {
		b.Run(c.name, func(b *testing.B) {
			b.SetBytes(int64(len(c.frame)))
			b.ReportAllocs()
			for b.Loop() {
				if env, err := Decode(c.frame); err != nil || env.Method == "" {
					b.Fatal(err)
				}
			}
		})
	}
}
