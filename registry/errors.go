package registry

import (
	"errors"
	"net/http"
	"strconv"

	"code.foss.global/serve.zone/relay/contracts"
	"code.foss.global/serve.zone/relay/contracts/strictjson"
)

// Project-defined refusal names. The registry answers in the distribution specification's error
// body, {"errors":[{"code": <spec code>, "message": "<name>: <reason>"}]}, so that a client reads
// the spec code and a person the refusal name. Everything the upstream answers is passed on as
// the upstream sent it; these are only the relay's own answers.
const (
	// RegistryUpstreamUnreachable: the upstream could not be reached (dial, TLS, timeout) or its
	// answer broke off before any byte was sent on. 502, code UNAVAILABLE.
	RegistryUpstreamUnreachable contracts.RefusalName = "registry-upstream-unreachable"
	// RegistryPathInvalid: a /v2/ path with an empty, "." or ".." segment or an escaped byte; it
	// is not forwarded, so the upstream can never be asked for a path the relay did not judge.
	// 400, code NAME_INVALID.
	RegistryPathInvalid contracts.RefusalName = "registry-path-invalid"
	// RegistryDigestMismatch: the upstream's bytes for a digest did not hash to it, and the
	// relay could still refuse before sending any of them. 502, code DIGEST_INVALID. (Once bytes
	// are on their way the relay cuts the answer short instead: see fill.go.)
	RegistryDigestMismatch contracts.RefusalName = "registry-digest-mismatch"
	// RegistryRedirectRefused: the upstream redirected a GET or HEAD where the relay does not
	// follow (redirect.go): off its own origin to plain http or to an address that is not
	// public, or more than 5 times. 502, code UNAVAILABLE. The reason never quotes the Location.
	RegistryRedirectRefused contracts.RefusalName = "registry-redirect-refused"
	// RegistryUpstreamBusy: no upstream slot came free for the caller within the slot wait
	// (slots.go): its source address held its share of upstream fetches or authorizations, or the
	// relay held all of them. 503 with Retry-After, code UNAVAILABLE. The reason names which.
	RegistryUpstreamBusy contracts.RefusalName = "registry-upstream-busy"
)

// Errors of a fill, reported through metrics by reason; never sent to a client as text.
var (
	errDigestMismatch = errors.New("content does not hash to its digest")
	errSizeMismatch   = errors.New("content length differs from the announced length")
	errStalled        = errors.New("upstream sent nothing within the stall timeout")
	errClosed         = errors.New("registry closed")
	errDisk           = errors.New("cache disk error")
)

// errSlowReader ends the writes to a caller cut for reading slower than the minimum read rate
// (progress.go); it reaches the log, never the caller.
var errSlowReader = errors.New("caller read slower than the minimum read rate")

// ErrUpstreamURL is New's answer to an upstream URL it will not use. The URL is never quoted: it
// might carry a password.
var ErrUpstreamURL = errors.New("registry upstream must be an http(s) URL without credentials, query or fragment")

// writeRefusal answers with the relay's own error in the distribution error format.
func writeRefusal(w http.ResponseWriter, status int, specCode string, r *contracts.Refusal) {
	body := []byte(`{"errors":[{"code":`)
	body = strictjson.AppendString(body, specCode)
	body = append(body, `,"message":`...)
	body = strictjson.AppendString(body, r.Error())
	body = append(body, "}]}\n"...)
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Docker-Distribution-Api-Version", "registry/2.0")
	h.Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(status)
	w.Write(body)
}
