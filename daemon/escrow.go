package daemon

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"code.foss.global/serve.zone/relay/escrow"
)

// buildEscrow wires the DNS lease renewal escrow, its metrics in the relay's registry.
func buildEscrow(log zerolog.Logger, reg prometheus.Registerer) (*escrow.Escrow, error) {
	return escrow.New(escrow.Options{Logger: log, Registerer: reg})
}
