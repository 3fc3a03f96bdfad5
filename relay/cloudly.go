package relay

import (
	"encoding/json"

	"code.foss.global/serve.zone/relay/contracts"
	"code.foss.global/serve.zone/relay/feature"
)

// What the relay does with its Cloudly session: the upstreamHooks side of upstream.go, custody
// and the configuration push.

// registration is the registerClusterRelay body with registrationSequence seq: 0 for the first
// registration of the process, one more for each after it (docs/protocol.md#upstream-session; the upstream counts). It
// carries exactly the seed's members: what else the relay must say goes in calls of its own (the
// hub report, upstreamAttached).
func (r *Relay) registration(seq int64) json.RawMessage {
	reg := contracts.RegisterClusterRelayRequest{
		Protocol: contracts.RelayOffer,
		Relay: contracts.ClusterRelayRegistration{
			Version: r.cfg.BuildVersion, NodeID: r.cfg.NodeID,
			ListenAddress: r.cfg.AdvertiseAddress, ListenPort: r.listenPort(),
		},
		RegistrationSequence: seq,
	}
	body, _ := json.Marshal(reg)
	return body
}

// registrationAccepted: Cloudly dispatches to the relay again. It runs on the socket's read loop,
// before the configuration push that follows the acceptance, which may end custody again.
func (r *Relay) registrationAccepted() { r.custody.resume() }

// upstreamAttached tells every part that hears it, then every node and ingress connection (the
// upstream has sent the hub report already).
func (r *Relay) upstreamAttached(up feature.Upstream) {
	for _, w := range r.parts.attach {
		w.Attached(up)
	}
	r.announceAttached()
}

func (r *Relay) upstreamDetached() {
	for _, w := range r.parts.detach {
		w.Detached()
	}
}

// undispatched: Cloudly refused the relay with one of clusterRelayUndispatchedRefusals.
func (r *Relay) undispatched(name contracts.RefusalName) { r.endCustody(name) }

// endCustody: Cloudly does not dispatch to this relay. Parts drop what they hold for the
// nodes (escrow), node registrations are refused with the same name, and the upstream keeps
// re-registering.
func (r *Relay) endCustody(name contracts.RefusalName) {
	if r.custody.end(name) {
		r.log.up.Warn().Str("refusal", string(name)).Msg("custody ended: escrowed runs dropped, node registrations refused")
	}
	for _, w := range r.parts.custody {
		w.CustodyEnded()
	}
}

// pushConfig serves pushClusterRelayConfig: the newest push replaces the previous one.
func (r *Relay) pushConfig(body json.RawMessage) (json.RawMessage, error) {
	cfg, err := contracts.ReadClusterRelayConfigPush(body, r.cfg.InsecurePlaintext)
	if err != nil {
		return nil, contracts.RelayRequestInvalid.Refuse("%v", err)
	}
	if cfg.ClusterID != r.cfg.ClusterID {
		return nil, contracts.RelayRequestInvalid.Refuse("config names cluster %s; this relay serves %s", cfg.ClusterID, r.cfg.ClusterID)
	}
	for _, w := range r.parts.config {
		w.Configured(cfg)
	}
	switch {
	case cfg.Relay == nil:
		// The operator disabled the relay: the same as hearing relay-cluster-not-enabled.
		r.endCustody(contracts.RelayClusterNotEnabled)
	case r.custody.resumeFrom(contracts.RelayClusterNotEnabled):
		r.log.up.Info().Msg("relay enabled again: custody resumed")
	}
	r.log.up.Info().Int("corestores", len(cfg.Corestores)).Bool("enabled", cfg.Relay != nil).Msg("relay configuration applied")
	return json.RawMessage(`{}`), nil
}
