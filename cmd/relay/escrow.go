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
	return e, nil
}
