package daemon

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"code.foss.global/serve.zone/relay/corestore"
	"code.foss.global/serve.zone/relay/platform"
)

// buildPlatform wires the Corestore platform agent: the corestore client is its Corestore port.
// It idles until a configuration push names a Corestore.
func buildPlatform(cs *corestore.Client, log zerolog.Logger, reg prometheus.Registerer) (*platform.Platform, error) {
	return platform.New(cs, platform.Options{Logger: log, Registerer: reg})
}
