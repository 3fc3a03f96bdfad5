package contracts

import (
	"encoding/json"
	"errors"
	"strconv"

	"code.foss.global/serve.zone/relay/contracts/strictjson"
)

// One end of a VirtualStream (docs/protocol.md#streams and docs/platform.md), for the streams the relay itself writes and reads
// (database closures): the frames as the published TypedRequest library 3.3.0 puts them on the
// wire, and the chunk encodings it writes.
//
// The writer sends, per chunk, a request frame without envelope correlation
//
//	{"method":"##VirtualStream##","request":{"streamId","cycleId","cycle":"request","mainPurpose":"chunk","backpressure","next","chunkData"},"response":null}
//
// and waits for the reader's answer, which carries the same cycleId in its response (a chunk's
// answer sets request to null): { streamId, cycleId, cycle: "response", mainPurpose: "feedback",
// next, backpressure }. While the answer says backpressure, the writer asks again with feedback
// frames. A keepAlive frame ({ mainPurpose: "keepAlive", keepAlive: true }) goes every second from
// the writer; keepAlive: false ends the stream without its closing chunk (an abort). The last chunk
// is the string StreamClosingBit.
//
// Chunk data: a Node.js Buffer is written by JSON.stringify as {"type":"Buffer","data":[104,…]},
// a Uint8Array as {"0":104,"1":…}; the library's smartjson writes {"type":"EncodedBuffer","data":
// "base64:…"}. The relay reads all three and writes the first, as the library's Node.js peers do
// (the encodings themselves are strictjson's).

// StreamCycle is the request or response member of a stream frame, as one end of a stream reads
// it (tolerantly: other members are ignored).
type StreamCycle struct {
	Present      bool // the member is an object
	StreamID     string
	CycleID      string
	Cycle        string // request | response
	MainPurpose  string // start, chunk, read, end, feedback, keepAlive
	Next         bool
	Backpressure bool
	HasKeepAlive bool // keepAlive is a boolean member
	KeepAlive    bool
	ChunkData    json.RawMessage // a sub-slice of the frame; nil when absent
}

// StreamFrameBody is a stream frame's two cycles and whether it carries an error (a refused
// frame: text and nothing more is read).
type StreamFrameBody struct {
	Request, Response StreamCycle
	RequestRaw        json.RawMessage // the request member as sent (an answer echoes it)
	ErrorText         string          // "" without an error
}

// ErrStreamFrame is a stream frame one end cannot read.
var ErrStreamFrame = errors.New("stream frame is not readable")

// ReadStreamFrameBody reads a ##VirtualStream## frame's request, response and error members, in
// one pass over the frame (a chunk frame is mostly its chunk). A member it reads may not appear
// twice; other members are ignored.
func ReadStreamFrameBody(frame []byte) (StreamFrameBody, error) {
	var f StreamFrameBody
	var seen [2]uint16
	var top uint8
	inner := func(outer, key, value []byte) error {
		k, c := 0, &f.Request
		if string(outer) == "response" {
			k, c = 1, &f.Response
		}
		bit := cycleMemberBit(key)
		if bit == 0 {
			return nil
		}
		if seen[k]&bit != 0 {
			return ErrStreamFrame
		}
		seen[k] |= bit
		str := func() string {
			s, _ := strictjson.ReadString(value)
			return s
		}
		switch string(key) {
		case "streamId":
			c.StreamID = str()
		case "cycleId":
			c.CycleID = str()
		case "cycle":
			c.Cycle = str()
		case "mainPurpose":
			c.MainPurpose = str()
		case "next":
			c.Next, _ = strictjson.ReadBool(value)
		case "backpressure":
			c.Backpressure, _ = strictjson.ReadBool(value)
		case "keepAlive":
			c.KeepAlive, c.HasKeepAlive = strictjson.ReadBool(value)
		case "chunkData":
			c.ChunkData = value
		}
		return nil
	}
	err := strictjson.ForEachMemberWithin(frame, []string{"request", "response"}, inner, func(key, value []byte) error {
		var bit uint8
		switch string(key) {
		case "request":
			bit, f.RequestRaw, f.Request.Present = 1, value, strictjson.KindOf(value) == strictjson.KindObject
		case "response":
			bit, f.Response.Present = 2, strictjson.KindOf(value) == strictjson.KindObject
		case "error":
			bit = 4
			if strictjson.KindOf(value) == strictjson.KindObject {
				f.ErrorText = "error"
				var text []byte
				if strictjson.ReadTolerant(value, strictjson.Opt("text", &text)) == nil && text != nil {
					if s, err := strictjson.ReadString(text); err == nil && s != "" {
						f.ErrorText = s
					}
				}
			}
		default:
			return nil
		}
		if top&bit != 0 {
			return ErrStreamFrame
		}
		top |= bit
		return nil
	})
	if err != nil {
		return StreamFrameBody{}, ErrStreamFrame
	}
	if !f.Request.Present {
		f.Request = StreamCycle{}
	}
	if !f.Response.Present {
		f.Response = StreamCycle{}
	}
	return f, nil
}

func cycleMemberBit(key []byte) uint16 {
	switch string(key) {
	case "streamId":
		return 1
	case "cycleId":
		return 2
	case "cycle":
		return 4
	case "mainPurpose":
		return 8
	case "next":
		return 16
	case "backpressure":
		return 32
	case "keepAlive":
		return 64
	case "chunkData":
		return 128
	}
	return 0
}

// ErrChunkData is chunk data in none of the library's encodings.
var ErrChunkData = errors.New("stream chunk data is in no encoding the library writes")

// AppendChunkData appends the bytes of one chunk's data, in any encoding the library writes
// (strictjson.DecodeBytes), to dst. closing reports the closing chunk (then nothing is appended).
func AppendChunkData(dst []byte, raw []byte) (out []byte, closing bool, err error) {
	raw = strictjson.TrimSpace(raw)
	if strictjson.KindOf(raw) == strictjson.KindString {
		s, err := strictjson.ReadString(raw)
		if err != nil || s != StreamClosingBit {
			return dst, false, ErrChunkData
		}
		return dst, true, nil
	}
	out, err = strictjson.DecodeBytes(dst, raw)
	if err != nil {
		return dst, false, ErrChunkData
	}
	return out, false, nil
}

// AppendBufferChunk appends data as the relay writes a chunk: as JSON.stringify writes a Node.js
// Buffer, {"type":"Buffer","data":[…]}, the library's Node.js peers' encoding.
func AppendBufferChunk(b, data []byte) []byte { return strictjson.AppendNodeBuffer(b, data) }

// MaxBufferChunkLen is the longest AppendBufferChunk text of n bytes.
func MaxBufferChunkLen(n int) int { return strictjson.MaxNodeBufferLen(n) }

func appendStreamRequestHead(b []byte, streamID, cycleID, purpose string) []byte {
	b = strictjson.AppendString(append(b, `{"method":"##VirtualStream##","request":{"streamId":`...), streamID)
	b = strictjson.AppendString(append(b, `,"cycleId":`...), cycleID)
	b = strictjson.AppendString(append(b, `,"cycle":"request","mainPurpose":`...), purpose)
	return b
}

// AppendChunkFrame appends a chunk frame carrying data (a Buffer), or the closing chunk when
// closing; next says whether more chunks follow.
func AppendChunkFrame(b []byte, streamID, cycleID string, data []byte, next, closing bool) []byte {
	b = appendStreamRequestHead(b, streamID, cycleID, "chunk")
	b = append(b, `,"backpressure":false,"next":`...)
	b = strconv.AppendBool(b, next)
	b = append(b, `,"chunkData":`...)
	if closing {
		b = strictjson.AppendString(b, StreamClosingBit)
	} else {
		b = AppendBufferChunk(b, data)
	}
	return append(b, `},"response":null}`...)
}

// AppendKeepAliveFrame appends a keepAlive frame; alive false ends the stream (an abort).
func AppendKeepAliveFrame(b []byte, streamID, cycleID string, alive bool) []byte {
	b = appendStreamRequestHead(b, streamID, cycleID, "keepAlive")
	b = strconv.AppendBool(append(b, `,"keepAlive":`...), alive)
	return append(b, `},"response":null}`...)
}

// AppendFeedbackFrame appends a feedback request: the writer asking whether the reader has room.
func AppendFeedbackFrame(b []byte, streamID, cycleID string) []byte {
	b = appendStreamRequestHead(b, streamID, cycleID, "feedback")
	return append(b, `,"next":true,"backpressure":false},"response":null}`...)
}

// StreamAnswer is the reader's answer to one stream request frame.
type StreamAnswer struct {
	StreamID, CycleID string
	Purpose           string          // feedback for a chunk or a feedback request; keepAlive for a keepAlive
	Request           json.RawMessage // echoed as the library does (nil: null, as for a chunk)
	Backpressure      bool
	KeepAlive         bool // on a keepAlive answer: false ends the stream
	Refusal           *Refusal
}

// AppendStreamAnswer appends the answer frame: the library's, with an error member when the
// reader refuses the stream (Refusal set; the writer's library throws and stops).
func AppendStreamAnswer(b []byte, a StreamAnswer) []byte {
	b = append(b, `{"method":"##VirtualStream##","request":`...)
	if a.Request == nil {
		b = append(b, "null"...)
	} else {
		b = append(b, a.Request...)
	}
	b = strictjson.AppendString(append(b, `,"response":{"streamId":`...), a.StreamID)
	b = strictjson.AppendString(append(b, `,"cycleId":`...), a.CycleID)
	b = strictjson.AppendString(append(b, `,"cycle":"response","mainPurpose":`...), a.Purpose)
	if a.Purpose == "keepAlive" {
		b = strconv.AppendBool(append(b, `,"keepAlive":`...), a.KeepAlive)
	}
	b = strconv.AppendBool(append(b, `,"next":false,"backpressure":`...), a.Backpressure)
	b = append(b, '}')
	if a.Refusal != nil {
		b = strictjson.AppendString(append(b, `,"error":{"text":`...), a.Refusal.Error())
		b = append(append(b, `,"data":`...), a.Refusal.Data()...)
		b = append(b, '}')
	}
	return append(b, '}')
}
