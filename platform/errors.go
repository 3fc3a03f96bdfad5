package platform

import (
	"errors"

	"code.foss.global/serve.zone/relay/contracts"
)

// Every error the agent meets is named by a refusal for metrics, logs and the status page: the
// seed's restore-node-unreachable / restore-node-refused for a Corestore that cannot be reached or
// refuses (the port's own), relay-closure-stalled for a closure that moved no byte for its bound
// (at Corestore's end or Cloudly's), relay-request-invalid for a closure past 256 MiB or an
// answer the agent cannot read, relay-upstream-detached / relay-call-timeout / relay-node-busy for what
// happens on the Cloudly socket, Cloudly's own refusal names as Cloudly sent them.

// outcome is err's label: ok when err is nil, not-accepted for Cloudly's { accepted: false },
// else the refusal name (contracts.RefusalLabel: a fixed set, "other" for anything else).
func outcome(err error, ok string) string {
	switch {
	case err == nil:
		return ok
	case errors.Is(err, errNotAccepted):
		return outcomeNotAccepted
	}
	return contracts.RefusalLabel(err)
}
