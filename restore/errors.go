package restore

import (
	"errors"

	"code.foss.global/serve.zone/relay/contracts"
)

// Every refusal this package answers is a *contracts.Refusal under one of these names: the seed's
// isolatedRestoreNodeControlRefusals for a node that cannot be reached or refuses, and the
// project's relay-request-invalid, relay-node-busy and relay-method-unknown for a call the relay
// itself cannot carry.

func notCarried(node string) error {
	return contracts.RestoreNodeNotCarried.Refuse("this relay has no Corestore origin for node %s", node)
}

func invalidRequest(method string, err error) error {
	return contracts.RelayRequestInvalid.Refuse("%s: %v", method, err)
}

func nodeBusy(node string, n int) error {
	return contracts.RelayNodeBusy.Refuse("node %s already has %d isolated-restore calls in flight", node, n)
}

func relayBusy(n int) error {
	return contracts.RelayNodeBusy.Refuse("the relay already has %d isolated-restore calls in flight", n)
}

func closing() error {
	return contracts.RestoreNodeUnreachable.Refuse("the relay is shutting down")
}

// badSummary refuses a 2xx answer that is not a progress by the seed's rules.
func badSummary(err error) error {
	return contracts.RestoreNodeRefused.Refuse("Corestore's staging summary is not a valid progress: %v", err)
}

// corestoreFailure keeps the port's unreachable and refused refusals as they are; anything else
// the port returns is a failure to reach the node, and its text is not passed on.
func corestoreFailure(err error) error {
	if errors.Is(err, contracts.RestoreNodeUnreachable) || errors.Is(err, contracts.RestoreNodeRefused) {
		return err
	}
	return contracts.RestoreNodeUnreachable.Refuse("the call to the node's Corestore failed")
}

// outcome is the label of an answer: "answered", or the refusal's name (contracts.RefusalLabel).
func outcome(err error) string {
	if err == nil {
		return "answered"
	}
	return contracts.RefusalLabel(err)
}
