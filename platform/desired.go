package platform

import (
	"context"

	"code.foss.global/serve.zone/relay/contracts"
)

// pullLoop pulls the desired state when asked (attach, configuration push) and every
// StateInterval, until ctx ends.
func (p *Platform) pullLoop(ctx context.Context) {
	t := p.clock.NewTimer(p.opts.StateInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-p.ctx.Done():
			return
		case <-p.pull:
		case <-t.C():
		}
		p.pullOnce()
		t.Reset(p.opts.StateInterval)
	}
}

// pullOnce asks Cloudly for the desired state, while attached with a Corestore configured, and
// hands each node its slice.
func (p *Platform) pullOnce() {
	p.mu.Lock()
	if !p.attached || len(p.nodes) == 0 || p.closed || p.standby {
		p.mu.Unlock()
		return
	}
	p.mu.Unlock()
	start := p.clock.Now()
	ctx, cancel := p.withTimeout(p.ctx, p.opts.CallTimeout)
	body, err := p.call(ctx, contracts.MethodGetClusterPlatformDesiredState, []byte(`{}`))
	cancel()
	var st contracts.PlatformDesiredState
	if err == nil {
		if st, err = contracts.ReadPlatformDesiredState(body); err != nil {
			err = contracts.RelayRequestInvalid.Refuse("Cloudly's answer to %s: %v", contracts.MethodGetClusterPlatformDesiredState, err)
		}
	}
	out := outcome(err, outcomeAnswered)
	p.metrics.pulls.WithLabelValues(out).Inc()
	p.mu.Lock()
	changed := p.lastPull != out
	p.lastPull = out
	p.mu.Unlock()
	// A refusal is logged when it starts (a Cloudly without the call refuses it every minute),
	// then counted only.
	ev := p.log.Debug()
	if err != nil && changed {
		ev = p.log.Warn()
	}
	ev.Str("method", contracts.MethodGetClusterPlatformDesiredState).Int("answer_bytes", len(body)).Str("outcome", out).
		Dur("latency", p.clock.Since(start)).Msg("platform desired state pulled")
	p.mu.Lock()
	if err != nil {
		p.mu.Unlock()
		return
	}
	p.revision++
	rev := p.revision
	nodes := p.nodeList()
	p.mu.Unlock()
	ids := make([]string, len(nodes))
	for i, n := range nodes {
		ids[i] = n.id
	}
	bodies := st.SplitByNode(ids)
	for _, n := range nodes {
		n.setDesired(rev, bodies[n.id])
	}
}
