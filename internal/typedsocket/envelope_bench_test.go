package typedsocket

import (
	"math/rand/v2"
	"strconv"
	"testing"
)

// chunkFrame is a VirtualStream chunk frame of n random bytes as the published TypedRequest
// library 3.3.0 writes it (the relay's contracts tests build the same frames): a browser's
// Uint8Array as {"0":104,"1":101,…}, a Node.js Buffer (buffer true) as
// {"type":"Buffer","data":[104,101,…]}.
func chunkFrame(n int, buffer bool) []byte {
	r := rand.New(rand.NewPCG(uint64(n), 1))
	b := []byte(`{"method":"##VirtualStream##","request":{"streamId":"uni_5d0c9b3e2a714f86b1e0c7d2","cycleId":"uni_` +
		strconv.FormatUint(r.Uint64(), 16) + `","cycle":"request","mainPurpose":"chunk","backpressure":false,"next":true,"chunkData":`)
	if buffer {
		b = append(b, `{"type":"Buffer","data":[`...)
	} else {
		b = append(b, '{')
	}
	for i := range n {
		if i > 0 {
			b = append(b, ',')
		}
		if !buffer {
			b = append(b, '"')
			b = strconv.AppendInt(b, int64(i), 10)
			b = append(b, `":`...)
		}
		b = strconv.AppendInt(b, int64(r.IntN(256)), 10)
	}
	if buffer {
		b = append(b, ']')
	}
	return append(b, `}},"response":null}`...)
}

// BenchmarkDecode reads the frames the relay reads most: the library's stream chunks and their
// answers, and a typical node request with its session. Compare runs of the same command
// (benchstat), never absolute times: the machine is shared.
func BenchmarkDecode(b *testing.B) {
	for _, c := range []struct {
		name  string
		frame []byte
	}{
		{"chunk-uint8array-64KiB", chunkFrame(64<<10, false)},
		{"chunk-uint8array-1MiB", chunkFrame(1<<20, false)},
		{"chunk-buffer-512KiB", chunkFrame(512<<10, true)},
		{"chunk-answer", []byte(`{"method":"##VirtualStream##","request":null,"response":{"streamId":"uni_5d0c9b3e2a714f86b1e0c7d2",` +
			`"cycleId":"uni_0f3a","cycle":"response","mainPurpose":"feedback","next":false,"backpressure":false}}`)},
		{"request-session", []byte(`{"method":"reportRuntimeHealth","request":{"session":{"nodeId":"node-07",` +
			`"controller":"cloudly","runtimeNamespace":"ns-prod-eu-1","sessionId":"uni_3f9a0c1e77d24b5a9e6c0d12",` +
			`"issuedAt":1764574800000},"health":{"status":"ok","containers":12,"uptimeMs":86400123,` +
			`"load":[0.42,0.37,0.31],"message":"all containers running \u2014 last restart 3 days ago"}},` +
			`"response":null,"correlation":{"id":"uni_8c2b5e0f1a3d4c6e9b7a0f21","phase":"request"}}`)},
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
