package status

import (
	"bytes"
	"encoding/json"
	"html/template"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"
)

// The operator's status page: one server-rendered HTML page with no script, readable in a
// terminal browser, refreshing itself every statusRefresh seconds. A standby is shown as the
// healthy state it is: detached from Cloudly by design, not in an outage.

// statusRefresh is how often the page reloads itself (a <meta> refresh: no script).
const statusRefresh = 10

func (s *Server) servePage(w http.ResponseWriter, _ *http.Request) {
	var buf bytes.Buffer
	if err := statusPage.Execute(&buf, newPage(s.snapshot())); err != nil {
		http.Error(w, "status page: "+err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	io.Copy(w, &buf)
}

// page is what the template renders: the snapshot and what the page derives from it.
type page struct {
	Snapshot
	Standby             bool // a standby: detached on purpose, shown as healthy
	Rendered            []renderedPart
	Shown               int
	Counting, Zero      []CounterGroup
	Outages             []Outage // the newest first
	Refresh, MaxOutages int
}

type renderedPart struct {
	Name, Ready string
	Healthy     bool
	Facts       template.HTML
}

func newPage(st Snapshot) page {
	p := page{Snapshot: st, Standby: st.Role == RoleStandby, Shown: len(st.Nodes.Busiest), Refresh: statusRefresh, MaxOutages: MaxOutages}
	// The parts' facts are any JSON value: render them from their JSON, in its own order.
	if st.HA != nil {
		// The election's section is headed by the role: leader and standby are both healthy.
		ha := renderedPart{Name: "ha", Ready: st.Role, Healthy: true}
		if b, err := json.Marshal(st.HA); err == nil {
			ha.Facts = renderJSON(st.Now, b)
		}
		p.Rendered = append(p.Rendered, ha)
	}
	for _, part := range st.Parts {
		r := renderedPart{Name: part.Name, Ready: part.Ready, Healthy: part.Ready == "ready"}
		if part.Status != nil {
			if b, err := json.Marshal(part.Status); err == nil {
				r.Facts = renderJSON(st.Now, b)
			}
		}
		p.Rendered = append(p.Rendered, r)
	}
	for _, g := range st.Counters {
		if g.zero {
			p.Zero = append(p.Zero, g)
			continue
		}
		// Series still at zero in a group that counts something are left out; /metrics has them.
		g.Series = slices.DeleteFunc(slices.Clone(g.Series), func(s CounterSeries) bool { return s.Total == 0 })
		p.Counting = append(p.Counting, g)
	}
	p.Outages = slices.Clone(st.Cloudly.Outages)
	slices.Reverse(p.Outages)
	return p
}

// The template's functions; each takes the page's now where it reads one.

// when is an optional time: "in 4s (2026-12-01 10:00:00 UTC)", "—" for none.
func when(now time.Time, t *time.Time) string {
	if t == nil {
		return "—"
	}
	return At(now, *t)
}

// expiry is a certificate's end and the days left: "2027-03-01 00:00:00 UTC (in 89 days)".
func expiry(now time.Time, c *CertInfo) string {
	if !c.NotAfter.After(now) {
		return clock(c.NotAfter) + " (expired)"
	}
	days := int(c.NotAfter.Sub(now).Hours() / 24)
	if days < 2 {
		return clock(c.NotAfter) + " (in " + Duration(c.NotAfter.Sub(now)) + ")"
	}
	return clock(c.NotAfter) + " (in " + strconv.Itoa(days) + " days)"
}

// lasted is how long an outage lasted, or has lasted until now.
func lasted(now time.Time, o Outage) string {
	end := now
	if o.End != nil {
		end = *o.End
	}
	return Duration(end.Sub(o.Start))
}

func uptime(seconds int64) string { return Duration(time.Duration(seconds) * time.Second) }

// num is a counter's total; a counter of bytes (its name ends in _bytes_total) with a unit.
func num(name string, f float64) string {
	if strings.HasSuffix(name, "_bytes_total") {
		return Bytes(int64(f))
	}
	return strconv.FormatFloat(f, 'f', -1, 64)
}

// perMinute is a counter's rate, "12.0/min"; a counter of bytes with a unit, "1.5 MiB/min".
func perMinute(name string, f *float64) string {
	switch {
	case f == nil:
		return "—"
	case strings.HasSuffix(name, "_bytes_total"):
		return Bytes(int64(*f)) + "/min"
	}
	return strconv.FormatFloat(*f, 'f', 1, 64) + "/min"
}

var statusPage = template.Must(template.New("status").Funcs(template.FuncMap{"at": At, "ago": Relative, "clock": clock,
	"bytes": Bytes, "when": when, "expiry": expiry, "lasted": lasted, "uptime": uptime, "num": num, "perMinute": perMinute}).Parse(`<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>serve.zone relay {{.Build.ClusterID}}</title>
<meta http-equiv="refresh" content="{{.Refresh}}">
<meta name="viewport" content="width=device-width, initial-scale=1">
<style>
body{font-family:system-ui,sans-serif;margin:1.5em;color:#222;max-width:72em}
h1{font-size:1.4em}h2{font-size:1.1em;margin-top:1.6em;border-bottom:1px solid #ccc}h3{font-size:1em}
table{border-collapse:collapse;margin:.3em 0}th,td{text-align:left;padding:.15em .7em .15em 0;vertical-align:top}
th{font-weight:600;color:#555}.ok{color:#080}.bad{color:#b00}.idle{color:#357}small{color:#777}td.n{text-align:right}
summary{cursor:pointer;color:#555}
</style></head><body>
<h1>serve.zone relay — cluster {{.Build.ClusterID}}, node {{.Build.NodeID}}</h1>
<p><small>relay {{.Build.Version}}, @serve.zone/interfaces {{.Build.InterfacesVersion}} (peers from {{.Build.MinimumPeerVersion}}); as of {{clock .Now}}, refreshed every {{.Refresh}} s. The same facts: <a href="status.json">status.json</a>; counters: <a href="metrics">metrics</a>.</small></p>

<table>
<tr><th>ready</th><td>{{if eq .Ready "ready"}}<b class="ok" id="ready">ready</b>{{else}}<b class="bad" id="ready">{{.Ready}}</b>{{end}}</td></tr>
<tr><th>role</th><td{{if .Standby}} class="idle"{{end}} id="role">{{.Role}}</td></tr>
<tr><th>up</th><td><span id="uptime">{{uptime .UptimeSeconds}}</span> (since {{clock .Started}})</td></tr>
</table>

<h2>Cloudly</h2>
<table>
<tr><th>state</th><td>{{if .Cloudly.Attached}}<b class="ok" id="attached">attached</b>{{else if .Standby}}<b class="idle" id="attached">detached</b> <small>(by design: only the elected relay holds the Cloudly session)</small>{{else}}<b class="bad" id="attached">detached</b>{{end}}</td></tr>
{{if not .Cloudly.Attached}}<tr><th>why</th><td id="detach-reason" class="{{if .Standby}}idle{{else}}bad{{end}}">{{.Cloudly.Reason}}</td></tr>
{{if not .Standby}}<tr><th>next retry</th><td>{{when .Now .Cloudly.NextRetry}}</td></tr>
{{end}}{{end}}<tr><th>since</th><td id="cloudly-since">{{at .Now .Cloudly.Since}}</td></tr>
<tr><th>attempts since attached</th><td>{{.Cloudly.Attempts}}</td></tr>
{{with .Cloudly.LastFailure}}<tr><th>last failure</th><td><span id="last-failure">{{.Kind}}{{with .Refusal}} {{.}}{{end}}</span>{{with .Step}} at {{.}}{{end}}: {{.Message}} <small>{{at $.Now .At}}</small></td></tr>
{{end}}<tr><th>registration sequence</th><td>{{.Cloudly.Sequence}}</td></tr>
<tr><th>origin</th><td>{{or .Cloudly.Origin "—"}}</td></tr>
<tr><th>custody</th><td>{{.Cloudly.Custody}}</td></tr>
{{with .Cloudly.HubReport}}<tr><th>VPN hub report</th><td><span id="hub-report">{{.Outcome}}</span>, {{at $.Now .At}} (after registration {{.Sequence}})</td></tr>
{{end}}<tr><th>URL</th><td>{{.Cloudly.URL}}</td></tr>
</table>
<h3>Outages <small>(the last {{.MaxOutages}}, the newest first)</small></h3>
{{if .Outages}}<table id="outages">
<tr><th>start</th><th>end</th><th>lasted</th><th>cause</th></tr>
{{range .Outages}}<tr><td>{{at $.Now .Start}}</td><td>{{with .End}}{{at $.Now .}}{{else}}<b class="bad">ongoing</b>{{end}}</td><td>{{lasted $.Now .}}</td><td>{{.Cause}}</td></tr>
{{end}}</table>{{else}}<p>None since the relay started.</p>{{end}}

<h2>Addresses and certificates</h2>
<table>
<tr><th>downstream listener</th><td>{{or .Addresses.Listen "—"}}</td></tr>
<tr><th>advertised to nodes</th><td>{{.Addresses.Advertise}}</td></tr>
<tr><th>admin listener</th><td>{{or .Addresses.Admin "—"}}</td></tr>
<tr><th>VPN hub</th><td id="hub">{{with .Addresses.HubBound}}bound to {{.}}{{with $.Addresses.Hub}}, reported to Cloudly as {{.}}{{end}}{{else}}{{with .Addresses.Hub}}reported to Cloudly as {{.}}{{else}}off{{end}}{{end}}</td></tr>
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
<tr><th>peer memory budget</th><td id="budget">{{bytes .Downstream.BudgetUsedBytes}} of {{bytes .Downstream.BudgetLimitBytes}} ({{.Downstream.BudgetEvictions}} evictions)</td></tr>
<tr><th>frames queued to Cloudly</th><td>{{.Downstream.UpstreamQueued}}</td></tr>
</table>

<h2>Counters <small>(totals since start, and per minute over the last minute)</small></h2>
{{if .Counting}}<table id="counters">
<tr><th>counter</th><th>labels</th><th>total</th><th>rate</th></tr>
{{range .Counting}}{{$g := .}}{{range $i, $s := .Series}}<tr><td title="{{$g.Help}}">{{if not $i}}{{$g.Name}}{{end}}</td><td>{{$s.Labels}}</td><td class="n">{{num $g.Name $s.Total}}</td><td class="n">{{perMinute $g.Name $s.PerMinute}}</td></tr>
{{end}}{{end}}</table>
<p><small>Series at zero in the groups above are left out; /metrics has them all.</small></p>{{else}}<p>Nothing counted yet.</p>{{end}}
{{if .Zero}}<details id="zero-counters"><summary>{{len .Zero}} counter groups still at zero</summary>
<ul>{{range .Zero}}<li title="{{.Help}}">{{.Name}}</li>
{{end}}</ul></details>{{end}}

<h2>Nodes{{if lt .Shown .Nodes.Count}} — the busiest {{.Shown}} of {{.Nodes.Count}}{{end}}</h2>
{{if .Nodes.Busiest}}<table id="node-rows">
<tr><th>node</th><th>connected</th><th>requests to Cloudly</th><th>requests to the node</th><th>busy refusals</th><th>queued frames</th><th>held</th></tr>
{{range .Nodes.Busiest}}<tr><td>{{.Node}}</td><td>{{ago $.Now .ConnectedSince}}</td><td>{{.RequestsToCloudly}}</td><td>{{.RequestsToNode}}</td><td>{{.BusyRefusals}}</td><td>{{.QueuedFrames}}</td><td>{{bytes .HeldBytes}}</td></tr>
{{end}}</table>{{else}}<p>No node is connected.</p>{{end}}

{{range .Rendered}}<h2>{{.Name}} <small class="{{if .Healthy}}ok{{else}}bad{{end}}">{{.Ready}}</small></h2>
{{.Facts}}
{{end}}
</body></html>
`))
