package main

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"code.foss.global/serve.zone/relay/corestore"
	"code.foss.global/serve.zone/relay/relay"
	"code.foss.global/serve.zone/relay/restore"
)

// buildRestore wires isolated restore: the corestore package's client is the Corestore port of
// the restore package. Corestore origins come later, from Cloudly's configuration push.
func buildRestore(cfg relay.Config, log zerolog.Logger, reg prometheus.Registerer) (*restore.Restore, error) {
	roots, err := caPool(cfg.CorestoreCAFile, "corestore-ca-file")
	if err != nil {
		return nil, err
	}
	cs, err := corestore.New(corestore.Options{Logger: log, Registerer: reg, RootCAs: roots, AllowHTTP: cfg.InsecurePlaintext})
	if err != nil {
		return nil, err
	}
	return restore.New(cs, restore.Options{Logger: log, Registerer: reg})
}
