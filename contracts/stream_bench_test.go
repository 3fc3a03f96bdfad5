package contracts

import (
	"testing"

	"code.foss.global/serve.zone/relay/contracts/strictjson"
	"code.foss.global/serve.zone/relay/testenv/frames"
)

// BenchmarkReadStreamFrameID reads a chunk frame's streamId from its request body, as Decode does
// after reading the frame.
func BenchmarkReadStreamFrameID(b *testing.B) {
	frame := frames.ChunkFrame(64<<10, false)
	var request []byte
	if _, err := strictjson.ReadObject(frame); err != nil {
		b.Fatal(err)
	}
	if err := strictjson.ReadTolerant(frame, strictjson.Req("request", &request)); err != nil {
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
	if err := strictjson.ReadTolerant([]byte(frames.SessionRequest), strictjson.Req("request", &request)); err != nil {
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
