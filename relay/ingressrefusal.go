package relay

import (
	"errors"

	"code.foss.global/serve.zone/relay/contracts"
)

// The relay's own refusals of a cluster ingress registration (registerClusterIngress) travel in the
// seeds' registration refusal shape: error data IClusterIngressRegistrationRefusal { code:
// cluster-ingress-registration-refused, reason: not-ready, retryAfterMs }, with the relay's own
// cause in the error text (relay-upstream-detached: …). An ingress built from the seeds reads only
// the data ("Everything else is not a refusal"), so this is how it learns when to register again.
// Cloudly's refusals, a protocol refusal and a registration-invalid refusal already in that shape
// pass untouched. A refusal at the upgrade — 503 with Retry-After, from a standby or a full
// relay — is plain HTTP: no TypedRequest error can be read there, and Retry-After is what says
// when to come back.

// ingressRetryStandby is the retryAfterMs of a registration refused by a relay that does not lead
// (standing by, or shutting down): the elected relay, or this one restarted, is a Service away.
const ingressRetryStandby = contracts.ClusterIngressMinimumRetryAfterMs

// ingressRetryBusy is the retryAfterMs of a registration refused for room (the anonymous pool, the
// Cloudly socket's queue, a call timeout): registrations at Cloudly are answered within the call
// timeout, so room comes soon.
const ingressRetryBusy = contracts.ClusterIngressMinimumRetryAfterMs

// ingressNotReady is the refusal of an ingress registration the relay makes while it does not
// lead: shutting down, or standing by with HA.
func (r *Relay) ingressNotReady() error {
	switch {
	case r.draining.Load():
		return contracts.IngressRegistrationRefusal(contracts.IngressRefusedNotReady,
			contracts.RelayUpstreamDetached.Refuse("the relay is shutting down"), ingressRetryStandby)
	case !r.leading.Load():
		return contracts.IngressRegistrationRefusal(contracts.IngressRefusedNotReady,
			contracts.RelayUpstreamDetached.Refuse("this relay stands by; the elected relay serves the cluster"), ingressRetryStandby)
	}
	return nil
}

// ingressRefusal gives the relay's own refusal of an ingress registration the seeds' shape.
func (r *Relay) ingressRefusal(err error) error {
	var own *contracts.Refusal
	if err == nil || !errors.As(err, &own) {
		return err // Cloudly's answer, or a protocol refusal: untouched
	}
	if _, shaped := contracts.ReadClusterIngressRegistrationRefusal(own.Data()); shaped {
		return err
	}
	var after int64
	switch own.Name {
	case contracts.RelayUpstreamDetached:
		after = r.up.hist.RetryIn(r.now()).Milliseconds()
	case contracts.RelayCallTimeout, contracts.RelayUpstreamBusy, contracts.RelayNodeBusy, contracts.RelayRequestInvalid:
		// Relay-request-invalid here is Cloudly's answer the relay could not read (a body the
		// relay cannot read is registration-invalid already).
		after = ingressRetryBusy
	default:
		// relay-session-foreign: the connection carries another peer. One connection carries one
		// peer, and an ingress that knows only the seeds never sends anything but its own
		// registration on its connection: no seed reason says this, and none is claimed.
		return err
	}
	return contracts.IngressRegistrationRefusal(contracts.IngressRefusedNotReady, own, after)
}
