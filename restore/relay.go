package restore

import (
	"context"
	"encoding/json"
	"errors"

	"code.foss.global/serve.zone/relay/contracts"
	"code.foss.global/serve.zone/relay/feature"
)

// The restore as the relay sees it (package feature): it serves the five methods from Cloudly,
// hears the Corestore origins in each configuration push, and runs beside the relay. A restore
// control travels to a node's Corestore, never over the relay's connections, so it hears nothing
// else.

// Methods: the five isolated-restore methods, from Cloudly only.
func (r *Restore) Methods() (fromCloudly, fromDownstream []string) {
	m := contracts.IsolatedRestoreMethods()
	return m[:], nil
}

// ServeCloudly serves one of the five (Serve).
func (r *Restore) ServeCloudly(method string, body json.RawMessage, reply feature.Reply) {
	r.Serve(method, body, reply)
}

// Configured replaces the Corestore origins with the push's.
func (r *Restore) Configured(cfg contracts.ClusterRelayConfig) { r.setCorestores(cfg.Corestores) }

// Run serves until ctx ends, then closes the restore (Close) and returns.
func (r *Restore) Run(ctx context.Context) error {
	<-ctx.Done()
	return r.Close()
}

// Ready is an error once the restore is closed.
func (r *Restore) Ready() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return errors.New("closed")
	}
	return nil
}
