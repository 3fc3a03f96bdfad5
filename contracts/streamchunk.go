package contracts

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"slices"
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
			s, _ := ReadString(value)
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
			c.Next, _ = ReadBool(value)
		case "backpressure":
			c.Backpressure, _ = ReadBool(value)
		case "keepAlive":
			c.KeepAlive, c.HasKeepAlive = ReadBool(value)
		case "chunkData":
			c.ChunkData = value
		}
		return nil
	}
	err := ForEachMemberWithin(frame, []string{"request", "response"}, inner, func(key, value []byte) error {
		var bit uint8
		switch string(key) {
		case "request":
			bit, f.RequestRaw, f.Request.Present = 1, value, KindOf(value) == KindObject
		case "response":
			bit, f.Response.Present = 2, KindOf(value) == KindObject
		case "error":
			bit = 4
			if KindOf(value) == KindObject {
				f.ErrorText = "error"
				var text []byte
				if ReadTolerant(value, Opt("text", &text)) == nil && text != nil {
					if s, err := ReadString(text); err == nil && s != "" {
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

// appendByteArray reads [104,101,…]: each element an integer 0 to 255 written plainly (no sign,
// fraction, exponent or leading zero), whitespace allowed around the commas. It is the decoder of
// every chunk a Node.js writer sends: one pass, no allocation beyond dst's growth.
func appendByteArray(dst, b []byte) ([]byte, bool, error) {
	if len(b) < 2 || b[0] != '[' || b[len(b)-1] != ']' {
		return dst, false, ErrChunkData
	}
	start, end := len(dst), len(b)-1
	out := slices.Grow(dst, end/2)
	out = out[:cap(out)]
	w := start
	i := skipSpace(b, 1)
	if i == end {
		return dst, false, nil
	}
	for {
		if i >= end || b[i] < '0' || b[i] > '9' {
			return dst[:start], false, ErrChunkData
		}
		v := uint(b[i] - '0')
		i++
		if v != 0 {
			for k := 0; k < 2 && i < end && b[i] >= '0' && b[i] <= '9'; k++ {
				v = v*10 + uint(b[i]-'0')
				i++
			}
		}
		if v > 255 || i < end && b[i] >= '0' && b[i] <= '9' {
			return dst[:start], false, ErrChunkData
		}
		if w == len(out) {
			out = append(out, 0)
			out = out[:cap(out)]
		}
		out[w] = byte(v)
		w++
		if i < end && b[i] != ',' {
			i = skipSpace(b, i)
		}
		switch {
		case i == end:
			return out[:w], false, nil
		case b[i] != ',':
			return dst[:start], false, ErrChunkData
		}
		if i++; i < end && (b[i] < '0' || b[i] > '9') {
			i = skipSpace(b, i)
		}
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

// byteText is each byte's decimal text, padded to 4 bytes, and byteLen its length.
var byteText, byteLen = func() (t [256][4]byte, n [256]uint8) {
	for i := range t {
		s := strconv.Itoa(i)
		copy(t[i][:], s)
		n[i] = uint8(len(s))
	}
	return t, n
}()

// AppendBufferChunk appends data as JSON.stringify writes a Node.js Buffer:
// {"type":"Buffer","data":[…]}.
func AppendBufferChunk(b, data []byte) []byte {
	b = append(b, `{"type":"Buffer","data":[`...)
	out := slices.Grow(b, 4*len(data)+2)
	out = out[:cap(out)]
	w := len(b)
	for i, c := range data {
		if i > 0 {
			out[w] = ','
			w++
		}
		t := &byteText[c]
		out[w], out[w+1], out[w+2] = t[0], t[1], t[2]
		w += int(byteLen[c])
	}
	out[w], out[w+1] = ']', '}'
	return out[:w+2]
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
