package main

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"code.foss.global/serve.zone/relay/escrow"
	"code.foss.global/serve.zone/relay/relay"
)

// buildEscrow wires the DNS lease renewal escrow: its metrics in the relay's registry, its logger
// with component escrow.
func buildEscrow(log zerolog.Logger, reg prometheus.Registerer) (relay.Escrow, error) {
	e, err := escrow.New(escrow.Options{Registerer: reg, Logger: log.With().Str("component", "escrow").Logger()})
	if err != nil {
		return nil, err
	}
	return escrowFeature{e}, nil
}

// escrowFeature hands the relay's nodes to the escrow. escrow.Node is an alias of the node
// interface literal; while relay.Node is a named type the two differ and the escrow's NodeBound
// and NodeGone need this wrapper. Once relay.Node is an alias of the same literal, *escrow.Escrow
// is a relay.Escrow itself and the wrapper can go.
type escrowFeature struct{ *escrow.Escrow }

func (f escrowFeature) NodeBound(n relay.Node) { f.Escrow.NodeBound(n) }
func (f escrowFeature) NodeGone(n relay.Node)  { f.Escrow.NodeGone(n) }

var _ relay.Escrow = escrowFeature{}
