package relay

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"code.foss.global/serve.zone/relay/contracts"
	"code.foss.global/serve.zone/relay/status"
)

// Snapshot is the relay's facts at now, for the status page (status.Source): plain data copied
// from the counters and states the relay and its parts keep anyway; never a secret or a body. Its
// cost is bounded: a relay carrying 10 000 nodes lists the busiest status.NodeRows of them. The
// admin server adds the uptime, its own address and the counters.
func (r *Relay) Snapshot(now time.Time) status.Snapshot {
	st := status.Snapshot{
		Now: now, Ready: "ready", Role: r.role(),
		Addresses: status.Addresses{Advertise: r.cfg.AdvertiseAddress, HubListen: r.cfg.HubListen, HubAdvertise: r.cfg.HubAdvertiseAddress,
			Hub: r.up.hub.addr, HubBound: r.up.hub.bound},
		Build: status.Build{Version: r.cfg.BuildVersion, InterfacesVersion: contracts.InterfacesVersion,
			MinimumPeerVersion: contracts.MinimumPeerVersion, ClusterID: r.cfg.ClusterID, NodeID: r.cfg.NodeID},
		Cloudly: status.Cloudly{Custody: "held", URL: redactURL(r.cfg.CloudlyURL), History: r.up.hist.History(), HubReport: r.up.hub.status()},
		Downstream: status.Downstream{Unregistered: r.down.waiting.Load(), Streams: r.streams.len(),
			BudgetUsedBytes: r.down.budget.Used(), BudgetLimitBytes: r.down.budget.Limit(), BudgetEvictions: r.down.budget.Evictions(),
			UpstreamQueued: r.up.queueLen()},
	}
	if s := r.up.state.Load(); s != nil {
		st.Cloudly.Attached, st.Cloudly.Since, st.Cloudly.Sequence, st.Cloudly.Origin = s.attached, s.since, s.sequence, s.origin
	}
	switch {
	case st.Cloudly.Attached:
	case st.Role == status.RoleStandby:
		st.Cloudly.Reason = "standing by: only the elected relay dials Cloudly"
	default:
		st.Cloudly.Reason = st.Cloudly.DetachedReason(now)
	}
	if err := r.ready(); err != nil {
		st.Ready = err.Error()
	}
	if r.cfg.RegistryUpstream != "" {
		st.Addresses.RegistryUpstream = redactURL(r.cfg.RegistryUpstream)
	}
	if r.downLn != nil {
		st.Addresses.Listen = r.downLn.Addr().String()
	}
	st.Certificates.Cloudly = st.Cloudly.PeerCert
	if r.certs != nil {
		st.Certificates.Downstream = r.certs.info()
	}
	if name := r.custody.endedBy(); name != "" {
		st.Cloudly.Custody = string(name)
	}
	if r.elector != nil {
		st.HA = r.elector.Status()
	}
	peers := r.down.peers.snapshot()
	st.Downstream.Connections = len(peers)
	var nodes []status.Node
	for _, p := range peers {
		id := p.nodeID()
		if id == "" {
			continue
		}
		nodes = append(nodes, status.Node{Node: id, ConnectedSince: p.since, RequestsToCloudly: p.toCloudly.Load(),
			RequestsToNode: p.toNode.Load(), BusyRefusals: p.busy.Load(), QueuedFrames: p.conn.QueueLen(), HeldBytes: p.share.Used()})
	}
	st.Nodes.Count = len(nodes)
	slices.SortFunc(nodes, func(a, b status.Node) int {
		return cmp.Or(cmp.Compare(b.RequestsToCloudly+b.RequestsToNode, a.RequestsToCloudly+a.RequestsToNode), strings.Compare(a.Node, b.Node))
	})
	st.Nodes.Busiest = nodes[:min(len(nodes), status.NodeRows)]
	for _, c := range r.parts.components {
		ready := "ready"
		if err := c.v.Ready(); err != nil {
			ready = err.Error()
		}
		st.Parts = append(st.Parts, status.Part{Name: c.name, Ready: ready})
	}
	for _, p := range r.parts.reporters {
		i := slices.IndexFunc(st.Parts, func(s status.Part) bool { return s.Name == p.name })
		if i < 0 {
			st.Parts = append(st.Parts, status.Part{Name: p.name, Ready: "ready"})
			i = len(st.Parts) - 1
		}
		st.Parts[i].Status = p.v.Status()
	}
	return st
}

// Ready is /readyz's answer (status.Source): a line when the relay could serve now, or why not.
func (r *Relay) Ready() (string, error) {
	if err := r.ready(); err != nil {
		return "", err
	}
	if r.elector != nil && !r.leading.Load() {
		return "ready: standby, could lead", nil
	}
	return "ready", nil
}

// ready says why the relay cannot serve now: shutting down, detached from Cloudly (and why), or
// a component not ready. An HA standby is ready while it could lead.
func (r *Relay) ready() error {
	switch {
	case r.draining.Load():
		return errors.New("shutting down")
	case r.elector != nil && !r.leading.Load():
		if err := r.elector.Ready(); err != nil {
			return fmt.Errorf("standby: %w", err)
		}
	case !r.up.Attached():
		return errors.New("detached: " + r.up.hist.History().DetachedReason(r.now()))
	}
	for _, c := range r.parts.components {
		if err := c.v.Ready(); err != nil {
			return fmt.Errorf("%s: %w", c.name, err)
		}
	}
	return nil
}
