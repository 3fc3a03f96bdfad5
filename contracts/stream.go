package contracts

import (
	"bytes"

	"code.foss.global/serve.zone/relay/contracts/strictjson"
)

// Streams (docs/protocol.md#streams; seed-named, shaped by the published TypedRequest library 3.3.0). A stream
// travels inside a request or answer body as the marker { "_isVirtualStream": true, "streamId" }
// at any depth; its own traffic is frames with method MethodVirtualStream whose request (or, in a
// chunk's answer, whose response) carries streamId. The library correlates a stream's cycles
// itself (cycleId), sends stream frames without an envelope correlation and answers them without
// switching phase, and ends a stream with a chunk whose data is StreamClosingBit.
const (
	MethodVirtualStream = "##VirtualStream##"
	StreamClosingBit    = "#############CLOSING BIT#############"
	// MaxStreamIDLen bounds a streamId the relay keeps (project-defined): the library's ids are
	// short unique strings.
	MaxStreamIDLen = 256
)

var (
	streamMarkerKey  = []byte(`"_isVirtualStream"`)
	streamClosingBit = []byte(`"` + StreamClosingBit + `"`)
)

// HasStreamMarker is the cheap test before FindStreamMarkers: whether body may hold a marker. A
// body without the marker's key spelled plainly holds none the relay binds.
func HasStreamMarker(body []byte) bool { return containsQuoted(body, streamMarkerKey) }

// IsStreamClosing reports whether a stream frame carries the library's closing chunk.
func IsStreamClosing(frame []byte) bool { return containsQuoted(frame, streamClosingBit) }

// containsQuoted is bytes.Contains(b, quoted) for a needle that starts with a quote. It searches
// for the needle without that quote, then checks the quote: bytes.Index, after a few false starts
// on a needle's first byte, compares at every offset, and JSON is mostly false starts for a quote
// (a stream chunk has one every few bytes), while the needles' next bytes ('_', '#') are rare.
func containsQuoted(b, quoted []byte) bool {
	tail := quoted[1:]
	for i := 0; ; {
		j := bytes.Index(b[i:], tail)
		if j < 0 {
			return false
		}
		if i += j; i > 0 && b[i-1] == '"' {
			return true
		}
		i++
	}
}

// FindStreamMarkers calls fn with the streamId of every stream marker in body: an object, at any
// depth, whose "_isVirtualStream" member is true and whose "streamId" member is a string of 1 to
// MaxStreamIDLen bytes. Other members of a marker are ignored. It reads body in one pass and
// allocates only the ids it reports; an error from fn stops the walk and is returned, as is a
// syntax error in body.
func FindStreamMarkers(body []byte, fn func(streamID string) error) error {
	if !HasStreamMarker(body) {
		return nil
	}
	i := strictjson.SkipSpace(body, 0)
	end, err := walkMarkers(body, i, 0, fn)
	if err != nil {
		return err
	}
	return strictjson.Trailing(body, end)
}

// walkMarkers reads the value at b[i], reporting the markers inside it, and returns the offset
// just after it. Every byte is read once: scalars are scanned, composites walked.
func walkMarkers(b []byte, i, depth int, fn func(string) error) (int, error) {
	if i >= len(b) {
		return i, &strictjson.SyntaxError{Offset: i, Msg: "unexpected end of input"}
	}
	switch b[i] {
	case '{', '[':
	default:
		return strictjson.ScanValue(b, i, depth)
	}
	if depth >= strictjson.MaxJSONDepth {
		return i, &strictjson.SyntaxError{Offset: i, Msg: "nesting too deep"}
	}
	closer := byte(']')
	if b[i] == '{' {
		closer = '}'
	}
	var marked, hasID bool
	var id []byte
	i = strictjson.SkipSpace(b, i+1)
	if i < len(b) && b[i] == closer {
		return i + 1, nil
	}
	for {
		var key []byte
		if closer == '}' {
			keyEnd, err := strictjson.ScanString(b, i)
			if err != nil {
				return keyEnd, err
			}
			key = strictjson.DecodeScannedString(b[i:keyEnd]) // no copy unless escaped
			i = strictjson.SkipSpace(b, keyEnd)
			if i >= len(b) || b[i] != ':' {
				return i, &strictjson.SyntaxError{Offset: i, Msg: "expected : after object key"}
			}
			i = strictjson.SkipSpace(b, i+1)
		}
		start := i
		end, err := walkMarkers(b, i, depth+1, fn)
		if err != nil {
			return end, err
		}
		switch {
		case closer != '}':
		case string(key) == "_isVirtualStream":
			marked = string(b[start:end]) == "true"
		case string(key) == "streamId":
			id, hasID = nil, false
			if b[start] == '"' {
				id, hasID = strictjson.DecodeScannedString(b[start:end]), true
			}
		}
		i = strictjson.SkipSpace(b, end)
		if i >= len(b) {
			return i, &strictjson.SyntaxError{Offset: i, Msg: "unterminated object or array"}
		}
		if b[i] == closer {
			if marked && hasID && len(id) > 0 && len(id) <= MaxStreamIDLen {
				if err := fn(string(id)); err != nil {
					return i, err
				}
			}
			return i + 1, nil
		}
		if b[i] != ',' {
			return i, &strictjson.SyntaxError{Offset: i, Msg: "expected , or " + string(closer)}
		}
		i = strictjson.SkipSpace(b, i+1)
	}
}

// ReadStreamFrameID reads the streamId a stream frame names: request.streamId, else (a chunk's
// answer, whose request the library sets to null) response.streamId. ok is false when neither
// holds a string of 1 to MaxStreamIDLen bytes.
func ReadStreamFrameID(request, response []byte) (streamID string, ok bool) {
	var ids [2]StreamIDMember
	for k, body := range [2][]byte{request, response} {
		if strictjson.KindOf(body) == strictjson.KindObject && strictjson.ForEachMember(body, ids[k].Member) != nil {
			ids[k] = StreamIDMember{} // a body that is not JSON names no stream
		}
	}
	return StreamFrameID(ids[0], ids[1])
}

// StreamIDMember collects the streamId members of one body of a stream frame while a reader walks
// its members (Member is the walk's function), so that a reader of the whole frame finds the
// stream without a second pass over the body (ForEachMemberWithin).
type StreamIDMember struct {
	value []byte
	n     int
}

// Member notes key and value when key is streamId.
func (s *StreamIDMember) Member(key, value []byte) error {
	if string(key) == "streamId" {
		s.value = value
		s.n++
	}
	return nil
}

// StreamFrameID is ReadStreamFrameID of the members collected from a frame's request and
// response: the request's streamId, else the response's, each a string of 1 to MaxStreamIDLen
// bytes that its body holds once (a repeated streamId names no stream).
func StreamFrameID(request, response StreamIDMember) (streamID string, ok bool) {
	for _, m := range [2]StreamIDMember{request, response} {
		if m.n != 1 {
			continue
		}
		if id, err := strictjson.ReadString(m.value); err == nil && id != "" && len(id) <= MaxStreamIDLen {
			return id, true
		}
	}
	return "", false
}
