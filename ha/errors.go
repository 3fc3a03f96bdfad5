package ha

import "errors"

// Why the replication channel refused a peer or ended a channel. Each is also the reason label of
// relay_ha_replication_refused_total or relay_ha_standbys_dropped_total, and the outcome of the
// log line that reports it; none carries a peer's bytes.

// Refusals at accept, before a channel feeds anything (relay_ha_replication_refused_total{reason}).
var (
	// errChannelLimit: maxChannels are open and none of them is still unauthenticated.
	errChannelLimit = errors.New("replication-channel-limit: too many replication channels at once")
	// errHandshake: the Noise handshake failed (another key, a replayed or garbled message 1).
	errHandshake = errors.New("replication-handshake-failed: the peer does not hold the replicas' key")
	// errHello: the first transport message is missing, does not decrypt, or is not { pod }.
	errHello = errors.New("replication-hello-invalid: the first message is not { pod } under this handshake")
	// errPodRefused: the Pod named is this relay's own, not a Pod name, or not a Pod of the release.
	errPodRefused = errors.New("replication-pod-refused: the Pod named is not another Pod of this release")
	// errNotLeading: this relay does not lead; only the leader feeds.
	errNotLeading = errors.New("replication-not-leading: this relay does not lead")
)

// Why a channel ended (relay_ha_standbys_dropped_total{reason} on the leader).
var (
	errAckMissed = errors.New("replication-ack-missed: the standby did not acknowledge within the bound")
	errSilent    = errors.New("replication-peer-silent: nothing heard from the peer within the silence bound")
	errQueueFull = errors.New("replication-queue-full: the standby's send queue is past its share of the memory budget")
	errReplaced  = errors.New("replication-replaced: a newer channel for the same Pod replaced this one")
	errAckBad    = errors.New("replication-ack-invalid: the standby acknowledged what it was never sent")
	errCopyLarge = errors.New("replication-copy-too-large: the leader's records do not fit the standby's copy bound")
	errStepDown  = errors.New("replication-stepped-down: this relay no longer leads")
	errStalled   = errors.New("replication-write-stalled: a write did not complete within the write timeout")
)

// reasonOf is the metric label of a channel's end or refusal.
func reasonOf(err error) string {
	for _, r := range []struct {
		err   error
		label string
	}{
		{errChannelLimit, "limit"}, {errHandshake, "handshake"}, {errHello, "hello"}, {errPodRefused, "pod"},
		{errNotLeading, "not-leading"}, {errAckMissed, "ack-missed"}, {errSilent, "silent"}, {errQueueFull, "queue-full"},
		{errReplaced, "replaced"}, {errAckBad, "ack-invalid"}, {errStepDown, "stepped-down"}, {errStalled, "write-stalled"},
		{errCopyLarge, "copy-too-large"},
	} {
		if errors.Is(err, r.err) {
			return r.label
		}
	}
	return "closed"
}

// refusalReasons and dropReasons are the label values, each started at zero.
var (
	refusalReasons = []string{"limit", "handshake", "hello", "pod", "not-leading"}
	dropReasons    = []string{"ack-missed", "silent", "queue-full", "replaced", "ack-invalid", "stepped-down", "write-stalled", "closed"}
)
