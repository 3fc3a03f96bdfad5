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
	cs, err := corestore.New(corestore.Options{
		CAFile: cfg.CorestoreCAFile, AllowHTTP: cfg.InsecurePlaintext, Registerer: reg, Logger: log,
	})
	if err != nil {
		return nil, &relay.ConfigError{Flag: "corestore-ca-file", Reason: err.Error()}
	}
	return restore.New(cs, restore.Options{Registerer: reg, Logger: log}), nil
}
