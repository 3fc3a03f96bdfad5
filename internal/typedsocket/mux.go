package typedsocket

import "code.foss.global/serve.zone/relay/contracts"

// Mux is a handler table: one handler per method, and a fallback for every other method (none:
// relay-method-unknown).
type Mux struct {
	handlers map[string]Handler
	fallback Handler
}

// NewMux returns an empty table.
func NewMux() *Mux { return &Mux{handlers: make(map[string]Handler)} }

// Handle serves method with h.
func (m *Mux) Handle(method string, h HandlerFunc) { m.handlers[method] = h }

// Fallback serves every method without its own handler.
func (m *Mux) Fallback(h HandlerFunc) { m.fallback = h }

// ServeRequest dispatches r.
func (m *Mux) ServeRequest(c *Conn, r *Request) {
	if h, ok := m.handlers[r.Method]; ok {
		h.ServeRequest(c, r)
		return
	}
	if m.fallback != nil {
		m.fallback.ServeRequest(c, r)
		return
	}
	r.Fail(contracts.RelayMethodUnknown.Refuse("%s", r.Method))
}
