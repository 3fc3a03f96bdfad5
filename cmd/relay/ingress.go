package main

import (
	"encoding/json"

	"code.foss.global/serve.zone/relay/ingress"
	"code.foss.global/serve.zone/relay/relay"
)

// ingressFeature adapts *ingress.Server to relay.Ingress. The ingress package declares Peer and
// Upstream with relay's method sets but cannot name relay's types (it does not import relay), and
// Go compares method signatures by type identity. Were relay.Peer and relay.Upstream declared as
// aliases of the same interface literals ingress uses, this adapter could go.
type ingressFeature struct{ *ingress.Server }

func (f ingressFeature) Register(p relay.Peer, body json.RawMessage, reply func(json.RawMessage, error)) {
	f.Server.Register(p, body, reply)
}

func (f ingressFeature) IsIngress(p relay.Peer) bool { return f.Server.IsIngress(p) }

func (f ingressFeature) RouteTable(p relay.Peer, body json.RawMessage) (json.RawMessage, error) {
	return f.Server.RouteTable(p, body)
}

func (f ingressFeature) Attached(up relay.Upstream) { f.Server.Attached(up) }

func (f ingressFeature) PeerGone(p relay.Peer) { f.Server.PeerGone(p) }
