package relay

import (
	"bytes"
	"cmp"
	"encoding/json"
	"fmt"
	"html/template"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"code.foss.global/serve.zone/relay/contracts"
)

// The operator's status page (issue 18): /status, one server-rendered HTML page readable in a
// terminal browser, and /status.json with the same facts. Everything comes from counters and
// states the relay and its parts keep anyway; nothing on it is a secret or a body. Its cost is
// bounded: a relay carrying 10 000 nodes lists the busiest statusNodeRows of them.

// statusNodeRows is how many nodes the page lists, the busiest first.
const statusNodeRows = 100

// Status is what /status.json answers.
type Status struct {
	Now time.Time `json:"now"`
	// Ready is what /readyz answers: "ready", or why not ("detached: registration refused
	// relay-cluster-unknown: next retry in 4s", "standby: …", "shutting down").
	Ready string `json:"ready"`
	// Role is "leader" or "standby" with HA (SPEC §16), "single" without.
	Role          string           `json:"role"`
	Started       time.Time        `json:"started"`
	UptimeSeconds int64            `json:"uptimeSeconds"`
	Build         statusBuild      `json:"build"`
	Addresses     statusAddresses  `json:"addresses"`
	Certificates  statusCerts      `json:"certificates"`
	Cloudly       statusCloudly    `json:"cloudly"`
	Downstream    statusDownstream `json:"downstream"`
	Nodes         statusNodes      `json:"nodes"`
	Parts         []statusPart     `json:"parts"`
	// Counters are every relay_* counter /metrics serves, with its rate over the last minute.
	Counters []counterGroup `json:"counters"`
	// HA is the election's facts (SPEC §16: role, holder, since, replication); absent without HA.
	HA any `json:"ha,omitempty"`
}

// statusAddresses are where the relay listens and what it tells others to reach.
type statusAddresses struct {
	Listen           string `json:"listen"`                     // the downstream listener, as bound
	Advertise        string `json:"advertise"`                  // --advertise-address
	Admin            string `json:"admin"`                      // this listener, as bound
	Hub              string `json:"hub,omitempty"`              // the VPN hub's UDP address, as reported; absent while off
	HubListen        string `json:"hubListen,omitempty"`        // --hub-listen
	HubAdvertise     string `json:"hubAdvertise,omitempty"`     // --hub-advertise-address
	RegistryUpstream string `json:"registryUpstream,omitempty"` // --registry-upstream
}

// statusCerts are the certificates in use: names and expiry, never a key.
type statusCerts struct {
	Downstream *certInfo `json:"downstream,omitempty"` // --tls-cert-file's leaf; absent with --insecure-plaintext
	Cloudly    *certInfo `json:"cloudly,omitempty"`    // the leaf Cloudly presented on the newest TLS socket
}

type statusBuild struct {
	Version            string `json:"version"`
	InterfacesVersion  string `json:"interfacesVersion"`
	MinimumPeerVersion string `json:"minimumPeerVersion"`
	ClusterID          string `json:"clusterId"`
	NodeID             string `json:"nodeId"`
}

type statusCloudly struct {
	sessionState
	// Reason is why the relay is detached, while it is: the newest failure and the next retry.
	Reason string `json:"reason,omitempty"`
	sessionHistory
	// Custody is "held" while Cloudly dispatches to the relay, else the refusal that ended it.
	Custody string `json:"custody"`
	// URL is the Cloudly URL without a query, fragment or userinfo, which may carry a credential.
	URL string `json:"url"`
	// HubReport is the newest registerClusterVpnHub's outcome and when (SPEC §4 step 2); absent
	// while the hub is off or before the first attach.
	HubReport *hubReportState `json:"hubReport,omitempty"`
}

type statusDownstream struct {
	Connections      int   `json:"connections"`
	Unregistered     int64 `json:"unregistered"`
	Streams          int   `json:"streams"`
	BudgetUsedBytes  int64 `json:"budgetUsedBytes"`
	BudgetLimitBytes int64 `json:"budgetLimitBytes"`
	BudgetEvictions  int64 `json:"budgetEvictions"`
	UpstreamQueued   int   `json:"upstreamQueuedFrames"`
}

type statusNodes struct {
	Count   int          `json:"count"`
	Busiest []statusNode `json:"busiest"` // at most statusNodeRows, the most requests first
}

type statusNode struct {
	Node              string    `json:"node"`
	ConnectedSince    time.Time `json:"connectedSince"`
	RequestsToCloudly int64     `json:"requestsToCloudly"`
	RequestsToNode    int64     `json:"requestsToNode"`
	BusyRefusals      int64     `json:"busyRefusals"`
	QueuedFrames      int       `json:"queuedFrames"`
	HeldBytes         int64     `json:"heldBytes"`
}

type statusPart struct {
	Name   string `json:"name"`
	Ready  string `json:"ready"` // "ready", or why not
	Status any    `json:"status,omitempty"`
}

// status gathers the facts.
func (r *Relay) status() Status {
	now := time.Now()
	st := Status{
		Now: now, Ready: "ready", Role: r.role(), Started: r.started, UptimeSeconds: int64(now.Sub(r.started) / time.Second),
		Addresses: statusAddresses{Advertise: r.cfg.AdvertiseAddress, HubListen: r.cfg.HubListen, HubAdvertise: r.cfg.HubAdvertiseAddress,
			Hub: r.hubAddr, RegistryUpstream: redactURL(r.cfg.RegistryUpstream)},
		Build: statusBuild{Version: r.cfg.BuildVersion, InterfacesVersion: contracts.InterfacesVersion,
			MinimumPeerVersion: contracts.MinimumPeerVersion, ClusterID: r.cfg.ClusterID, NodeID: r.cfg.NodeID},
		Cloudly: statusCloudly{Custody: "held", URL: redactURL(r.cfg.CloudlyURL)},
		Downstream: statusDownstream{Unregistered: r.down.waiting.Load(), Streams: r.streams.len(),
			BudgetUsedBytes: r.down.budget.Used(), BudgetLimitBytes: r.down.budget.Limit(), BudgetEvictions: r.down.budget.Evictions(),
			UpstreamQueued: r.up.queueLen()},
	}
	if s := r.up.state.Load(); s != nil {
		st.Cloudly.sessionState = *s
	}
	st.Cloudly.sessionHistory = r.up.hist.history()
	if !st.Cloudly.Attached {
		st.Cloudly.Reason = st.Cloudly.detachedReason(now)
	}
	if err := r.ready(); err != nil {
		st.Ready = err.Error()
	}
	if r.cfg.RegistryUpstream == "" {
		st.Addresses.RegistryUpstream = ""
	}
	if r.downLn != nil {
		st.Addresses.Listen, st.Addresses.Admin = r.downLn.Addr().String(), r.adminLn.Addr().String()
	}
	st.Certificates.Cloudly = st.Cloudly.PeerCert
	if r.certs != nil {
		st.Certificates.Downstream = r.certs.info()
	}
	families, _ := gatherCounters(r.registry)
	st.Counters = r.rates.counterGroups(now, families)
	if name := r.custody.endedBy(); name != "" {
		st.Cloudly.Custody = string(name)
	}
	st.Cloudly.HubReport = r.hubReport.status()
	if r.elector != nil {
		st.HA = r.elector.Status()
	}
	peers := r.down.peers.snapshot()
	st.Downstream.Connections = len(peers)
	var nodes []statusNode
	for _, p := range peers {
		id := p.nodeID()
		if id == "" {
			continue
		}
		nodes = append(nodes, statusNode{Node: id, ConnectedSince: p.since, RequestsToCloudly: p.toCloudly.Load(),
			RequestsToNode: p.toNode.Load(), BusyRefusals: p.busy.Load(), QueuedFrames: p.conn.QueueLen(), HeldBytes: p.share.Used()})
	}
	st.Nodes.Count = len(nodes)
	slices.SortFunc(nodes, func(a, b statusNode) int {
		return cmp.Or(cmp.Compare(b.RequestsToCloudly+b.RequestsToNode, a.RequestsToCloudly+a.RequestsToNode), strings.Compare(a.Node, b.Node))
	})
	st.Nodes.Busiest = nodes[:min(len(nodes), statusNodeRows)]
	for _, c := range r.parts.components {
		ready := "ready"
		if err := c.v.Ready(); err != nil {
			ready = err.Error()
		}
		st.Parts = append(st.Parts, statusPart{Name: c.name, Ready: ready})
	}
	for _, p := range r.parts.reporters {
		i := slices.IndexFunc(st.Parts, func(s statusPart) bool { return s.Name == p.name })
		if i < 0 {
			st.Parts = append(st.Parts, statusPart{Name: p.name, Ready: "ready"})
			i = len(st.Parts) - 1
		}
		st.Parts[i].Status = p.v.Status()
	}
	return st
}

func (r *Relay) serveStatusJSON(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	enc.Encode(r.status())
}

func (r *Relay) serveStatusPage(w http.ResponseWriter, _ *http.Request) {
	st := r.status()
	// The parts' facts are any JSON value: render them from their JSON, in its own order.
	parts := make([]renderedPart, len(st.Parts))
	if st.HA != nil {
		ready := "leader"
		if !r.leading.Load() {
			ready = "standby"
		}
		parts = append([]renderedPart{{Name: "ha", Ready: ready}}, parts...)
		if b, err := json.Marshal(st.HA); err == nil {
			parts[0].Facts = renderJSON(b)
		}
	}
	for i, p := range st.Parts {
		i += len(parts) - len(st.Parts)
		parts[i] = renderedPart{Name: p.Name, Ready: p.Ready}
		if p.Status != nil {
			b, err := json.Marshal(p.Status)
			if err == nil {
				parts[i].Facts = renderJSON(b)
			}
		}
	}
	var counting, zero []counterGroup
	for _, g := range st.Counters {
		if g.zero {
			zero = append(zero, g)
			continue
		}
		// Series still at zero in a group that counts something are left out; /metrics has them.
		g.Series = slices.DeleteFunc(slices.Clone(g.Series), func(s counterSeries) bool { return s.Total == 0 })
		counting = append(counting, g)
	}
	outages := slices.Clone(st.Cloudly.Outages)
	slices.Reverse(outages)
	var buf bytes.Buffer
	if err := statusPage.Execute(&buf, struct {
		Status
		Rendered            []renderedPart
		Shown               int
		Counting, Zero      []counterGroup
		Outages             []outage
		Refresh, MaxOutages int
	}{st, parts, len(st.Nodes.Busiest), counting, zero, outages, statusRefresh, maxOutages}); err != nil {
		http.Error(w, "status page: "+err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	io.Copy(w, &buf)
}

type renderedPart struct {
	Name, Ready string
	Facts       template.HTML
}

// renderJSON renders a JSON value as nested HTML: an object as a two-column table in its own key
// order, an array of objects as a table with a column per key, any other array as a list, a
// scalar as text. Everything is escaped.
func renderJSON(b []byte) template.HTML {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	v, err := decodeOrdered(dec)
	if err != nil {
		return ""
	}
	var out strings.Builder
	renderValue(&out, v)
	return template.HTML(out.String())
}

// member is one member of a JSON object, in its order.
type member struct {
	key   string
	value any
}

// decodeOrdered decodes one JSON value, keeping objects' member order ([]member).
func decodeOrdered(dec *json.Decoder) (any, error) {
	tok, err := dec.Token()
	if err != nil {
		return nil, err
	}
	switch t := tok.(type) {
	case json.Delim:
		switch t {
		case '{':
			var obj []member
			for dec.More() {
				k, err := dec.Token()
				if err != nil {
					return nil, err
				}
				v, err := decodeOrdered(dec)
				if err != nil {
					return nil, err
				}
				obj = append(obj, member{key: fmt.Sprint(k), value: v})
			}
			_, err := dec.Token()
			return obj, err
		case '[':
			var arr []any
			for dec.More() {
				v, err := decodeOrdered(dec)
				if err != nil {
					return nil, err
				}
				arr = append(arr, v)
			}
			_, err := dec.Token()
			return arr, err
		}
	}
	return tok, nil
}

func renderValue(out *strings.Builder, v any) {
	esc := template.HTMLEscapeString
	switch x := v.(type) {
	case []member:
		out.WriteString("<table>")
		for _, m := range x {
			out.WriteString("<tr><th>" + esc(m.key) + "</th><td>")
			renderValue(out, m.value)
			out.WriteString("</td></tr>")
		}
		out.WriteString("</table>")
	case []any:
		if len(x) == 0 {
			out.WriteString("none")
			return
		}
		if cols := columns(x); cols != nil {
			out.WriteString("<table><tr>")
			for _, c := range cols {
				out.WriteString("<th>" + esc(c) + "</th>")
			}
			out.WriteString("</tr>")
			for _, row := range x {
				out.WriteString("<tr>")
				for _, c := range cols {
					out.WriteString("<td>")
					for _, m := range row.([]member) {
						if m.key == c {
							renderValue(out, m.value)
						}
					}
					out.WriteString("</td>")
				}
				out.WriteString("</tr>")
			}
			out.WriteString("</table>")
			return
		}
		for i, e := range x {
			if i > 0 {
				out.WriteString(", ")
			}
			renderValue(out, e)
		}
	case nil:
		out.WriteString("—")
	default:
		out.WriteString(esc(fmt.Sprint(x)))
	}
}

// columns is the union of the keys of rows, in first-seen order, when every row is an object.
func columns(rows []any) []string {
	var cols []string
	for _, r := range rows {
		obj, ok := r.([]member)
		if !ok {
			return nil
		}
		for _, m := range obj {
			if !slices.Contains(cols, m.key) {
				cols = append(cols, m.key)
			}
		}
	}
	return cols
}

func since(t time.Time) string {
	if t.IsZero() {
		return "—"
	}
	return time.Since(t).Round(time.Second).String() + " (" + t.UTC().Format(time.RFC3339) + ")"
}

// when is a time in UTC and how far it is from now: "2026-12-01T10:00:00Z (in 4s)".
func when(now time.Time, t *time.Time) string {
	if t == nil || t.IsZero() {
		return "—"
	}
	d := t.Sub(now).Round(time.Second)
	rel := "in " + d.String()
	if d < 0 {
		rel = (-d).String() + " ago"
	}
	return t.UTC().Format(time.RFC3339) + " (" + rel + ")"
}

// expiry is a certificate's end and the days left: "2027-03-01T00:00:00Z (in 89 days)".
func expiry(now time.Time, c *certInfo) string {
	days := int(c.NotAfter.Sub(now).Hours() / 24)
	if !c.NotAfter.After(now) {
		return c.NotAfter.UTC().Format(time.RFC3339) + " (expired)"
	}
	return c.NotAfter.UTC().Format(time.RFC3339) + " (in " + strconv.Itoa(days) + " days)"
}

// lasted is how long an outage lasted, or has lasted until now.
func lasted(now time.Time, o outage) string {
	end := now
	if o.End != nil {
		end = *o.End
	}
	return end.Sub(o.Start).Round(time.Second).String()
}

// ago is how long before now t was, and t's time of day: "4s ago, 10:00:00 UTC".
func ago(now, t time.Time) string {
	return now.Sub(t).Round(time.Second).String() + " ago, " + t.UTC().Format("15:04:05 UTC")
}

func uptime(seconds int64) string { return (time.Duration(seconds) * time.Second).String() }

func num(f float64) string { return strconv.FormatFloat(f, 'f', -1, 64) }

func perMinute(f *float64) string {
	if f == nil {
		return "—"
	}
	return strconv.FormatFloat(*f, 'f', 1, 64) + "/min"
}

func mib(n int64) string { return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20)) }

// statusRefresh is how often the page reloads itself (a <meta> refresh: no script).
const statusRefresh = 10

var statusPage = template.Must(template.New("status").Funcs(template.FuncMap{"since": since, "mib": mib, "when": when,
	"expiry": expiry, "ago": ago, "lasted": lasted, "uptime": uptime, "num": num, "perMinute": perMinute}).Parse(`<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>serve.zone relay {{.Build.ClusterID}}</title>
<meta http-equiv="refresh" content="{{.Refresh}}">
<meta name="viewport" content="width=device-width, initial-scale=1">
<style>
body{font-family:system-ui,sans-serif;margin:1.5em;color:#222;max-width:72em}
h1{font-size:1.4em}h2{font-size:1.1em;margin-top:1.6em;border-bottom:1px solid #ccc}h3{font-size:1em}
table{border-collapse:collapse;margin:.3em 0}th,td{text-align:left;padding:.15em .7em .15em 0;vertical-align:top}
th{font-weight:600;color:#555}.ok{color:#080}.bad{color:#b00}small{color:#777}td.n{text-align:right}
summary{cursor:pointer;color:#555}
</style></head><body>
<h1>serve.zone relay — cluster {{.Build.ClusterID}}, node {{.Build.NodeID}}</h1>
<p><small>relay {{.Build.Version}}, @serve.zone/interfaces {{.Build.InterfacesVersion}} (peers from {{.Build.MinimumPeerVersion}}); as of {{.Now.UTC.Format "2006-01-02 15:04:05 UTC"}}, refreshed every {{.Refresh}} s. The same facts: <a href="status.json">status.json</a>; counters: <a href="metrics">metrics</a>.</small></p>

<table>
<tr><th>ready</th><td>{{if eq .Ready "ready"}}<b class="ok" id="ready">ready</b>{{else}}<b class="bad" id="ready">{{.Ready}}</b>{{end}}</td></tr>
<tr><th>role</th><td id="role">{{.Role}}</td></tr>
<tr><th>up</th><td>{{uptime .UptimeSeconds}} (since {{.Started.UTC.Format "2006-01-02 15:04:05 UTC"}})</td></tr>
</table>

<h2>Cloudly</h2>
<table>
<tr><th>state</th><td>{{if .Cloudly.Attached}}<b class="ok" id="attached">attached</b>{{else}}<b class="bad" id="attached">detached</b>{{end}}</td></tr>
{{if not .Cloudly.Attached}}<tr><th>why</th><td id="detach-reason" class="bad">{{.Cloudly.Reason}}</td></tr>
<tr><th>next retry</th><td>{{when .Now .Cloudly.NextRetry}}</td></tr>
{{end}}<tr><th>since</th><td>{{since .Cloudly.Since}}</td></tr>
<tr><th>attempts since attached</th><td>{{.Cloudly.Attempts}}</td></tr>
{{with .Cloudly.LastFailure}}<tr><th>last failure</th><td><span id="last-failure">{{.Kind}}{{with .Refusal}} {{.}}{{end}}</span>{{with .Step}} at {{.}}{{end}}: {{.Message}} <small>({{ago $.Now .At}})</small></td></tr>
{{end}}<tr><th>registration sequence</th><td>{{.Cloudly.Sequence}}</td></tr>
<tr><th>origin</th><td>{{or .Cloudly.Origin "—"}}</td></tr>
<tr><th>custody</th><td>{{.Cloudly.Custody}}</td></tr>
{{with .Cloudly.HubReport}}<tr><th>VPN hub report</th><td><span id="hub-report">{{.Outcome}}</span>, {{since .At}} (after registration {{.Sequence}})</td></tr>
{{end}}<tr><th>URL</th><td>{{.Cloudly.URL}}</td></tr>
</table>
<h3>Outages <small>(the last {{.MaxOutages}}, the newest first)</small></h3>
{{if .Outages}}<table id="outages">
<tr><th>start</th><th>end</th><th>lasted</th><th>cause</th></tr>
{{range .Outages}}<tr><td>{{.Start.UTC.Format "2006-01-02 15:04:05"}}</td><td>{{with .End}}{{.UTC.Format "2006-01-02 15:04:05"}}{{else}}<b class="bad">ongoing</b>{{end}}</td><td>{{lasted $.Now .}}</td><td>{{.Cause}}</td></tr>
{{end}}</table>{{else}}<p>None since the relay started.</p>{{end}}

<h2>Addresses and certificates</h2>
<table>
<tr><th>downstream listener</th><td>{{or .Addresses.Listen "—"}}</td></tr>
<tr><th>advertised to nodes</th><td>{{.Addresses.Advertise}}</td></tr>
<tr><th>admin listener</th><td>{{or .Addresses.Admin "—"}}</td></tr>
<tr><th>VPN hub</th><td>{{if .Addresses.HubListen}}{{.Addresses.HubListen}}{{with .Addresses.Hub}}, reported as {{.}}{{end}}{{else}}off{{end}}</td></tr>
{{with .Addresses.RegistryUpstream}}<tr><th>registry upstream</th><td>{{.}}</td></tr>
{{end}}{{with .Certificates.Downstream}}<tr><th>downstream certificate</th><td>{{.Subject}}{{with .DNSNames}} ({{range $i, $n := .}}{{if $i}}, {{end}}{{$n}}{{end}}){{end}}, expires {{expiry $.Now .}}</td></tr>
{{else}}<tr><th>downstream certificate</th><td>none (--insecure-plaintext)</td></tr>
{{end}}{{with .Certificates.Cloudly}}<tr><th>Cloudly's certificate</th><td>{{.Subject}}{{with .DNSNames}} ({{range $i, $n := .}}{{if $i}}, {{end}}{{$n}}{{end}}){{end}}, expires {{expiry $.Now .}}</td></tr>
{{end}}</table>

<h2>Downstream</h2>
<table>
<tr><th>nodes</th><td id="nodes">{{.Nodes.Count}}</td></tr>
<tr><th>connections</th><td>{{.Downstream.Connections}} ({{.Downstream.Unregistered}} not registered yet)</td></tr>
<tr><th>streams</th><td>{{.Downstream.Streams}}</td></tr>
<tr><th>peer memory budget</th><td>{{mib .Downstream.BudgetUsedBytes}} of {{mib .Downstream.BudgetLimitBytes}} ({{.Downstream.BudgetEvictions}} evictions)</td></tr>
<tr><th>frames queued to Cloudly</th><td>{{.Downstream.UpstreamQueued}}</td></tr>
</table>

<h2>Counters <small>(totals since start, and per minute over the last minute)</small></h2>
{{if .Counting}}<table id="counters">
<tr><th>counter</th><th>labels</th><th>total</th><th>rate</th></tr>
{{range .Counting}}{{$g := .}}{{range $i, $s := .Series}}<tr><td title="{{$g.Help}}">{{if not $i}}{{$g.Name}}{{end}}</td><td>{{$s.Labels}}</td><td class="n">{{num $s.Total}}</td><td class="n">{{perMinute $s.PerMinute}}</td></tr>
{{end}}{{end}}</table>
<p><small>Series at zero in the groups above are left out; /metrics has them all.</small></p>{{else}}<p>Nothing counted yet.</p>{{end}}
{{if .Zero}}<details id="zero-counters"><summary>{{len .Zero}} counter groups still at zero</summary>
<ul>{{range .Zero}}<li title="{{.Help}}">{{.Name}}</li>
{{end}}</ul></details>{{end}}

<h2>Nodes{{if lt .Shown .Nodes.Count}} — the busiest {{.Shown}} of {{.Nodes.Count}}{{end}}</h2>
{{if .Nodes.Busiest}}<table>
<tr><th>node</th><th>connected</th><th>requests to Cloudly</th><th>requests to the node</th><th>busy refusals</th><th>queued frames</th><th>held</th></tr>
{{range .Nodes.Busiest}}<tr><td>{{.Node}}</td><td>{{since .ConnectedSince}}</td><td>{{.RequestsToCloudly}}</td><td>{{.RequestsToNode}}</td><td>{{.BusyRefusals}}</td><td>{{.QueuedFrames}}</td><td>{{mib .HeldBytes}}</td></tr>
{{end}}</table>{{else}}<p>No node is connected.</p>{{end}}

{{range .Rendered}}<h2>{{.Name}} <small class="{{if or (eq .Ready "ready") (eq .Ready "leader")}}ok{{else}}bad{{end}}">{{.Ready}}</small></h2>
{{.Facts}}
{{end}}
</body></html>
`))
