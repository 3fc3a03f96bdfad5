// Package status is the relay's admin listener and its operator's status page: /healthz,
// /readyz, /metrics, /status (one server-rendered HTML page, readable in a terminal browser),
// /status.json with the same facts, and net/http/pprof when asked for.
//
// It knows nothing of the relay's internals. The relay core fills a Snapshot — plain data:
// addresses, the Cloudly session and its history, the downstream, the busiest nodes, each part's
// own facts — whenever the page is asked for (Source), and this package adds the counters it
// reads from the Prometheus registry /metrics serves, with their rates over the last minute, and
// renders the whole for people: durations in words, times as "3m12s ago", sizes with units,
// labels in words. Nothing on it is a secret or a body; its cost is bounded by the core's
// (the busiest 100 nodes) and the parts' (100 rows each).
package status

import "time"

// Source is what the page reads: the relay core.
type Source interface {
	// Snapshot is the relay's facts at now, Counters left empty (the server fills them).
	Snapshot(now time.Time) Snapshot
	// Ready is /readyz's answer: the line to say when ready ("ready", "ready: standby, could
	// lead"), or why not.
	Ready() (string, error)
}

// Snapshot is what /status.json answers, and what /status renders.
type Snapshot struct {
	Now time.Time `json:"now"`
	// Ready is what /readyz answers: "ready", or why not ("detached: registration refused
	// relay-cluster-unknown: next retry in 4s", "standby: …", "shutting down").
	Ready string `json:"ready"`
	// Role is "leader" or "standby" with HA, "single" without.
	Role          string       `json:"role"`
	Started       time.Time    `json:"started"`
	UptimeSeconds int64        `json:"uptimeSeconds"`
	Build         Build        `json:"build"`
	Addresses     Addresses    `json:"addresses"`
	Certificates  Certificates `json:"certificates"`
	Cloudly       Cloudly      `json:"cloudly"`
	Downstream    Downstream   `json:"downstream"`
	Nodes         Nodes        `json:"nodes"`
	Parts         []Part       `json:"parts"`
	// Counters are every relay_* counter /metrics serves, with its rate over the last minute;
	// filled by the server, not the Source.
	Counters []CounterGroup `json:"counters"`
	// HA is the election's facts (role, holder, since, replication); absent without HA.
	HA any `json:"ha,omitempty"`
}

// Roles (Snapshot.Role).
const (
	RoleSingle  = "single"
	RoleLeader  = "leader"
	RoleStandby = "standby"
)

// Addresses are where the relay listens and what it tells others to reach.
type Addresses struct {
	Listen       string `json:"listen"`                 // the downstream listener, as bound
	Advertise    string `json:"advertise"`              // --advertise-address
	Admin        string `json:"admin"`                  // the admin listener, as bound
	Hub          string `json:"hub,omitempty"`          // the VPN hub's UDP address, as reported; absent while off
	HubBound     string `json:"hubBound,omitempty"`     // the VPN hub's UDP socket, as bound; absent while off
	HubListen    string `json:"hubListen,omitempty"`    // --hub-listen
	HubAdvertise string `json:"hubAdvertise,omitempty"` // --hub-advertise-address
	// RegistryUpstream is --registry-upstream without a query, fragment or userinfo.
	RegistryUpstream string `json:"registryUpstream,omitempty"`
}

// Certificates are the certificates in use: names and expiry, never a key.
type Certificates struct {
	Downstream *CertInfo `json:"downstream,omitempty"` // --tls-cert-file's leaf; absent with --insecure-plaintext
	Cloudly    *CertInfo `json:"cloudly,omitempty"`    // the leaf Cloudly presented on the newest TLS socket
}

// Build is what the relay is and speaks, and where it runs.
type Build struct {
	Version            string `json:"version"`
	InterfacesVersion  string `json:"interfacesVersion"`
	MinimumPeerVersion string `json:"minimumPeerVersion"`
	ClusterID          string `json:"clusterId"`
	NodeID             string `json:"nodeId"`
}

// Cloudly is the upstream session: attached since when, with which registrationSequence and
// origin, or detached since when and why, and its history.
type Cloudly struct {
	Attached bool      `json:"attached"`
	Since    time.Time `json:"since"`
	Sequence int64     `json:"sequence"`
	Origin   string    `json:"origin,omitempty"`
	// Reason is why the relay is detached, while it is: the newest failure and the next retry;
	// for a standby, that it stands by.
	Reason string `json:"reason,omitempty"`
	History
	// Custody is "held" while Cloudly dispatches to the relay, else the refusal that ended it.
	Custody string `json:"custody"`
	// URL is the Cloudly URL without a query, fragment or userinfo, which may carry a credential.
	URL string `json:"url"`
	// HubReport is the newest registerClusterVpnHub's outcome and when; absent while the hub is
	// off or before the first attach.
	HubReport *HubReport `json:"hubReport,omitempty"`
}

// HubReport is the newest VPN hub report: its outcome ("pending" until answered) and when it was
// sent or answered, with the registrationSequence it followed.
type HubReport struct {
	Outcome  string    `json:"outcome"`
	At       time.Time `json:"at"`
	Sequence int64     `json:"sequence"`
}

// Downstream is the listener side's load.
type Downstream struct {
	Connections      int   `json:"connections"`
	Unregistered     int64 `json:"unregistered"`
	Streams          int   `json:"streams"`
	BudgetUsedBytes  int64 `json:"budgetUsedBytes"`
	BudgetLimitBytes int64 `json:"budgetLimitBytes"`
	BudgetEvictions  int64 `json:"budgetEvictions"`
	UpstreamQueued   int   `json:"upstreamQueuedFrames"`
}

// NodeRows is how many nodes a snapshot lists, the busiest first.
const NodeRows = 100

// Nodes are the nodes carried: how many, and the busiest NodeRows.
type Nodes struct {
	Count   int    `json:"count"`
	Busiest []Node `json:"busiest"` // at most NodeRows, the most requests first
}

// Node is one node connection's counts.
type Node struct {
	Node              string    `json:"node"`
	ConnectedSince    time.Time `json:"connectedSince"`
	RequestsToCloudly int64     `json:"requestsToCloudly"`
	RequestsToNode    int64     `json:"requestsToNode"`
	BusyRefusals      int64     `json:"busyRefusals"`
	QueuedFrames      int       `json:"queuedFrames"`
	HeldBytes         int64     `json:"heldBytes"`
}

// Part is one optional part: its readiness and its own facts (any JSON value).
type Part struct {
	Name   string `json:"name"`
	Ready  string `json:"ready"` // "ready", or why not
	Status any    `json:"status,omitempty"`
}
