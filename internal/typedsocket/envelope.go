package typedsocket

import (
	"encoding/json"
	"errors"
	"strconv"

	"code.foss.global/serve.zone/relay/contracts"
	"code.foss.global/serve.zone/relay/contracts/strictjson"
)

// Phase is correlation.phase.
type Phase uint8

// The two phases of a TypedRequest.
const (
	PhaseRequest Phase = iota + 1
	PhaseResponse
)

func (p Phase) String() string {
	switch p {
	case PhaseRequest:
		return "request"
	case PhaseResponse:
		return "response"
	}
	return "invalid"
}

// Envelope is one TypedRequest message (docs/protocol.md#framing-typedrequest-over-websocket). Bodies stay raw JSON: sub-slices of the frame
// they were read from, never decoded into maps or re-encoded.
type Envelope struct {
	Method   string
	ID       string          // correlation.id: each hop has its own id space; "" only on a stream frame sent without one
	Phase    Phase           // 0 only on a stream frame sent without a correlation
	Request  json.RawMessage // the request body (phase request)
	Response json.RawMessage // the answer body (phase response, no error); nil or "null" is no body
	Error    *Error          // the answer's error (phase response)
	Retry    json.RawMessage // optional retry hint of an answer, passed through raw
	StreamID string          // a stream frame's streamId (docs/protocol.md#streams)
	// RelayNodeID is the envelope member relayNodeId (project-defined) a request is written with:
	// on a node's request the relay forwards to Cloudly, the node of the connection it came on, so
	// that Cloudly knows the physical peer behind the relay's one socket. "" writes none. Decode
	// never sets it: what a peer sent is RelayNodeRaw, which no request the relay writes repeats.
	RelayNodeID string
	// RelayNodeRaw is the relayNodeId member of a request or stream frame as read, raw; nil when
	// the frame has none. A peer's own relayNodeId is never forwarded: a request is written anew,
	// and a stream frame that carries one is forwarded without it (WithoutRelayNodeID).
	RelayNodeRaw json.RawMessage
}

// IsStream reports whether the envelope is a VirtualStream frame, routed by StreamID. (A refusal
// answering a stream frame names no stream: it is an answer like any other.)
func (env *Envelope) IsStream() bool { return env.StreamID != "" }

// Error is a TypedResponseError: text and data, both passed on exactly as received. Data is nil
// when the error was sent without data, and is then sent on without it.
type Error struct {
	Text string
	Data json.RawMessage
}

func (e *Error) Error() string { return e.Text }

// Is lets errors.Is(err, contracts.RelayNodeBusy) match a remote error that names that refusal,
// in its data's code or as the leading token of its text: the relay's own refusal of an ingress
// registration names its cause in the text and the seed's code in the data, and matches both.
func (e *Error) Is(target error) bool {
	n, ok := target.(contracts.RefusalName)
	return ok && (contracts.ReadRefusalName(e.Text, e.Data) == n || contracts.ReadRefusalName(e.Text, nil) == n)
}

// Name is the refusal name the error carries, or "".
func (e *Error) Name() contracts.RefusalName { return contracts.ReadRefusalName(e.Text, e.Data) }

// ErrorFrom turns any error into the Error sent on the wire: an *Error passes through untouched,
// a protocol refusal travels as its description with the refusal as data, a named refusal as
// "<name>: <reason>" with {"code": name}. Anything else is a local fault; its text is not sent.
func ErrorFrom(err error) *Error {
	var e *Error
	var pr *contracts.ProtocolRefusal
	var r *contracts.Refusal
	switch {
	case errors.As(err, &e):
		return e
	case errors.As(err, &pr):
		return &Error{Text: pr.Error(), Data: pr.Data()}
	case errors.As(err, &r):
		return &Error{Text: r.Error(), Data: r.Data()}
	}
	return &Error{Text: "relay-internal: the relay failed to handle the request", Data: json.RawMessage("null")}
}

// MaxMethodLen and MaxIDLen bound the two strings of an envelope a receiver echoes (docs/protocol.md#framing-typedrequest-over-websocket: a
// method is any string of 1 to 256 bytes).
const (
	MaxMethodLen = 256
	MaxIDLen     = 128
)

// DecodeError is a frame that is not an envelope the relay can serve. When the frame named a
// request or answer well enough to answer or complete it, ID and Phase are set; Stream marks a
// stream frame, which never closes a connection.
type DecodeError struct {
	Method, ID string
	Phase      Phase
	Stream     bool
	Reason     string
}

func (e *DecodeError) Error() string { return "malformed envelope: " + e.Reason }

// Decode reads one envelope as the published TypedRequest library writes it (docs/protocol.md#framing-typedrequest-over-websocket). Unknown
// envelope keys (authInfo, localData, serverData, …) are ignored and never forwarded, null or not;
// a repeated key among the envelope's own members is refused. A stream frame needs no
// correlation. An answer may carry neither response nor error (no body). Decode allocates only
// the method, id and stream id strings: bodies are sub-slices of frame. It reads frame in one
// pass: a stream frame's streamId is noted while its request and response are validated, so a
// stream chunk's bytes are scanned once.
func Decode(frame []byte) (Envelope, error) {
	var env Envelope
	var method, correlation, request, response, errRaw, retry, relayNode []byte
	var seen uint8
	var reqStream, respStream contracts.StreamIDMember
	bodyMember := func(body, key, value []byte) error {
		if string(body) == "request" {
			return reqStream.Member(key, value)
		}
		return respStream.Member(key, value)
	}
	err := strictjson.ForEachMemberWithin(frame, envelopeBodies, bodyMember, func(key, value []byte) error {
		var bit uint8
		switch string(key) {
		case "method":
			method, bit = value, 1
		case "correlation":
			correlation, bit = value, 2
		case "request":
			request, bit = value, 4
		case "response":
			response, bit = value, 8
		case "error":
			errRaw, bit = value, 16
		case "retry":
			retry, bit = value, 32
		case RelayNodeIDMember:
			// Read, never judged: a peer's relayNodeId is dropped, so a repeated one refuses nothing.
			relayNode = value
			return nil
		default:
			return nil
		}
		if seen&bit != 0 {
			return strictjson.ErrDuplicateKey
		}
		seen |= bit
		return nil
	})
	if err != nil {
		return Envelope{}, &DecodeError{Reason: "not a JSON object with distinct keys: " + err.Error()}
	}
	env.RelayNodeRaw = relayNode
	m, err := strictjson.ReadString(method)
	methodOK := err == nil && m != "" && len(m) <= MaxMethodLen
	if methodOK {
		env.Method = m
	}
	id, phase, corrOK := readCorrelation(correlation)
	if corrOK {
		env.ID, env.Phase = id, phase
	}
	bad := func(reason string) (Envelope, error) {
		return Envelope{}, &DecodeError{Method: env.Method, ID: env.ID, Phase: env.Phase, Stream: env.Method == contracts.MethodVirtualStream, Reason: reason}
	}
	if env.Method == contracts.MethodVirtualStream {
		// The library's stream frames carry no correlation and keep phase "request" in their
		// answers; they are routed by streamId alone and forwarded whole. A frame naming no
		// stream is either a refusal answering a stream frame sent with a correlation (phase
		// response: read as any answer) or one nobody can route.
		id, ok := contracts.StreamFrameID(reqStream, respStream)
		switch {
		case ok:
			env.StreamID, env.Request, env.Response = id, request, response
			return env, nil
		case !corrOK || env.Phase == PhaseRequest:
			return bad("a stream frame must name its streamId")
		}
	}
	if !corrOK {
		return Envelope{}, &DecodeError{Method: env.Method, Reason: "correlation must carry an id of 1 to 128 bytes and a phase"}
	}
	if !methodOK {
		return bad("method must be a string of 1 to 256 bytes")
	}
	if env.Phase == PhaseRequest {
		if strictjson.KindOf(request) != strictjson.KindObject {
			return bad("request must be an object")
		}
		env.Request = request
		return env, nil
	}
	env.RelayNodeRaw = nil // an answer's is nobody's concern
	if errRaw != nil && !strictjson.IsNull(errRaw) {
		var textRaw, data []byte
		if strictjson.ReadTolerant(errRaw, strictjson.Req("text", &textRaw), strictjson.Opt("data", &data)) != nil {
			return bad("error must be an object with one text")
		}
		t, err := strictjson.ReadString(textRaw)
		if err != nil {
			return bad("error text must be a string")
		}
		env.Error = &Error{Text: t, Data: data}
	} else if response != nil {
		env.Response = response // any JSON value, passed on untouched
	}
	if retry != nil && !strictjson.IsNull(retry) {
		env.Retry = retry
	}
	return env, nil
}

// envelopeBodies are the members whose own members Decode reads (a stream frame's streamId).
var envelopeBodies = []string{"request", "response"}

// readCorrelation reads { id, phase } (other members ignored). ok is false when the id is not a
// string of 1 to MaxIDLen bytes or the phase is neither request nor response.
func readCorrelation(raw []byte) (id string, phase Phase, ok bool) {
	if raw == nil {
		return "", 0, false
	}
	var idRaw, phaseRaw []byte
	if strictjson.ReadTolerant(raw, strictjson.Req("id", &idRaw), strictjson.Req("phase", &phaseRaw)) != nil {
		return "", 0, false
	}
	id, err := strictjson.ReadString(idRaw)
	if err != nil || id == "" || len(id) > MaxIDLen {
		return "", 0, false
	}
	switch p, _ := strictjson.ReadString(phaseRaw); p {
	case "request":
		return id, PhaseRequest, true
	case "response":
		return id, PhaseResponse, true
	}
	return "", 0, false
}

// Append appends the envelope's wire form to dst. Bodies are copied byte for byte.
func (env *Envelope) Append(dst []byte) []byte {
	dst = append(dst, `{"method":`...)
	dst = strictjson.AppendString(dst, env.Method)
	if env.Phase == PhaseRequest {
		if env.RelayNodeID != "" {
			dst = append(dst, `,"relayNodeId":`...)
			dst = strictjson.AppendString(dst, env.RelayNodeID)
		}
		dst = append(dst, `,"request":`...)
		dst = appendRaw(dst, env.Request, "{}")
		dst = append(dst, `,"response":null,"correlation":{"id":`...)
		dst = strictjson.AppendString(dst, env.ID)
		return append(dst, `,"phase":"request"}}`...)
	}
	dst = append(dst, `,"request":{},"response":`...)
	if env.Error != nil {
		dst = append(dst, "null"...)
	} else {
		dst = appendRaw(dst, env.Response, "null")
	}
	dst = append(dst, `,"correlation":{"id":`...)
	dst = strictjson.AppendString(dst, env.ID)
	dst = append(dst, `,"phase":"response"}`...)
	if env.Error != nil {
		dst = append(dst, `,"error":{"text":`...)
		dst = strictjson.AppendString(dst, env.Error.Text)
		if env.Error.Data != nil {
			dst = append(dst, `,"data":`...)
			dst = append(dst, env.Error.Data...)
		}
		dst = append(dst, '}')
	}
	if env.Retry != nil {
		dst = append(dst, `,"retry":`...)
		dst = append(dst, env.Retry...)
	}
	return append(dst, '}')
}

func appendRaw(dst, raw []byte, empty string) []byte {
	if len(raw) == 0 {
		return append(dst, empty...)
	}
	return append(dst, raw...)
}

// Size is an upper bound of len(env.Append(nil)) used to size buffers.
func (env *Envelope) Size() int {
	n := 128 + len(env.Method) + len(env.ID) + len(env.Request) + len(env.Response) + len(env.Retry)
	if env.RelayNodeID != "" {
		n += len(`,"relayNodeId":""`) + 2*len(env.RelayNodeID)
	}
	if env.Error != nil {
		n += 2*len(env.Error.Text) + len(env.Error.Data) + 32
	}
	return n
}

// RelayNodeIDMember is the envelope member that states, on a node's request the relay forwards to
// Cloudly, the node of the connection it came on (project-defined).
const RelayNodeIDMember = "relayNodeId"

// WithoutRelayNodeID is frame, a JSON object Decode has read, without its top-level relayNodeId
// members: a node's stream frame is forwarded whole, except that a node cannot name a node in the
// member the relay alone writes. Every other member keeps its bytes and its order. frame itself is
// returned when it has no such member or cannot be read.
func WithoutRelayNodeID(frame []byte) []byte {
	out := make([]byte, 0, len(frame))
	out = append(out, '{')
	found := false
	err := strictjson.ForEachMember(frame, func(key, value []byte) error {
		if string(key) == RelayNodeIDMember {
			found = true
			return nil
		}
		if len(out) > 1 {
			out = append(out, ',')
		}
		out = strictjson.AppendString(out, string(key))
		out = append(out, ':')
		out = append(out, value...)
		return nil
	})
	if err != nil || !found {
		return frame
	}
	return append(out, '}')
}

func formatID(n uint64) string { return strconv.FormatUint(n, 36) }
