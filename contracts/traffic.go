package contracts

import (
	"encoding/json"
	"strconv"
	"time"

	"code.foss.global/serve.zone/relay/contracts/strictjson"
)

// Traffic statistics: getClusterTrafficStatistics { fromDayUtc, toDayUtc, cursor?, limit } →
// { statistics, nextCursor? }, Cloudly → relay → ingress (seed-defined shape, docs/protocol.md#cluster-ingress, read
// exactly). The day format, the limit bounds, the cursor grammar and the element's key names are
// project-defined: the relay reads an element tolerantly — its dayUtc and nodeId when it
// has them — and passes it on byte for byte.

// MethodGetClusterTrafficStatistics is declared in methods.go (Cloudly → relay → ingress).

// Project-defined bounds.
const (
	// MinTrafficStatisticsLimit is the least limit; MaxTrafficStatisticsLimit the most day buckets
	// one page holds (a greater limit is served as it). 1 000 buckets are about 250 KB of JSON.
	MinTrafficStatisticsLimit = 1
	MaxTrafficStatisticsLimit = 1000
	// MaxTrafficStatisticsCursorBytes bounds a cursor: 1 to this many printable ASCII characters
	// (0x21–0x7E). The relay's cursor carries every ingress's own cursor, so it is generous.
	MaxTrafficStatisticsCursorBytes = 1 << 20
)

// IsUTCCalendarDay reports whether s is a UTC calendar day YYYY-MM-DD that exists (2024-02-29
// does, 2023-02-29 does not). Project-defined form of the seed's isUtcCalendarDay.
func IsUTCCalendarDay(s string) bool {
	if len(s) != 10 {
		return false
	}
	t, err := time.Parse(time.DateOnly, s)
	return err == nil && t.Format(time.DateOnly) == s
}

// IsTrafficStatisticsCursor reports whether s is a cursor: 1 to MaxTrafficStatisticsCursorBytes
// printable ASCII characters without space.
func IsTrafficStatisticsCursor(s string) bool {
	if s == "" || len(s) > MaxTrafficStatisticsCursorBytes {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < 0x21 || s[i] > 0x7E {
			return false
		}
	}
	return true
}

// TrafficStatisticsRequest is getClusterTrafficStatistics's request. Cursor is "" when absent.
type TrafficStatisticsRequest struct {
	FromDayUTC string
	ToDayUTC   string
	Cursor     string
	Limit      int
}

// ValidateGetClusterTrafficStatisticsRequest names every reason body is not a statistics
// request; path defaults to "cluster traffic statistics request".
func ValidateGetClusterTrafficStatisticsRequest(body []byte, path string) []string {
	_, reasons := readTrafficStatisticsRequest(body, path)
	return reasons
}

// ReadGetClusterTrafficStatisticsRequest reads a statistics request, or an *InvalidError.
func ReadGetClusterTrafficStatisticsRequest(body []byte) (TrafficStatisticsRequest, error) {
	r, reasons := readTrafficStatisticsRequest(body, "")
	if len(reasons) > 0 {
		return TrafficStatisticsRequest{}, &InvalidError{Reasons: reasons}
	}
	return r, nil
}

func readTrafficStatisticsRequest(body []byte, path string) (TrafficStatisticsRequest, []string) {
	if path == "" {
		path = "cluster traffic statistics request"
	}
	var fromRaw, toRaw, cursor, limit []byte
	if strictjson.ReadExact(body, strictjson.Req("fromDayUtc", &fromRaw), strictjson.Req("toDayUtc", &toRaw), strictjson.Opt("cursor", &cursor), strictjson.Req("limit", &limit)) != nil {
		return TrafficStatisticsRequest{}, []string{path + " must use its exact schema"}
	}
	var r TrafficStatisticsRequest
	var reasons []string
	from, err1 := strictjson.ReadString(fromRaw)
	if err1 != nil || !IsUTCCalendarDay(from) {
		reasons = append(reasons, path+" fromDayUtc must be a UTC calendar day YYYY-MM-DD")
	}
	to, err2 := strictjson.ReadString(toRaw)
	if err2 != nil || !IsUTCCalendarDay(to) {
		reasons = append(reasons, path+" toDayUtc must be a UTC calendar day YYYY-MM-DD")
	}
	// toDayUtc before fromDayUtc names no day: the seeds do not refuse it, and the relay answers it
	// with no bucket (TrafficStatisticsRequest.Empty).
	r.FromDayUTC, r.ToDayUTC = from, to
	if cursor != nil {
		s, err := strictjson.ReadString(cursor)
		if err != nil || !IsTrafficStatisticsCursor(s) {
			reasons = append(reasons, path+" cursor must be 1 to 1048576 printable ASCII characters")
		}
		r.Cursor = s
	}
	// The seeds spell limit and no bound on it. One above MaxTrafficStatisticsLimit is served as
	// MaxTrafficStatisticsLimit: a page holds at most limit buckets, and a shorter one with its
	// nextCursor is a page all the same. One below 1 asks for a page that cannot move.
	n, ok := strictjson.ReadSafeInteger(limit)
	if !ok || n < MinTrafficStatisticsLimit {
		reasons = append(reasons, path+" limit must be a positive integer")
	}
	r.Limit = int(min(n, MaxTrafficStatisticsLimit))
	return r, reasons
}

// Empty reports whether the request names no day (toDayUtc before fromDayUtc): its answer holds no
// bucket and no nextCursor.
func (r TrafficStatisticsRequest) Empty() bool { return r.ToDayUTC < r.FromDayUTC }

// Encode writes the request in the seed's key order; the cursor is omitted when "".
func (r TrafficStatisticsRequest) Encode() []byte {
	b := strictjson.AppendString([]byte(`{"fromDayUtc":`), r.FromDayUTC)
	b = strictjson.AppendString(append(b, `,"toDayUtc":`...), r.ToDayUTC)
	if r.Cursor != "" {
		b = strictjson.AppendString(append(b, `,"cursor":`...), r.Cursor)
	}
	b = strconv.AppendInt(append(b, `,"limit":`...), int64(r.Limit), 10)
	return append(b, '}')
}

// TrafficStatisticsPage is getClusterTrafficStatistics's answer as the relay reads it.
type TrafficStatisticsPage struct {
	Buckets    []TrafficBucket // the statistics elements, in order
	NextCursor string          // "" when absent: nothing follows
}

// TrafficBucket is one statistics element as the relay reads it: tolerantly, since its key names
// are this project's guess. Nothing of it is required; what the relay does with an element
// it cannot read is the caller's choice.
type TrafficBucket struct {
	Raw json.RawMessage // exactly as received
	// Object is false when the element is not an object, or repeats dayUtc or nodeId.
	Object bool
	// Day is dayUtc when that is a UTC calendar day, "" when absent or in another form.
	Day string
	// NodeStated is whether the element has a nodeId member; NodeID is its value when that is a
	// string, "" otherwise.
	NodeStated bool
	NodeID     string
}

// ReadGetClusterTrafficStatisticsResponse reads an answer to req: { statistics, nextCursor? }
// (seed-spelled, exact keys) with at most req.Limit elements, each read as a TrafficBucket. Path
// "cluster traffic statistics page".
func ReadGetClusterTrafficStatisticsResponse(body []byte, req TrafficStatisticsRequest) (TrafficStatisticsPage, error) {
	const path = "cluster traffic statistics page"
	var statistics, nextCursor []byte
	if strictjson.ReadExact(body, strictjson.Req("statistics", &statistics), strictjson.Opt("nextCursor", &nextCursor)) != nil {
		return TrafficStatisticsPage{}, &InvalidError{[]string{path + " must use its exact schema"}}
	}
	var p TrafficStatisticsPage
	var reasons []string
	elems, err := strictjson.ReadArray(statistics)
	if err != nil || len(elems) > req.Limit {
		reasons = append(reasons, path+" statistics must be an array of at most limit elements")
		elems = nil
	}
	p.Buckets = make([]TrafficBucket, 0, len(elems))
	for _, e := range elems {
		p.Buckets = append(p.Buckets, readTrafficBucket(e))
	}
	if nextCursor != nil {
		s, err := strictjson.ReadString(nextCursor)
		if err != nil || !IsTrafficStatisticsCursor(s) {
			reasons = append(reasons, path+" nextCursor must be 1 to 1048576 printable ASCII characters")
		}
		p.NextCursor = s
	}
	if len(reasons) > 0 {
		return TrafficStatisticsPage{}, &InvalidError{Reasons: reasons}
	}
	return p, nil
}

func readTrafficBucket(raw []byte) TrafficBucket {
	b := TrafficBucket{Raw: raw}
	var day, node []byte
	if strictjson.KindOf(raw) != strictjson.KindObject || strictjson.ReadTolerant(raw, strictjson.Opt("dayUtc", &day), strictjson.Opt("nodeId", &node)) != nil {
		return b
	}
	b.Object = true
	if s, err := strictjson.ReadString(day); err == nil && IsUTCCalendarDay(s) {
		b.Day = s
	}
	if node != nil {
		b.NodeStated = true
		b.NodeID, _ = strictjson.ReadString(node)
	}
	return b
}

// ClusterTrafficStatistics is IClusterTrafficStatistics: one UTC day of one hostname's traffic on
// one node. Project-defined key names; the seed names the counters requests, bytesIn,
// bytesOut, connections and the backend failures connect, handshake and request. The relay reads
// only DayUTC and NodeID (TrafficBucket); the simulator and tests use the whole shape.
type ClusterTrafficStatistics struct {
	DayUTC      string          `json:"dayUtc"`
	NodeID      string          `json:"nodeId"`
	Hostname    string          `json:"hostname"`
	Requests    int64           `json:"requests"`
	BytesIn     int64           `json:"bytesIn"`
	BytesOut    int64           `json:"bytesOut"`
	Connections int64           `json:"connections"`
	Failures    TrafficFailures `json:"failures"`
}

// TrafficFailures are the backend failures the proxy can observe.
type TrafficFailures struct {
	Connect   int64 `json:"connect"`
	Handshake int64 `json:"handshake"`
	Request   int64 `json:"request"`
}
