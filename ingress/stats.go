package ingress

import (
	"encoding/json"
	"sort"
	"sync"
	"time"

	"code.foss.global/serve.zone/relay/contracts"
	"code.foss.global/serve.zone/relay/contracts/strictjson"
	"code.foss.global/serve.zone/relay/feature"
)

// TrafficStatistics serves getClusterTrafficStatistics { fromDayUtc, toDayUtc, cursor?, limit }
// from Cloudly: it asks every accepted ingress connection (the newest of each node) for its next
// day buckets, from where the cursor says that ingress stopped, and answers
// { statistics, nextCursor? } with the buckets merged in day order.
//
// limit is split across the ingresses still to be read, so a page never holds more than limit
// buckets and never has to cut an ingress's page (whose own cursor is opaque). An ingress that
// fails is reported — metrics and a log line — and is not fatal: its position stays in the cursor,
// so the next page asks it again, up to maxPageFailures pages in a row. nextCursor is absent once
// every ingress is read to the end or given up.
func (s *Server) TrafficStatistics(body json.RawMessage, reply func(json.RawMessage, error)) {
	req, err := contracts.ReadGetClusterTrafficStatisticsRequest(body)
	if err != nil {
		s.statsRefused(reply, errInvalid(err))
		return
	}
	if req.Empty() {
		reply(json.RawMessage(`{"statistics":[]}`), nil) // no day named, no ingress asked
		return
	}
	var ps []position
	if req.Cursor != "" {
		var ok bool
		if ps, ok = decodeCursor(req.Cursor, req.FromDayUTC, req.ToDayUTC); !ok {
			s.statsRefused(reply, errBadCursor)
			return
		}
	}
	conns := s.nodes()
	known := make(map[string]bool, len(ps))
	for _, p := range ps {
		known[p.node] = true
	}
	for node := range conns {
		if !known[node] {
			ps = append(ps, position{node: node}) // an ingress the cursor has not met: from its start
		}
	}
	sort.Slice(ps, func(i, j int) bool { return ps[i].node < ps[j].node })

	pg := &statsPage{s: s, req: req, ps: ps, results: make([]pageResult, len(ps)), reply: reply}
	var avail []int
	for i, p := range ps {
		switch {
		case p.finished():
		case conns[p.node] == nil:
			pg.results[i] = pageResult{state: resultFailed, reason: failGone}
		default:
			avail = append(avail, i)
		}
	}
	if len(avail) > req.Limit {
		avail = avail[:req.Limit] // one bucket each; the rest wait for the next page
	}
	if len(avail) == 0 {
		pg.finish()
		return
	}
	// Everything the calls need is read from ps now: once the first call is out, finish may run
	// (the timer, or a synchronous failure) and it owns ps.
	type call struct {
		i    int
		node string
		peer feature.Peer
		sub  contracts.TrafficStatisticsRequest
	}
	calls := make([]call, len(avail))
	per, rem := req.Limit/len(avail), req.Limit%len(avail)
	for k, i := range avail {
		calls[k] = call{i, ps[i].node, conns[ps[i].node].peer, contracts.TrafficStatisticsRequest{
			FromDayUTC: req.FromDayUTC, ToDayUTC: req.ToDayUTC, Cursor: ps[i].cursor, Limit: per}}
		if k < rem {
			calls[k].sub.Limit++
		}
		pg.results[i].state = resultPending
	}
	pg.mu.Lock()
	pg.waiting = len(calls)
	pg.timer = time.AfterFunc(s.statsTimeout, pg.finish)
	pg.mu.Unlock()
	for _, c := range calls {
		c.peer.Call(contracts.MethodGetClusterTrafficStatistics, c.sub.Encode(), func(resp json.RawMessage, err error) {
			pg.answered(c.i, c.node, c.sub, resp, err)
		})
	}
}

func (s *Server) statsRefused(reply func(json.RawMessage, error), err error) {
	s.metrics.statsPages.WithLabelValues(outcomeOf(err)).Inc()
	reply(nil, err)
}

// Project-defined statistics bounds.
const (
	// maxIngressCursorBytes bounds one ingress's own cursor, which the relay's cursor carries.
	maxIngressCursorBytes = 512
	// maxPageFailures is how many pages in a row one ingress may fail before the cursor stops
	// asking it, so that an ingress gone for good cannot make paging endless.
	maxPageFailures = 3
)

type resultState uint8

const (
	resultNone    resultState = iota // not asked on this page
	resultPending                    // asked, no answer yet
	resultOK
	resultFailed
)

type pageResult struct {
	state   resultState
	reason  string                    // failGone, failTimeout, failRefused or failInvalid
	refusal string                    // the error's label, for failRefused
	buckets []contracts.TrafficBucket // the buckets passed on, for resultOK
	next    string                    // the ingress's nextCursor, for resultOK
}

// statsPage is one getClusterTrafficStatistics in flight.
type statsPage struct {
	s     *Server                            // set at construction
	req   contracts.TrafficStatisticsRequest // set at construction
	ps    []position                         // set at construction; updated by finish alone
	reply func(json.RawMessage, error)       // set at construction; called once, by finish

	mu      sync.Mutex
	results []pageResult // guarded by mu (entries of uncalled positions are set before any call)
	waiting int          // guarded by mu: calls not answered yet
	done    bool         // guarded by mu: finish ran; later answers are ignored
	timer   *time.Timer  // guarded by mu: the statistics timeout, set before the first call
}

func (pg *statsPage) answered(i int, node string, sub contracts.TrafficStatisticsRequest, resp json.RawMessage, err error) {
	r := pageResult{state: resultOK}
	var dropped map[string]int // reason → buckets
	if err != nil {
		r = pageResult{state: resultFailed, reason: failRefused, refusal: contracts.RefusalLabel(err)}
	} else if page, perr := contracts.ReadGetClusterTrafficStatisticsResponse(resp, sub); perr != nil || len(page.NextCursor) > maxIngressCursorBytes {
		r = pageResult{state: resultFailed, reason: failInvalid}
	} else {
		r.next = page.NextCursor
		r.buckets = page.Buckets[:0]
		for _, b := range page.Buckets {
			if reason := judgeBucket(b, node, sub); reason != "" {
				if dropped == nil {
					dropped = make(map[string]int, 3)
				}
				dropped[reason]++
				continue
			}
			r.buckets = append(r.buckets, b)
		}
	}
	pg.mu.Lock()
	if pg.done {
		pg.mu.Unlock()
		return // the page went out without it; the cursor kept its position
	}
	pg.results[i] = r
	pg.waiting--
	last := pg.waiting == 0
	pg.mu.Unlock()
	for reason, n := range dropped {
		pg.s.metrics.statsDropped.WithLabelValues(reason).Add(float64(n))
		pg.s.log.Warn().Str("node", node).Str("method", contracts.MethodGetClusterTrafficStatistics).Str("outcome", reason).
			Msg("ingress statistics buckets dropped")
	}
	if last {
		pg.finish()
	}
}

// judgeBucket is why the relay drops b, a bucket of node's answer to sub, or "" to pass it on.
// What it cannot judge — a bucket without dayUtc or without nodeId — it passes on.
func judgeBucket(b contracts.TrafficBucket, node string, sub contracts.TrafficStatisticsRequest) string {
	switch {
	case !b.Object:
		return dropMalformed
	case b.NodeStated && b.NodeID != node:
		// An ingress reports its own node's traffic only.
		return dropForeignNode
	case b.Day != "" && (b.Day < sub.FromDayUTC || b.Day > sub.ToDayUTC):
		return dropOutOfRange
	}
	return ""
}

// finish answers the page once: with every answer, or when the timeout fires with those in.
func (pg *statsPage) finish() {
	pg.mu.Lock()
	if pg.done {
		pg.mu.Unlock()
		return
	}
	pg.done = true
	results := pg.results
	if pg.timer != nil {
		pg.timer.Stop()
	}
	pg.mu.Unlock()
	s := pg.s

	type bucket struct {
		day string
		raw json.RawMessage
	}
	var buckets []bucket
	size := 0
	for i := range pg.ps {
		p, r := &pg.ps[i], results[i]
		if r.state == resultPending {
			r = pageResult{state: resultFailed, reason: failTimeout}
		}
		switch r.state {
		case resultOK:
			p.cursor, p.done, p.failures = r.next, r.next == "", 0
			for _, b := range r.buckets {
				buckets = append(buckets, bucket{b.Day, b.Raw})
				size += len(b.Raw) + 1
			}
		case resultFailed:
			p.failures++
			s.metrics.statsFailures.WithLabelValues(r.reason).Inc()
			ev := s.log.Warn().Str("node", p.node).Str("method", contracts.MethodGetClusterTrafficStatistics).Str("outcome", r.reason)
			if r.refusal != "" {
				ev = ev.Str("refusal", r.refusal)
			}
			ev.Msg("ingress statistics page failed; the cursor keeps its position")
			if p.failures >= maxPageFailures {
				s.metrics.statsGivenUp.Inc()
				s.log.Warn().Str("node", p.node).Str("method", contracts.MethodGetClusterTrafficStatistics).Str("outcome", "given-up").
					Msg("ingress statistics failed too often; this cursor stops asking it")
			}
		}
	}
	// Merge in day order, buckets without a readable day last; a stable sort keeps node order, then
	// each ingress's own order, within a day.
	sort.SliceStable(buckets, func(i, j int) bool {
		a, b := buckets[i].day, buckets[j].day
		return a != "" && (b == "" || a < b)
	})

	more := false
	for _, p := range pg.ps {
		more = more || !p.finished()
	}
	var next string
	if more {
		next = encodeCursor(pg.req.FromDayUTC, pg.req.ToDayUTC, pg.ps)
	}
	out := make([]byte, 0, size+len(next)+48)
	out = append(out, `{"statistics":[`...)
	for i, b := range buckets {
		if i > 0 {
			out = append(out, ',')
		}
		out = append(out, b.raw...)
	}
	out = append(out, ']')
	if next != "" {
		out = strictjson.AppendString(append(out, `,"nextCursor":`...), next)
	}
	out = append(out, '}')
	s.metrics.statsPages.WithLabelValues("answered").Inc()
	s.metrics.statsBucketsOut.Add(float64(len(buckets)))
	s.log.Debug().Str("method", contracts.MethodGetClusterTrafficStatistics).Int("bytes", len(out)).Str("outcome", "answered").Msg("traffic statistics page")
	pg.reply(out, nil)
}
