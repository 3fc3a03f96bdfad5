package main

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"code.foss.global/serve.zone/relay/escrow"
	"code.foss.global/serve.zone/relay/relay"
)

// buildEscrow wires the DNS lease renewal escrow, its metrics in the relay's registry.
func buildEscrow(log zerolog.Logger, reg prometheus.Registerer) (relay.Escrow, error) {
	e, err := escrow.New(escrow.Options{Logger: log, Registerer: reg})
	if err != nil {
		return nil, err
	}
	return e, nil
}
