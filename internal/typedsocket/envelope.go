package typedsocket

import (
	"encoding/json"
	"errors"
	"strconv"

	"code.foss.global/serve.zone/relay/contracts"
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

// Envelope is one TypedRequest message (SPEC §2). Bodies stay raw JSON: sub-slices of the frame
// they were read from, never decoded into maps or re-encoded.
type Envelope struct {
	Method   string
	ID       string // correlation.id: each hop has its own id space
	Phase    Phase
	Request  json.RawMessage // the request body (phase request)
	Response json.RawMessage // the answer body (phase response, no error); "null" is a body
	Error    *Error          // the answer's error (phase response)
	Retry    json.RawMessage // optional retry hint of an answer, passed through raw
}

// Error is a TypedResponseError: text and data, both passed on exactly as received.
type Error struct {
	Text string
	Data json.RawMessage
}

func (e *Error) Error() string { return e.Text }

// Is lets errors.Is(err, contracts.RelayNodeBusy) match a remote error that names that refusal,
// in its data's code or as the leading token of its text.
func (e *Error) Is(target error) bool {
	n, ok := target.(contracts.RefusalName)
	return ok && contracts.ReadRefusalName(e.Text, e.Data) == n
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

// MaxMethodLen and MaxIDLen bound the two strings of an envelope a receiver echoes.
const (
	MaxMethodLen = 128
	MaxIDLen     = 128
)

// DecodeError is a frame that is not an envelope. When the frame named a request well enough to
// answer it, Method and ID are set.
type DecodeError struct {
	Method, ID string
	Phase      Phase
	Reason     string
}

func (e *DecodeError) Error() string { return "malformed envelope: " + e.Reason }

// Decode reads one envelope. Unknown envelope keys (authInfo, localData, serverData, …) are
// ignored and never forwarded; a repeated key among the envelope's own members is refused. Decode
// allocates only the method and id strings: bodies are sub-slices of frame.
func Decode(frame []byte) (Envelope, error) {
	var env Envelope
	var method, correlation, request, response, errRaw, retry []byte
	var seen uint8
	err := contracts.ForEachMember(frame, func(key, value []byte) error {
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
		default:
			return nil
		}
		if seen&bit != 0 {
			return contracts.ErrDuplicateKey
		}
		seen |= bit
		return nil
	})
	if err != nil {
		return Envelope{}, &DecodeError{Reason: "not a JSON object with distinct keys: " + err.Error()}
	}
	if env.Method, err = contracts.ReadString(method); err != nil || !isMethod(env.Method) {
		return Envelope{}, &DecodeError{Reason: "method must be a method name"}
	}
	var id, phase []byte
	var ids, phases, others int
	err = contracts.ForEachMember(correlation, func(key, value []byte) error {
		switch string(key) {
		case "id":
			id, ids = value, ids+1
		case "phase":
			phase, phases = value, phases+1
		default:
			others++
		}
		return nil
	})
	if err != nil || ids != 1 || phases != 1 || others != 0 {
		return Envelope{}, &DecodeError{Method: env.Method, Reason: "correlation must be { id, phase }"}
	}
	if env.ID, err = contracts.ReadString(id); err != nil || env.ID == "" || len(env.ID) > MaxIDLen {
		return Envelope{}, &DecodeError{Method: env.Method, Reason: "correlation id must be a string of 1 to 128 bytes"}
	}
	switch p, _ := contracts.ReadString(phase); p {
	case "request":
		env.Phase = PhaseRequest
	case "response":
		env.Phase = PhaseResponse
	default:
		return Envelope{}, &DecodeError{Method: env.Method, Reason: "correlation phase must be request or response"}
	}
	bad := func(reason string) (Envelope, error) {
		return Envelope{}, &DecodeError{Method: env.Method, ID: env.ID, Phase: env.Phase, Reason: reason}
	}
	if env.Phase == PhaseRequest {
		if contracts.KindOf(request) != contracts.KindObject {
			return bad("request must be an object")
		}
		env.Request = request
		return env, nil
	}
	if errRaw != nil && !contracts.IsNull(errRaw) {
		var textRaw, data []byte
		if contracts.ReadExact(errRaw, contracts.Req("text", &textRaw), contracts.Opt("data", &data)) != nil {
			return bad("error must be { text, data }")
		}
		text, err := contracts.ReadString(textRaw)
		if err != nil {
			return bad("error text must be a string")
		}
		if data == nil {
			data = json.RawMessage("null")
		}
		env.Error = &Error{Text: text, Data: data}
	} else {
		switch contracts.KindOf(response) {
		case contracts.KindObject, contracts.KindNull:
			env.Response = response
		default:
			return bad("response must be an object or null")
		}
	}
	if retry != nil && !contracts.IsNull(retry) {
		if contracts.KindOf(retry) != contracts.KindObject {
			return bad("retry must be an object")
		}
		env.Retry = retry
	}
	return env, nil
}

// isMethod accepts a TypedRequest method name: a letter, then letters, digits and underscores.
func isMethod(s string) bool {
	if s == "" || len(s) > MaxMethodLen {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || i > 0 && (c >= '0' && c <= '9' || c == '_')) {
			return false
		}
	}
	return true
}

// Append appends the envelope's wire form to dst. Bodies are copied byte for byte.
func (env *Envelope) Append(dst []byte) []byte {
	dst = append(dst, `{"method":`...)
	dst = contracts.AppendString(dst, env.Method)
	if env.Phase == PhaseRequest {
		dst = append(dst, `,"request":`...)
		dst = appendRaw(dst, env.Request, "{}")
		dst = append(dst, `,"response":null,"correlation":{"id":`...)
		dst = contracts.AppendString(dst, env.ID)
		return append(dst, `,"phase":"request"}}`...)
	}
	dst = append(dst, `,"request":{},"response":`...)
	if env.Error != nil {
		dst = append(dst, "null"...)
	} else {
		dst = appendRaw(dst, env.Response, "null")
	}
	dst = append(dst, `,"correlation":{"id":`...)
	dst = contracts.AppendString(dst, env.ID)
	dst = append(dst, `,"phase":"response"}`...)
	if env.Error != nil {
		dst = append(dst, `,"error":{"text":`...)
		dst = contracts.AppendString(dst, env.Error.Text)
		dst = append(dst, `,"data":`...)
		dst = appendRaw(dst, env.Error.Data, "null")
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
	if env.Error != nil {
		n += 2*len(env.Error.Text) + len(env.Error.Data) + 32
	}
	return n
}

func formatID(n uint64) string { return strconv.FormatUint(n, 36) }
