package daemon

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"code.foss.global/serve.zone/relay/corestore"
	"code.foss.global/serve.zone/relay/restore"
)

// buildCorestore is the one client for node Corestores: isolated restore and the platform agent
// share it (its connections, TLS roots and metrics).
func buildCorestore(cfg Config, log zerolog.Logger, reg prometheus.Registerer) (*corestore.Client, error) {
	roots, err := caPool(cfg.CorestoreCAFile, "corestore-ca-file")
	if err != nil {
		return nil, err
	}
	return corestore.New(corestore.Options{Logger: log, Registerer: reg, RootCAs: roots, AllowHTTP: cfg.InsecurePlaintext})
}

// buildRestore wires isolated restore: the corestore client is the Corestore port of the restore
// package. Corestore origins come later, from Cloudly's configuration push.
func buildRestore(cs *corestore.Client, log zerolog.Logger, reg prometheus.Registerer) (*restore.Restore, error) {
	return restore.New(cs, restore.Options{Logger: log, Registerer: reg})
}
