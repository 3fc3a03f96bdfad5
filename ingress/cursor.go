package ingress

import (
	"encoding/base64"
	"strconv"
	"strings"

	"code.foss.global/serve.zone/relay/contracts"
	"code.foss.global/serve.zone/relay/contracts/strictjson"
)

// The relay's statistics cursor (project-defined): "c1." and the base64url (no padding) of
// a JSON object { fromDayUtc, toDayUtc, ingress: [{ nodeId, cursor?, done?, failures? }] } listing
// every ingress the paging has met, by node id ascending, with that ingress's own cursor. It is
// opaque to Cloudly, holds no state on the relay, and is only valid for the days it was minted
// for. It names node ids and ingress cursors, nothing secret.

const cursorPrefix = "c1."

// position is one ingress's place in a paging.
type position struct {
	node     string
	cursor   string // the ingress's own nextCursor; "" means from its start
	done     bool   // the ingress answered without nextCursor
	failures int    // pages in a row this ingress failed
}

// finished reports whether paging asks this ingress no more: read to its end, or given up.
func (p position) finished() bool { return p.done || p.failures >= maxPageFailures }

func encodeCursor(from, to string, ps []position) string {
	b := strictjson.AppendString([]byte(`{"fromDayUtc":`), from)
	b = strictjson.AppendString(append(b, `,"toDayUtc":`...), to)
	b = append(b, `,"ingress":[`...)
	for i, p := range ps {
		if i > 0 {
			b = append(b, ',')
		}
		b = strictjson.AppendString(append(b, `{"nodeId":`...), p.node)
		if p.cursor != "" {
			b = strictjson.AppendString(append(b, `,"cursor":`...), p.cursor)
		}
		if p.done {
			b = append(b, `,"done":true`...)
		}
		if p.failures > 0 {
			b = strconv.AppendInt(append(b, `,"failures":`...), int64(p.failures), 10)
		}
		b = append(b, '}')
	}
	b = append(b, "]}"...)
	return cursorPrefix + base64.RawURLEncoding.EncodeToString(b)
}

// decodeCursor reads a cursor minted by encodeCursor for the same days, exactly: the relay mints
// it, Cloudly hands it back, and a peer's bytes are read one way only.
func decodeCursor(s, from, to string) ([]position, bool) {
	rest, ok := strings.CutPrefix(s, cursorPrefix)
	if !ok {
		return nil, false
	}
	raw, err := base64.RawURLEncoding.Strict().DecodeString(rest)
	if err != nil {
		return nil, false
	}
	var fromRaw, toRaw, ingress []byte
	if strictjson.ReadExact(raw, strictjson.Req("fromDayUtc", &fromRaw), strictjson.Req("toDayUtc", &toRaw),
		strictjson.Req("ingress", &ingress)) != nil {
		return nil, false
	}
	if f, err := strictjson.ReadString(fromRaw); err != nil || f != from {
		return nil, false
	}
	if t, err := strictjson.ReadString(toRaw); err != nil || t != to {
		return nil, false
	}
	elems, err := strictjson.ReadArray(ingress)
	if err != nil {
		return nil, false
	}
	ps := make([]position, 0, len(elems))
	for _, e := range elems {
		var nodeID, cursor, done, failures []byte
		if strictjson.ReadExact(e, strictjson.Req("nodeId", &nodeID), strictjson.Opt("cursor", &cursor),
			strictjson.Opt("done", &done), strictjson.Opt("failures", &failures)) != nil {
			return nil, false
		}
		var p position
		if p.node, err = strictjson.ReadString(nodeID); err != nil || !contracts.IsClusterNodeID(p.node) ||
			len(ps) > 0 && p.node <= ps[len(ps)-1].node {
			return nil, false
		}
		if cursor != nil {
			if p.cursor, err = strictjson.ReadString(cursor); err != nil || !contracts.IsTrafficStatisticsCursor(p.cursor) || len(p.cursor) > maxIngressCursorBytes {
				return nil, false
			}
		}
		if done != nil {
			if v, ok := strictjson.ReadBool(done); !ok || !v {
				return nil, false
			}
			p.done = true
		}
		if failures != nil {
			n, ok := strictjson.ReadCounter(failures)
			if !ok || n < 1 || n > maxPageFailures {
				return nil, false
			}
			p.failures = int(n)
		}
		ps = append(ps, p)
	}
	return ps, true
}
