package contracts

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"strconv"
)

// One end of a VirtualStream (SPEC §5.1, §17), for the streams the relay itself writes and reads
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
// "base64:…"}. The relay reads all three and writes the first, as the library's Node.js peers do.

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

// ReadStreamFrameBody reads a ##VirtualStream## frame's request, response and error members.
func ReadStreamFrameBody(frame []byte) (StreamFrameBody, error) {
	var req, resp, errv []byte
	if ReadTolerant(frame, Opt("request", &req), Opt("response", &resp), Opt("error", &errv)) != nil {
		return StreamFrameBody{}, ErrStreamFrame
	}
	var f StreamFrameBody
	var err error
	if f.Request, err = readStreamCycle(req); err != nil {
		return StreamFrameBody{}, err
	}
	if f.Response, err = readStreamCycle(resp); err != nil {
		return StreamFrameBody{}, err
	}
	f.RequestRaw = req
	if KindOf(errv) == KindObject {
		var text []byte
		f.ErrorText = "error"
		if ReadTolerant(errv, Opt("text", &text)) == nil && text != nil {
			if s, err := ReadString(text); err == nil && s != "" {
				f.ErrorText = s
			}
		}
	}
	return f, nil
}

func readStreamCycle(raw []byte) (StreamCycle, error) {
	if raw == nil || KindOf(raw) != KindObject {
		return StreamCycle{}, nil
	}
	var id, cycleID, cycle, purpose, next, bp, alive, chunk []byte
	if ReadTolerant(raw, Opt("streamId", &id), Opt("cycleId", &cycleID), Opt("cycle", &cycle), Opt("mainPurpose", &purpose),
		Opt("next", &next), Opt("backpressure", &bp), Opt("keepAlive", &alive), Opt("chunkData", &chunk)) != nil {
		return StreamCycle{}, ErrStreamFrame
	}
	c := StreamCycle{Present: true, ChunkData: chunk}
	str := func(v []byte) string {
		if v == nil {
			return ""
		}
		s, _ := ReadString(v)
		return s
	}
	c.StreamID, c.CycleID, c.Cycle, c.MainPurpose = str(id), str(cycleID), str(cycle), str(purpose)
	c.Next, _ = ReadBool(next)
	c.Backpressure, _ = ReadBool(bp)
	c.KeepAlive, c.HasKeepAlive = ReadBool(alive)
	return c, nil
}

// ErrChunkData is chunk data in none of the library's encodings.
var ErrChunkData = errors.New("stream chunk data is in no encoding the library writes")

// AppendChunkData appends the bytes of one chunk's data, in any encoding the library writes, to
// dst. closing reports the closing chunk (then nothing is appended).
func AppendChunkData(dst []byte, raw []byte) (out []byte, closing bool, err error) {
	raw = trimSpace(raw)
	switch KindOf(raw) {
	case KindString:
		s, err := ReadString(raw)
		if err != nil || s != StreamClosingBit {
			return dst, false, ErrChunkData
		}
		return dst, true, nil
	case KindArray:
		return appendByteArray(dst, raw)
	case KindObject:
	default:
		return dst, false, ErrChunkData
	}
	var typ, data []byte
	if ReadTolerant(raw, Opt("type", &typ), Opt("data", &data)) != nil {
		return dst, false, ErrChunkData
	}
	switch t, _ := ReadString(typ); {
	case typ != nil && t == "Buffer" && data != nil:
		return appendByteArray(dst, trimSpace(data))
	case typ != nil && t == "EncodedBuffer" && data != nil:
		s, err := ReadString(data)
		b64, ok := cutPrefix(s, "base64:")
		if err != nil || !ok {
			return dst, false, ErrChunkData
		}
		n := base64.StdEncoding.DecodedLen(len(b64))
		out := append(dst, make([]byte, n)...)
		m, err := base64.StdEncoding.Decode(out[len(dst):], []byte(b64))
		if err != nil {
			return dst, false, ErrChunkData
		}
		return out[:len(dst)+m], false, nil
	}
	return appendIndexedBytes(dst, raw)
}

func cutPrefix(s, prefix string) (string, bool) {
	if len(s) >= len(prefix) && s[:len(prefix)] == prefix {
		return s[len(prefix):], true
	}
	return s, false
}

// appendByteArray reads [104,101,…]: each element an integer 0 to 255 written plainly.
func appendByteArray(dst, b []byte) ([]byte, bool, error) {
	if len(b) < 2 || b[0] != '[' || b[len(b)-1] != ']' {
		return dst, false, ErrChunkData
	}
	start := len(dst)
	i := skipSpace(b, 1)
	if i == len(b)-1 {
		return dst, false, nil
	}
	for {
		v, j, ok := readByteValue(b, i)
		if !ok {
			return dst[:start], false, ErrChunkData
		}
		dst = append(dst, v)
		i = skipSpace(b, j)
		switch {
		case i == len(b)-1:
			return dst, false, nil
		case b[i] != ',':
			return dst[:start], false, ErrChunkData
		}
		i = skipSpace(b, i+1)
	}
}

// readByteValue reads one decimal 0 to 255 at b[i] (no sign, fraction, exponent or leading zero).
func readByteValue(b []byte, i int) (byte, int, bool) {
	v, j := 0, i
	for j < len(b) && j-i < 4 && b[j] >= '0' && b[j] <= '9' {
		v = v*10 + int(b[j]-'0')
		j++
	}
	n := j - i
	if n == 0 || n > 3 || v > 255 || n > 1 && b[i] == '0' {
		return 0, i, false
	}
	return byte(v), j, true
}

// appendIndexedBytes reads a Uint8Array's JSON form {"0":104,"1":101,…}: keys 0 to n-1, in order.
func appendIndexedBytes(dst, raw []byte) ([]byte, bool, error) {
	start := len(dst)
	next := 0
	err := ForEachMember(raw, func(key, value []byte) error {
		if string(key) != strconv.Itoa(next) {
			return ErrChunkData
		}
		v, j, ok := readByteValue(value, 0)
		if !ok || j != len(value) {
			return ErrChunkData
		}
		dst = append(dst, v)
		next++
		return nil
	})
	if err != nil {
		return dst[:start], false, ErrChunkData
	}
	return dst, false, nil
}

// byteDecimal is each byte's decimal text.
var byteDecimal = func() (t [256]string) {
	for i := range t {
		t[i] = strconv.Itoa(i)
	}
	return t
}()

// AppendBufferChunk appends data as JSON.stringify writes a Node.js Buffer:
// {"type":"Buffer","data":[…]}.
func AppendBufferChunk(b, data []byte) []byte {
	b = append(b, `{"type":"Buffer","data":[`...)
	for i, c := range data {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, byteDecimal[c]...)
	}
	return append(b, "]}"...)
}

// MaxBufferChunkLen is the longest AppendBufferChunk text of n bytes.
func MaxBufferChunkLen(n int) int { return 28 + 4*n }

func appendStreamRequestHead(b []byte, streamID, cycleID, purpose string) []byte {
	b = AppendString(append(b, `{"method":"##VirtualStream##","request":{"streamId":`...), streamID)
	b = AppendString(append(b, `,"cycleId":`...), cycleID)
	b = AppendString(append(b, `,"cycle":"request","mainPurpose":`...), purpose)
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
		b = AppendString(b, StreamClosingBit)
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
	b = AppendString(append(b, `,"response":{"streamId":`...), a.StreamID)
	b = AppendString(append(b, `,"cycleId":`...), a.CycleID)
	b = AppendString(append(b, `,"cycle":"response","mainPurpose":`...), a.Purpose)
	if a.Purpose == "keepAlive" {
		b = strconv.AppendBool(append(b, `,"keepAlive":`...), a.KeepAlive)
	}
	b = strconv.AppendBool(append(b, `,"next":false,"backpressure":`...), a.Backpressure)
	b = append(b, '}')
	if a.Refusal != nil {
		b = AppendString(append(b, `,"error":{"text":`...), a.Refusal.Error())
		b = append(append(b, `,"data":`...), a.Refusal.Data()...)
		b = append(b, '}')
	}
	return append(b, '}')
}
