package contracts

import (
	"math/rand/v2"
	"strconv"
	"strings"
)

// Inputs shaped like what the relay reads most, for the stream readers' benchmarks and fuzz seeds:
// the same inputs strictjson's scanner benchmarks read (its json_frames_test.go; test files cannot
// be shared across packages).

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

// libraryStreamID is an id as the published TypedRequest library makes them (uni_ + 24 hex digits).
func libraryStreamID(r *rand.Rand) string {
	const hex = "0123456789abcdef"
	id := []byte("uni_")
	for range 24 {
		id = append(id, hex[r.IntN(16)])
	}
	return string(id)
}

// libraryChunkFrame is a VirtualStream chunk frame of n random bytes as the published TypedRequest
// library 3.3.0 writes it: JSON.stringify of { method, request: { streamId, cycleId, cycle,
// mainPurpose, backpressure, next, chunkData }, response: null }. A browser's chunk is a
// Uint8Array, which JSON.stringify writes as an object with one member per byte
// ({"0":104,"1":101,…}); a Node.js chunk is a Buffer, written {"type":"Buffer","data":[104,101,…]}
// (buffer true).
func libraryChunkFrame(n int, buffer bool) []byte {
	r := rand.New(rand.NewPCG(uint64(n), 1))
	b := []byte(`{"method":"##VirtualStream##","request":{"streamId":"`)
	b = append(b, libraryStreamID(r)...)
	b = append(b, `","cycleId":"`...)
	b = append(b, libraryStreamID(r)...)
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

// sessionRequestFrame is a typical node → Cloudly request: a session binding and a small body.
const sessionRequestFrame = `{"method":"reportRuntimeHealth","request":{"session":{"nodeId":"node-07",` +
	`"controller":"cloudly","runtimeNamespace":"ns-prod-eu-1","sessionId":"uni_3f9a0c1e77d24b5a9e6c0d12",` +
	`"issuedAt":1764574800000},"health":{"status":"ok","containers":12,"uptimeMs":86400123,` +
	`"load":[0.42,0.37,0.31],"message":"all containers running \u2014 last restart 3 days ago"}},` +
	`"response":null,"correlation":{"id":"uni_8c2b5e0f1a3d4c6e9b7a0f21","phase":"request"}}`

// routeTableBody is a cluster route table of routes routes, each with its certificate and key in
// PEM (long strings with a \n escape every 64 characters), as Cloudly pushes it.
func routeTableBody(routes int) []byte {
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
