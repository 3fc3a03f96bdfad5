package relay

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"code.foss.global/serve.zone/relay/contracts"
	"code.foss.global/serve.zone/relay/feature"
	"code.foss.global/serve.zone/relay/internal/typedsocket"
	"code.foss.global/serve.zone/relay/status"
)

// The VPN hub report (docs/protocol.md#attaching, project-defined). The seeds spell registerClusterRelay
// exactly and name no member for the hub, so the hub travels in a call of its own: after each
// accepted registration, while the hub is on, the relay sends registerClusterVpnHub { hub,
// noisePublicKey }. It is a guess at what Cloudly serves, and a guess must fail small: whatever
// Cloudly answers — {}, a refusal, "no such method", nothing — costs this one call. Its outcome
// is counted, logged once, shown on the status page and the report is sent again at the next
// attach; it never detaches the relay, never ends custody and never waits on the attach path or
// the socket's read loop (the call is sent after the acceptance and its answer handled where it
// arrives, without blocking).

// Hub report outcomes: the fixed label set of relay_upstream_hub_reports_total{outcome}.
const (
	hubReportAccepted      = "accepted"       // Cloudly answered without an error
	hubReportRefused       = "refused"        // Cloudly answered with an error that names no unknown method
	hubReportUnknownMethod = "unknown-method" // relay-method-unknown, or the TypedRequest library's own no-handler answer
	hubReportTimeout       = "timeout"        // no answer within the call timeout
	hubReportFailed        = "failed"         // not sent (queue full), or the socket was lost before an answer
	// hubReportPending is the status page's word for a report sent and not answered yet; it is
	// never counted.
	hubReportPending = "pending"
)

// hubReportOutcomes is every counted outcome, in the order the metric's help lists them.
var hubReportOutcomes = [...]string{hubReportAccepted, hubReportRefused, hubReportUnknownMethod, hubReportTimeout, hubReportFailed}

// hubReporter sends the hub report and keeps its newest outcome.
type hubReporter struct {
	body   json.RawMessage        // set at construction: the request; nil when the hub is off
	addr   string                 // set at construction: the reported address:port, for the status page
	bound  string                 // set at construction: the hub's socket as bound, for the status page
	key    string                 // set at construction: the hub's public key in short form, for the log
	log    zerolog.Logger         // set at construction: the upstream's
	now    func() time.Time       // set at construction: the relay's clock
	counts *prometheus.CounterVec // set at construction: outcome
	sent   atomic.Int64           // reports sent so far: the newest one's number
	state  atomic.Pointer[hubReportState]
}

// hubReportState is the newest report as the status page shows it: its outcome (pending until
// answered) and when it was sent or answered, with the registrationSequence it followed.
type hubReportState struct {
	outcome  string
	at       time.Time
	sequence int64
	n        int64 // the report's number (hubReporter.sent)
}

// newHubReporter makes the reporter of the hub at ep for cluster; with ep nil (the hub is off) it
// reports nothing. An endpoint whose key is not a 32-byte key is refused: the report would carry
// it to Cloudly as garbage.
func newHubReporter(cluster string, ep *contracts.VPNHubEndpoint, bound string, log zerolog.Logger, counts *prometheus.CounterVec, now func() time.Time) (*hubReporter, error) {
	h := &hubReporter{log: log, counts: counts, now: now}
	if ep == nil {
		return h, nil
	}
	h.addr, h.bound = net.JoinHostPort(ep.Address, strconv.Itoa(ep.QUICPort)), bound
	key, err := contracts.DecodeKey32(ep.NoisePublicKey)
	if err != nil {
		return nil, fmt.Errorf("vpn hub endpoint: public key: %w", err)
	}
	h.body = contracts.EncodeRegisterClusterVpnHubRequest(contracts.ClusterVpnHubReport{
		Hub:            contracts.RuntimeNetworkVpnHub{ClusterID: cluster, Address: ep.Address, QUICPort: ep.QUICPort},
		NoisePublicKey: key,
	})
	h.key = ep.NoisePublicKey[:8]
	return h, nil
}

// on reports whether there is a hub to report.
func (h *hubReporter) on() bool { return h.body != nil }

// status is the newest report's state; nil while the hub is off or before the first report.
func (h *hubReporter) status() *status.HubReport {
	if !h.on() {
		return nil
	}
	s := h.state.Load()
	if s == nil {
		return nil
	}
	return &status.HubReport{Outcome: s.outcome, At: s.at, Sequence: s.sequence}
}

// report sends the report on up, after Cloudly accepted registration seq. It returns at once: the
// answer is handled by answered, wherever it arrives.
func (h *hubReporter) report(up feature.Upstream, seq int64) {
	if !h.on() {
		return
	}
	n := h.sent.Add(1)
	h.state.Store(&hubReportState{outcome: hubReportPending, at: h.now(), sequence: seq, n: n})
	up.Call(contracts.MethodRegisterClusterVpnHub, h.body, func(_ json.RawMessage, err error) { h.answered(n, seq, err) })
}

// answered counts and logs report n's outcome, and shows it unless a newer report was sent since.
// It runs on the socket's read loop (an answer) or a timer (a timeout) and must not block.
func (h *hubReporter) answered(n, seq int64, err error) {
	outcome := hubReportOutcome(err)
	h.counts.WithLabelValues(outcome).Inc()
	next := &hubReportState{outcome: outcome, at: h.now(), sequence: seq, n: n}
	// Shown unless a newer report was sent since: a late answer to a lost socket's report must
	// not hide the newest one.
	for {
		cur := h.state.Load()
		if cur == nil || cur.n != n || h.state.CompareAndSwap(cur, next) {
			break
		}
	}
	if outcome == hubReportAccepted {
		h.log.Info().Str("method", contracts.MethodRegisterClusterVpnHub).Int64("sequence", seq).Str("key", h.key).
			Str("outcome", outcome).Msg("VPN hub reported to Cloudly")
		return
	}
	// Never the peer's error text: its refusal name, as every log line gives it.
	h.log.Warn().Str("method", contracts.MethodRegisterClusterVpnHub).Int64("sequence", seq).
		Str("refusal", contracts.RefusalLabel(err)).Str("outcome", outcome).
		Msg("Cloudly did not take the VPN hub report; the relay stays attached and reports it again at the next attach")
}

// hubReportOutcome names how a report ended. A remote error is Cloudly's answer: an unknown method
// when it names relay-method-unknown or is the TypedRequest library's own no-handler text (what a
// Cloudly without the call says), else a refusal. A local error is the relay's: its call timeout,
// or a failure to send or to hear the answer.
func hubReportOutcome(err error) string {
	var remote *typedsocket.Error
	switch {
	case err == nil:
		return hubReportAccepted
	case errors.As(err, &remote) && (remote.Name() == contracts.RelayMethodUnknown || remote.Text == contracts.TypedRequestNoMethodText):
		return hubReportUnknownMethod
	case errors.As(err, &remote):
		return hubReportRefused
	case errors.Is(err, contracts.RelayCallTimeout):
		return hubReportTimeout
	}
	return hubReportFailed
}
