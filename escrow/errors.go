package escrow

import (
	"errors"
	"strings"

	"code.foss.global/serve.zone/relay/contracts"
)

// Refusals of holdRuntimeNetworkDnsLeaseRenewals. The six names are the seed's
// (contracts.HoldRuntimeNetworkDnsLeaseRenewalsRefusals); a refusal is the whole answer and
// travels as "<name>: <reason>". Reasons name members and limits, never a signature, an
// authority or a session's contents. Hold judges in the order the functions appear here.

func refuseNotFromCloudly() error {
	return contracts.EscrowCloudlyOnly.Refuse("holdRuntimeNetworkDnsLeaseRenewals is served only on the attached Cloudly session")
}

func refuseInvalid(err error) error {
	var inv *contracts.InvalidError
	if errors.As(err, &inv) {
		return contracts.EscrowRunInvalid.Refuse("%s", strings.Join(inv.Reasons, "; "))
	}
	return contracts.EscrowRunInvalid.Refuse("hold request is not readable")
}

func refuseNotCarried(node string) error {
	return contracts.EscrowNodeNotCarried.Refuse("this relay carries no current session of node %s", node)
}

func refuseForeign(reasons []string) error {
	return contracts.EscrowRunForeignSession.Refuse("%s", strings.Join(reasons, "; "))
}

func refuseUnordered(reasons []string) error {
	return contracts.EscrowRunUnordered.Refuse("%s", strings.Join(reasons, "; "))
}

func refuseStale(lastExpires, now int64) error {
	return contracts.EscrowRunStale.Refuse("the run's last window ended at %d, before now (%d, Unix ms)", lastExpires, now)
}

// Outcomes of a release, the label of relay_escrow_releases_total.
const (
	outcomeAccepted = "accepted" // the node admitted the renewal
	outcomeReplay   = "replay"   // the node already had exactly this renewal
	outcomeRefused  = "refused"  // the node answered with an error of its own
	outcomeMismatch = "mismatch" // the node's answer does not bind to the renewal sent
	outcomeFailed   = "failed"   // the relay could not deliver it: queue full, connection gone, timeout
)

// releaseOutcome classifies the node's answer to a push of sent; refusal is the error's label
// (contracts.RefusalLabel), for the log.
func releaseOutcome(resp []byte, err error, sent contracts.RuntimeNetworkDnsLeaseRenewalReference) (outcome, refusal string) {
	if err != nil {
		var local *contracts.Refusal
		if errors.As(err, &local) {
			return outcomeFailed, contracts.RefusalLabel(err)
		}
		return outcomeRefused, contracts.RefusalLabel(err)
	}
	status, berr := contracts.BindApplyRuntimeNetworkDnsLeaseRenewalResponse(resp, sent)
	switch {
	case berr != nil:
		return outcomeMismatch, ""
	case status == contracts.ApplyStatusReplay:
		return outcomeReplay, ""
	}
	return outcomeAccepted, ""
}
