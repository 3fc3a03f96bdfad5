package main

import (
	"code.foss.global/serve.zone/relay/escrow"
	"code.foss.global/serve.zone/relay/relay"
)

// escrowFeature adapts *escrow.Escrow to relay.Escrow. The escrow names its own Node interface
// (it may not import relay), so its NodeBound and NodeGone take escrow.Node; every relay.Node has
// that method set, and this wrapper hands it over.
type escrowFeature struct{ *escrow.Escrow }

func (f escrowFeature) NodeBound(n relay.Node) { f.Escrow.NodeBound(n) }
func (f escrowFeature) NodeGone(n relay.Node)  { f.Escrow.NodeGone(n) }

var _ relay.Escrow = escrowFeature{}
