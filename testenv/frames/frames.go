// Package frames makes inputs shaped like what the relay reads most — the published TypedRequest
// library's stream chunk frames, a node's request envelope, a route table of long strings — for
// the benchmarks, fuzz seeds and differential tests of contracts and contracts/strictjson, which
// test files alone could not share. Every input is made from a fixed seed: the same bytes on every
// run. It imports only the standard library.
package frames

import (
	"math/rand/v2"
	"strconv"
	"strings"
)

// Input is one named input.
type Input struct {
	Name string
	Raw  []byte
}

// Inputs are the benchmarks' inputs: a browser's chunk (a Uint8Array) of 64 KiB and of 1 MiB, a
// Node.js chunk (a Buffer) of 512 KiB, the chunk size of the streams benchmark, a typical envelope
// with a session, and a route table of 40 routes.
func Inputs() []Input {
	return []Input{
		{"chunk-uint8array-64KiB", ChunkFrame(64<<10, false)},
		{"chunk-uint8array-1MiB", ChunkFrame(1<<20, false)},
		{"chunk-buffer-512KiB", ChunkFrame(512<<10, true)},
		{"envelope-session", []byte(SessionRequest)},
		{"route-table", RouteTable(40)},
	}
}

// streamID is an id as the published TypedRequest library makes them (uni_ + 24 hex digits).
func streamID(r *rand.Rand) string {
	const hex = "0123456789abcdef"
	id := []byte("uni_")
	for range 24 {
		id = append(id, hex[r.IntN(16)])
	}
	return string(id)
}

// ChunkFrame is a VirtualStream chunk frame of n random bytes as the published TypedRequest
// library 3.3.0 writes it: JSON.stringify of { method, request: { streamId, cycleId, cycle,
// mainPurpose, backpressure, next, chunkData }, response: null }. A browser's chunk is a
// Uint8Array, which JSON.stringify writes as an object with one member per byte
// ({"0":104,"1":101,…}); a Node.js chunk is a Buffer, written {"type":"Buffer","data":[104,101,…]}
// (buffer true).
func ChunkFrame(n int, buffer bool) []byte {
	r := rand.New(rand.NewPCG(uint64(n), 1))
	b := []byte(`{"method":"##VirtualStream##","request":{"streamId":"`)
	b = append(b, streamID(r)...)
	b = append(b, `","cycleId":"`...)
	b = append(b, streamID(r)...)
	b = append(b, `","cycle":"request","mainPurpose":"chunk","backpressure":false,"next":true,"chunkData":`...)
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

// SessionRequest is a typical node → Cloudly request: a session binding and a small body.
const SessionRequest = `{"method":"reportRuntimeHealth","request":{"session":{"nodeId":"node-07",` +
	`"controller":"cloudly","runtimeNamespace":"ns-prod-eu-1","sessionId":"uni_3f9a0c1e77d24b5a9e6c0d12",` +
	`"issuedAt":1764574800000},"health":{"status":"ok","containers":12,"uptimeMs":86400123,` +
	`"load":[0.42,0.37,0.31],"message":"all containers running \u2014 last restart 3 days ago"}},` +
	`"response":null,"correlation":{"id":"uni_8c2b5e0f1a3d4c6e9b7a0f21","phase":"request"}}`

// RouteTable is a cluster route table of routes routes, each with its certificate and key in
// PEM (long strings with a \n escape every 64 characters), as Cloudly pushes it.
func RouteTable(routes int) []byte {
	r := rand.New(rand.NewPCG(uint64(routes), 2))
	const b64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
	pem := func(kind string, lines int) string {
		var s strings.Builder
		s.WriteString("-----BEGIN " + kind + "-----\\n")
		for range lines {
			for range 64 {
				s.WriteByte(b64[r.IntN(64)])
			}
			s.WriteString(`\n`)
		}
		s.WriteString("-----END " + kind + "-----\\n")
		return s.String()
	}
	b := []byte(`{"revision":42,"clusterId":"cluster-eu-1","routes":[`)
	for i := range routes {
		if i > 0 {
			b = append(b, ',')
		}
		n := strconv.Itoa(i)
		b = append(b, `{"id":"route-`+n+`","hostnames":["app-`+n+`.example.com","www.app-`+n+`.example.com"],`+
			`"target":{"service":"svc-`+n+`","namespace":"ns-prod-eu-1","port":8080,"weight":1.0},`+
			`"tls":{"certificatePem":"`+pem("CERTIFICATE", 18)+`","privateKeyPem":"`+pem("PRIVATE KEY", 2)+`"},`+
			`"headers":{"x-served-by":"relay","strict-transport-security":"max-age=31536000; includeSubDomains"}}`...)
	}
	return append(b, `]}`...)
}
