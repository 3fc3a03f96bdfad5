package ingress

import (
	"encoding/json"
	"time"

	"code.foss.global/serve.zone/relay/contracts"
	"code.foss.global/serve.zone/relay/feature"
)

// heldTable is the route table the relay holds, with its answers encoded once. Tables are MiB
// and read by every ingress: a read hands out answer as is and never copies or re-encodes it.
// Immutable once stored; memory only (a table carries certificates and keys).
type heldTable struct {
	table  contracts.RouteTable // table.Raw is a sub-slice of answer: one copy per revision
	answer json.RawMessage      // {"table":…} for getClusterIngressRouteTable
	hint   json.RawMessage      // {"revision":N} for pushClusterIngressRouteTableChanged
	at     time.Time            // when it arrived and replaced the one held; zero for the initial null
}

func newHeldTable(t contracts.RouteTable, at time.Time) *heldTable {
	h := &heldTable{answer: contracts.EncodeRouteTableAnswer(t), at: at}
	if !t.IsNull() {
		h.table = contracts.RouteTable{Raw: h.answer[len(`{"table":`) : len(h.answer)-1], Revision: t.Revision, Derived: t.Derived}
		h.hint = contracts.EncodeClusterIngressRouteTableChange(t.Revision)
	}
	return h
}

// newer reports whether t should replace held: null is never newer (Cloudly having computed no
// table is not news once a table is held), any table is newer than null, and two tables that
// state revisions are ordered by them. A table that states none has a revision derived from its
// bytes, which orders nothing: when either table is one, the one that arrived last replaces the
// other unless they are the same table (same bytes, so the same derived revision).
func newer(t, held contracts.RouteTable) bool {
	switch {
	case t.IsNull():
		return false
	case held.IsNull():
		return true
	case t.Derived || held.Derived:
		return t.Derived != held.Derived || t.Revision != held.Revision
	}
	return t.Revision > held.Revision
}

// PushRouteTable serves pushClusterRouteTable { table } from Cloudly: a newer revision replaces
// the table held; the answer { appliedRevision } states the revision held afterwards, so an older
// push is answered with the newer revision the relay keeps.
func (s *Server) PushRouteTable(body json.RawMessage) (json.RawMessage, error) {
	t, err := contracts.ReadPushClusterRouteTableRequest(body)
	if err != nil {
		s.metrics.tableUpdates.WithLabelValues("push", "invalid").Inc()
		s.log.Warn().Str("method", contracts.MethodPushClusterRouteTable).Int("bytes", len(body)).Str("outcome", "malformed").Msg("route table push refused")
		return nil, errInvalid(err)
	}
	h := s.apply(t, "push")
	return contracts.EncodeAppliedRevision(h.table), nil
}

// pull asks Cloudly for the table it holds now (getClusterRouteTable {}). A failed pull keeps the
// table held; the next attach or push brings the news.
func (s *Server) pull(up feature.Upstream) {
	up.Call(contracts.MethodGetClusterRouteTable, json.RawMessage(`{}`), func(resp json.RawMessage, err error) {
		if err != nil {
			s.metrics.tableUpdates.WithLabelValues("pull", "failed").Inc()
			s.log.Warn().Str("method", contracts.MethodGetClusterRouteTable).Str("outcome", outcomeOf(err)).Msg("route table pull failed; serving the table held")
			return
		}
		t, err := contracts.ReadGetClusterRouteTableResponse(resp)
		if err != nil {
			s.metrics.tableUpdates.WithLabelValues("pull", "invalid").Inc()
			s.log.Warn().Str("method", contracts.MethodGetClusterRouteTable).Int("bytes", len(resp)).Str("outcome", "malformed").Msg("route table pull unreadable; serving the table held")
			return
		}
		s.apply(t, "pull")
	})
}

// apply stores t when it is newer than the table held, then hints every ingress connection.
// It returns the table held afterwards.
func (s *Server) apply(t contracts.RouteTable, source string) *heldTable {
	s.applyMu.Lock()
	cur := s.held.Load()
	if !newer(t, cur.table) {
		s.applyMu.Unlock()
		s.metrics.tableUpdates.WithLabelValues(source, "stale").Inc()
		ev := s.log.Debug().Str("outcome", "stale").Str("method", sourceMethod(source))
		if !t.IsNull() {
			ev = ev.Int64("revision", t.Revision)
		}
		ev.Msg("route table not newer than the one held")
		return cur
	}
	h := newHeldTable(t, time.Now())
	s.held.Store(h)
	s.applyMu.Unlock()

	s.metrics.tableUpdates.WithLabelValues(source, "applied").Inc()
	s.metrics.tableRevision.Set(float64(t.Revision))
	s.metrics.tableBytes.Set(float64(len(h.table.Raw)))
	s.log.Info().Str("outcome", "applied").Str("method", sourceMethod(source)).Int64("revision", t.Revision).Int("bytes", len(h.table.Raw)).Msg("route table held")
	s.hintAll(h)
	return h
}

// sourceMethod names the method a table came with, for logs.
func sourceMethod(source string) string {
	if source == "push" {
		return contracts.MethodPushClusterRouteTable
	}
	return contracts.MethodGetClusterRouteTable
}

// hintAll sends every ingress connection pushClusterIngressRouteTableChanged { revision }, fire
// and forget: a lost or repeated hint is harmless (the ingress pulls only for a newer revision,
// and reads the table after it registers anyway). Sending never blocks on a slow ingress.
func (s *Server) hintAll(h *heldTable) {
	for _, c := range s.connections() {
		c.peer.Call(contracts.MethodPushClusterIngressRouteTableChanged, h.hint, func(_ json.RawMessage, err error) {
			s.metrics.hints.WithLabelValues(hintOutcome(err)).Inc()
		})
	}
}

func hintOutcome(err error) string {
	if err == nil {
		return "answered"
	}
	return outcomeOf(err)
}

// RouteTable serves getClusterIngressRouteTable { knownRevision } for an accepted ingress
// connection: the table held (null while Cloudly has computed none), whatever knownRevision says
// — the ingress decides whether it is news. Any other connection is refused relay-ingress-only.
// The answer is the bytes encoded when the table arrived; it is shared, never copied here.
func (s *Server) RouteTable(p feature.Peer, body json.RawMessage) (json.RawMessage, error) {
	if !s.IsIngress(p) {
		s.metrics.tableReads.WithLabelValues(string(contracts.RelayIngressOnly)).Inc()
		s.log.Debug().Str("method", contracts.MethodGetClusterIngressRouteTable).Str("outcome", string(contracts.RelayIngressOnly)).Msg("route table refused")
		return nil, errNotIngress(contracts.MethodGetClusterIngressRouteTable)
	}
	if _, err := contracts.ReadGetClusterIngressRouteTableRequest(body); err != nil {
		s.metrics.tableReads.WithLabelValues(string(contracts.RelayRequestInvalid)).Inc()
		return nil, errInvalid(err)
	}
	s.metrics.tableReads.WithLabelValues("served").Inc()
	return s.held.Load().answer, nil
}
