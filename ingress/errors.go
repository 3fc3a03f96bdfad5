package ingress

import (
	"errors"

	"code.foss.global/serve.zone/relay/contracts"
)

// Refusals this package answers with. Each is a named refusal from contracts; reasons name what
// was wrong and never quote a bearer or a table.

// errNotIngress refuses an ingress-only method on any connection that is not an accepted ingress.
func errNotIngress(method string) error {
	return contracts.RelayIngressOnly.Refuse("%s is answered only on a connection whose registerClusterIngress Cloudly accepted", method)
}

// errInvalid refuses a body the relay must read and cannot. err's text is a validator's fixed
// messages, which never quote a value.
func errInvalid(err error) error { return contracts.RelayRequestInvalid.Refuse("%v", err) }

// errRegistrationInvalid refuses a registerClusterIngress body the relay cannot read, in the
// seed's registration refusal shape: reason registration-invalid ("the body fails
// validateClusterIngressRegistration"), text relay-request-invalid: …, and the longest wait, since
// the same body will fail again.
func errRegistrationInvalid(err error) error {
	return contracts.IngressRegistrationRefusal(contracts.IngressRefusedRegistrationInvalid,
		contracts.RelayRequestInvalid.Refuse("%v", err), contracts.ClusterIngressMaximumRetryAfterMs)
}

var (
	// errDetached answers a registration before the relay ever attached.
	errDetached = contracts.RelayUpstreamDetached.Refuse("the relay has no Cloudly session")
	// errNotAcceptance answers a registration whose Cloudly answer is neither an error nor an
	// acceptance: the relay cannot tell the ingress it is accepted.
	errNotAcceptance = contracts.RelayRequestInvalid.Refuse("Cloudly's answer to registerClusterIngress is not an acceptance")
	// errBadCursor refuses a statistics cursor this relay did not mint for the requested days.
	errBadCursor = contracts.RelayRequestInvalid.Refuse("cluster traffic statistics request cursor is not one this relay minted for these days")
)

// Why one ingress's statistics page failed. A failure is reported (metrics and a log line) and
// is not fatal: the cursor keeps that ingress's position, so the next page asks it again.
const (
	failGone    = "gone"    // the ingress named in the cursor has no accepted connection now
	failTimeout = "timeout" // no answer within the statistics timeout
	failRefused = "refused" // the ingress, or the relay on its way, answered an error
	failInvalid = "invalid" // the answer is not a page for the request
)

// Why a bucket of an ingress's page is dropped and counted rather than passed on. A bucket the
// relay cannot judge otherwise — without dayUtc, without nodeId — is passed on (tolerance: its
// members are this project's guess).
const (
	dropForeignNode = "foreign-node" // its nodeId is not the node of the ingress that answered
	dropOutOfRange  = "out-of-range" // its dayUtc lies outside the requested days
	dropMalformed   = "malformed"    // not an object, or an object that repeats dayUtc or nodeId
)

// cloudlyJudged reports whether a registration error is Cloudly's own answer, as opposed to the
// relay's (relay-upstream-detached, relay-call-timeout, …), which judges nothing about the ingress.
func cloudlyJudged(err error) bool {
	var local *contracts.Refusal
	return err != nil && !errors.As(err, &local)
}

// outcomeOf is the label of a registration's outcome, for metrics and logs: accepted, or the
// error's refusal name when it is a known one, else other (contracts.RefusalLabel): never its text,
// and never a name only the peer knows.
func outcomeOf(err error) string {
	if err == nil {
		return "accepted"
	}
	return contracts.RefusalLabel(err)
}
