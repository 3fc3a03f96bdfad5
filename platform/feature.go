package platform

import (
	"context"
	"encoding/json"
	"errors"

	"code.foss.global/serve.zone/relay/contracts"
	"code.foss.global/serve.zone/relay/feature"
)

// The agent as the relay sees it (package feature): it uses the relay's Cloudly session (and its
// streams and memory ports), serves pushCorestoreCredential from Cloudly, hears attaches, detaches
// and configuration pushes, and runs beside the relay.

// UseUpstream takes the relay's Cloudly session and, when it offers them, its streams and memory
// ports.
func (p *Platform) UseUpstream(up feature.Upstream) {
	p.up = up
	p.streams, _ = up.(feature.Streams)
	p.memory, _ = up.(feature.Memory)
}

// Methods: pushCorestoreCredential, from Cloudly.
func (p *Platform) Methods() (fromCloudly, fromDownstream []string) {
	return []string{contracts.MethodPushCorestoreCredential}, nil
}

// ServeCloudly serves pushCorestoreCredential.
func (p *Platform) ServeCloudly(method string, body json.RawMessage, reply feature.Reply) {
	out, err := p.serveCredential(body)
	label := outcome(err, outcomeAccepted)
	p.metrics.credentials.WithLabelValues(label).Inc()
	p.log.Info().Str("method", method).Int("bytes", len(body)).Str("outcome", label).Msg("Corestore credential push")
	reply(out, err)
}

// Attached: a new session. Listing starts on every node; when a Corestore is configured, the
// agent enrols and pulls the desired state.
func (p *Platform) Attached(feature.Upstream) {
	p.mu.Lock()
	p.attached = true
	p.session++
	session := p.session
	if p.dropTimer != nil {
		p.dropTimer.Stop()
		p.dropTimer = nil
	}
	nodes := p.nodeList()
	p.mu.Unlock()
	for _, n := range nodes {
		n.attached(session)
	}
	if len(nodes) > 0 {
		p.startEnrollment(session)
		p.kickPull()
	}
}

// Detached: listing stops; the recipient key is dropped (a new one is enrolled after the next
// attach); credentials are dropped CredentialHorizon later unless the relay attached again.
func (p *Platform) Detached() {
	p.mu.Lock()
	p.attached = false
	p.recipient = nil
	session := p.session
	nodes := p.nodeList()
	if p.dropTimer != nil {
		p.dropTimer.Stop()
	}
	if !p.closed {
		p.dropTimer = p.clock.AfterFunc(p.opts.CredentialHorizon, func() { p.dropCredentials(session) })
	}
	p.mu.Unlock()
	for _, n := range nodes {
		n.detached()
	}
}

// Configured follows the push's Corestores: a node named for the first time gets its agent, a
// node no longer named loses it (its work is aborted), an origin that changed is used from the
// next call on. A push naming no Corestore leaves the agent idle.
func (p *Platform) Configured(cfg contracts.ClusterRelayConfig) {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return
	}
	want := make(map[string]string, len(cfg.Corestores))
	for _, c := range cfg.Corestores {
		want[c.NodeID] = c.Origin
	}
	var started, stopped []*node
	for id, n := range p.nodes {
		if _, ok := want[id]; !ok {
			delete(p.nodes, id)
			stopped = append(stopped, n)
		}
	}
	for id, origin := range want {
		if n := p.nodes[id]; n != nil {
			n.setOrigin(origin)
			continue
		}
		n := p.newNode(id, origin)
		p.nodes[id] = n
		started = append(started, n)
	}
	attached, session, count := p.attached, p.session, len(p.nodes)
	p.mu.Unlock()
	p.metrics.corestores.Set(float64(count))
	for _, n := range stopped {
		n.stop()
	}
	for _, n := range started {
		n.start()
		if attached {
			n.attached(session)
		}
	}
	if attached && count > 0 {
		p.startEnrollment(session)
		p.kickPull()
	}
}

// Leading: a relay that does not lead (an HA standby, or a leader that lost its Lease) works for
// no node — it hands over no desired state and carries no closure — and drops the credentials
// and recipient key it holds; the leader enrols for its own. Leading again resumes (the next
// attach enrols and brings the credentials back).
func (p *Platform) Leading(leading bool) {
	p.mu.Lock()
	p.standby = !leading
	nodes := p.nodeList()
	if !leading {
		p.recipient = nil
	}
	p.mu.Unlock()
	for _, n := range nodes {
		if !leading {
			n.dropCredential()
		}
		poke(n.kick)
		poke(n.work)
	}
}

// Run pulls the desired state until ctx ends, then closes the agent (Close).
func (p *Platform) Run(ctx context.Context) error {
	p.goDo(func() { p.pullLoop(ctx) })
	<-ctx.Done()
	return p.Close()
}

// Ready is an error once the agent is closed. A Corestore that cannot be reached does not make
// the relay unready: it is one node's trouble, shown on the status page.
func (p *Platform) Ready() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return errors.New("closed")
	}
	return nil
}
