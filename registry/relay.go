package registry

import (
	"context"
	"errors"
)

// The registry as the relay sees it: an http.Handler for /v2/ on the downstream listener, and a
// relay.Component (Run, Ready) that the relay stops after its connections are closed.

// Run serves until ctx ends, then closes the registry (Close) and returns.
func (r *Registry) Run(ctx context.Context) error {
	<-ctx.Done()
	return r.Close()
}

// Ready is an error once the registry is closed.
func (r *Registry) Ready() error {
	r.closeMu.Lock()
	defer r.closeMu.Unlock()
	if r.closed {
		return errors.New("closed")
	}
	return nil
}
