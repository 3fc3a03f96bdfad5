package contracts

import (
	"encoding/json"
	"strconv"
	"time"
)

// Traffic statistics: getClusterTrafficStatistics { fromDayUtc, toDayUtc, cursor?, limit } →
// { statistics, nextCursor? }, Cloudly → relay → ingress (seed-defined shape, SPEC §8). The day
// format, the limit bounds, the cursor grammar and the element's key names are project-defined
// (OQ-15); the relay reads only an element's dayUtc and keeps the rest opaque.

// MethodGetClusterTrafficStatistics is declared in methods.go (Cloudly → relay → ingress).

// Project-defined bounds (OQ-15).
const (
	// MinTrafficStatisticsLimit and MaxTrafficStatisticsLimit bound limit: the number of day
	// buckets one page holds at most. 1 000 buckets are about 250 KB of JSON.
	MinTrafficStatisticsLimit = 1
	MaxTrafficStatisticsLimit = 1000
	// MaxTrafficStatisticsCursorBytes bounds a cursor: 1 to this many printable ASCII characters
	// (0x21–0x7E). The relay's cursor carries every ingress's own cursor, so it is generous.
	MaxTrafficStatisticsCursorBytes = 1 << 20
)

// IsUTCCalendarDay reports whether s is a UTC calendar day YYYY-MM-DD that exists (2024-02-29
// does, 2023-02-29 does not). Project-defined form of the seed's isUtcCalendarDay (OQ-15).
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
	members, err := ReadObject(body)
	if err != nil || !hasExactKeys(members, "fromDayUtc", "toDayUtc", "limit", "?", "cursor") {
		return TrafficStatisticsRequest{}, []string{path + " must use its exact schema"}
	}
	m := byKey(members)
	var r TrafficStatisticsRequest
	var reasons []string
	from, err1 := ReadString(m["fromDayUtc"])
	if err1 != nil || !IsUTCCalendarDay(from) {
		reasons = append(reasons, path+" fromDayUtc must be a UTC calendar day YYYY-MM-DD")
	}
	to, err2 := ReadString(m["toDayUtc"])
	if err2 != nil || !IsUTCCalendarDay(to) {
		reasons = append(reasons, path+" toDayUtc must be a UTC calendar day YYYY-MM-DD")
	}
	if len(reasons) == 0 && to < from {
		reasons = append(reasons, path+" toDayUtc must not be before fromDayUtc")
	}
	r.FromDayUTC, r.ToDayUTC = from, to
	if c, ok := m["cursor"]; ok {
		s, err := ReadString(c)
		if err != nil || !IsTrafficStatisticsCursor(s) {
			reasons = append(reasons, path+" cursor must be 1 to 1048576 printable ASCII characters")
		}
		r.Cursor = s
	}
	n, ok := ReadSafeInteger(m["limit"])
	if !ok || n < MinTrafficStatisticsLimit || n > MaxTrafficStatisticsLimit {
		reasons = append(reasons, path+" limit must be an integer from 1 to 1000")
	}
	r.Limit = int(n)
	return r, reasons
}

// Encode writes the request in the seed's key order; the cursor is omitted when "".
func (r TrafficStatisticsRequest) Encode() []byte {
	b := AppendString([]byte(`{"fromDayUtc":`), r.FromDayUTC)
	b = AppendString(append(b, `,"toDayUtc":`...), r.ToDayUTC)
	if r.Cursor != "" {
		b = AppendString(append(b, `,"cursor":`...), r.Cursor)
	}
	b = strconv.AppendInt(append(b, `,"limit":`...), int64(r.Limit), 10)
	return append(b, '}')
}

// TrafficStatisticsPage is getClusterTrafficStatistics's answer as the relay reads it.
type TrafficStatisticsPage struct {
	Statistics []json.RawMessage // each element exactly as received
	Days       []string          // Days[i] is Statistics[i]'s dayUtc
	NextCursor string            // "" when absent: nothing follows
}

// ReadGetClusterTrafficStatisticsResponse reads an answer to req: { statistics, nextCursor? }
// with at most req.Limit elements, each an object whose dayUtc lies from req.FromDayUTC to
// req.ToDayUTC. Elements are otherwise opaque. Path "cluster traffic statistics page".
func ReadGetClusterTrafficStatisticsResponse(body []byte, req TrafficStatisticsRequest) (TrafficStatisticsPage, error) {
	const path = "cluster traffic statistics page"
	members, err := ReadObject(body)
	if err != nil || !hasExactKeys(members, "statistics", "?", "nextCursor") {
		return TrafficStatisticsPage{}, &InvalidError{[]string{path + " must use its exact schema"}}
	}
	m := byKey(members)
	var p TrafficStatisticsPage
	var reasons []string
	elems, err := ReadArray(m["statistics"])
	if err != nil || len(elems) > req.Limit {
		reasons = append(reasons, path+" statistics must be an array of at most limit elements")
	}
	for i, e := range elems {
		day, ok := statisticsDay(e)
		if !ok || day < req.FromDayUTC || day > req.ToDayUTC {
			reasons = append(reasons, path+" statistics["+strconv.Itoa(i)+"] must be an object whose dayUtc is a requested UTC calendar day")
			continue
		}
		p.Statistics = append(p.Statistics, e)
		p.Days = append(p.Days, day)
	}
	if c, ok := m["nextCursor"]; ok {
		s, err := ReadString(c)
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

func statisticsDay(raw []byte) (string, bool) {
	if KindOf(raw) != KindObject {
		return "", false
	}
	v, ok, err := Lookup(raw, "dayUtc")
	if err != nil || !ok {
		return "", false
	}
	day, err := ReadString(v)
	return day, err == nil && IsUTCCalendarDay(day)
}

// ClusterTrafficStatistics is IClusterTrafficStatistics: one UTC day of one hostname's traffic on
// one node. Project-defined key names (OQ-15); the seed names the counters requests, bytesIn,
// bytesOut, connections and the backend failures connect, handshake and request. The relay reads
// only DayUTC; the simulator and tests use the whole shape.
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

// ValidateClusterTrafficStatistics names every reason raw is not one day bucket; path defaults
// to "cluster traffic statistics".
func ValidateClusterTrafficStatistics(raw []byte, path string) []string {
	if path == "" {
		path = "cluster traffic statistics"
	}
	members, err := ReadObject(raw)
	if err != nil || !hasExactKeys(members, "dayUtc", "nodeId", "hostname", "requests", "bytesIn", "bytesOut", "connections", "failures") {
		return []string{path + " must use its exact schema"}
	}
	m := byKey(members)
	var reasons []string
	if s, err := ReadString(m["dayUtc"]); err != nil || !IsUTCCalendarDay(s) {
		reasons = append(reasons, path+" dayUtc must be a UTC calendar day YYYY-MM-DD")
	}
	if s, err := ReadString(m["nodeId"]); err != nil || !IsClusterNodeID(s) {
		reasons = append(reasons, path+" nodeId must be a cluster node id")
	}
	if s, err := ReadString(m["hostname"]); err != nil || !isCanonicalHostname(s) {
		reasons = append(reasons, path+" hostname must be a lowercase DNS name")
	}
	for _, k := range [...]string{"requests", "bytesIn", "bytesOut", "connections"} {
		if _, ok := ReadCounter(m[k]); !ok {
			reasons = append(reasons, path+" "+k+" must be a non-negative safe integer")
		}
	}
	fm, err := ReadObject(m["failures"])
	if err != nil || !hasExactKeys(fm, "connect", "handshake", "request") {
		return append(reasons, path+" failures must use its exact schema")
	}
	f := byKey(fm)
	for _, k := range [...]string{"connect", "handshake", "request"} {
		if _, ok := ReadCounter(f[k]); !ok {
			reasons = append(reasons, path+" failures "+k+" must be a non-negative safe integer")
		}
	}
	return reasons
}
