package interop

import (
	"context"
	"encoding/json"

	"code.foss.global/serve.zone/relay/contracts"
)

// Outcome is how one TypedRequest ended, as the library surfaced it: Response, or Error exactly
// as the library's TypedResponseError carried it ({ text } or { text, data }, re-serialised by
// JSON.stringify, so a missing data stays missing and a null one null).
type Outcome struct {
	Response json.RawMessage `json:"response"`
	Error    json.RawMessage `json:"error"`
}

// ErrorText and ErrorName read the error of an outcome ("" when it has none).
func (o Outcome) ErrorText() string {
	var e struct {
		Text string `json:"text"`
	}
	json.Unmarshal(o.Error, &e)
	return e.Text
}

// ErrorName is the refusal name the error carries (contracts.ReadRefusalName), or "".
func (o Outcome) ErrorName() contracts.RefusalName {
	var e struct {
		Text string          `json:"text"`
		Data json.RawMessage `json:"data"`
	}
	if json.Unmarshal(o.Error, &e) != nil {
		return ""
	}
	return contracts.ReadRefusalName(e.Text, e.Data)
}

// Digest is what one end of a stream saw: a byte count and the SHA-256 of the bytes.
type Digest struct {
	Bytes  int64  `json:"bytes"`
	SHA256 string `json:"sha256"`
}

// StreamResult is one request carrying a VirtualStream: what the sender wrote (nil when the
// writer had not finished), and how the request ended — the receiver's Digest as its Response,
// an Error, or a Failure (no answer: the socket closed, say).
type StreamResult struct {
	Node       string          `json:"node"`
	Sent       *Digest         `json:"sent"`
	WriteError *string         `json:"writeError"`
	Response   json.RawMessage `json:"response"`
	Error      json.RawMessage `json:"error"`
	Failure    string          `json:"failure"`
	Ms         float64         `json:"ms"`
}

// Received decodes the receiver's digest (nil when the answer carried none).
func (r StreamResult) Received() *Digest {
	var d Digest
	if len(r.Response) == 0 || json.Unmarshal(r.Response, &d) != nil || d.SHA256 == "" {
		return nil
	}
	return &d
}

// SocketStatus is one peer socket as its transport sees it.
type SocketStatus struct {
	Name          string         `json:"name"`
	ID            string         `json:"id"`
	Relay         bool           `json:"relay"`
	Open          bool           `json:"open"`
	CloseCode     int            `json:"closeCode"`
	CloseReason   string         `json:"closeReason"`
	Stray         int            `json:"stray"`
	Malformed     int            `json:"malformed"`
	RouteFailures int            `json:"routeFailures"`
	Registrations int            `json:"registrations"`
	Received      map[string]int `json:"received"`
}

// CloudlyConfig is what the Cloudly peer accepts and answers.
type CloudlyConfig struct {
	Token     string                  `json:"token"`
	Offer     contracts.ProtocolOffer `json:"offer"`
	ClusterID string                  `json:"clusterId"`
	Origin    string                  `json:"origin"`
}

// Cloudly is the library-driven Cloudly process (peers/cloudly.mjs).
type Cloudly struct {
	*proc
	URL string // ws:// URL the relay (or a node, directly) dials
}

// StartCloudly starts the Cloudly peer from the interop directory dir.
func StartCloudly(ctx context.Context, dir string, cfg CloudlyConfig) (*Cloudly, error) {
	arg, err := json.Marshal(cfg)
	if err != nil {
		return nil, err
	}
	p, ev, err := start(ctx, dir, "cloudly", "cloudly.mjs", string(arg))
	if err != nil {
		return nil, err
	}
	url, _ := ev["url"].(string)
	return &Cloudly{proc: p, URL: url}, nil
}

// CloudlyStatus is what the Cloudly peer saw.
type CloudlyStatus struct {
	Sockets            []SocketStatus `json:"sockets"`
	Nodes              []string       `json:"nodes"`
	Received           map[string]int `json:"received"` // requests per method the router serves
	Routed             map[string]int `json:"routed"`   // frames per method handed to the router, served or not
	Violations         []string       `json:"violations"`
	Sequences          []int64        `json:"sequences"`
	RelayRegistrations int            `json:"relayRegistrations"`
	ConfigPushes       int            `json:"configPushes"`
	Unhandled          int            `json:"unhandled"`
}

// Status asks the Cloudly peer what it saw.
func (c *Cloudly) Status(ctx context.Context) (CloudlyStatus, error) {
	var s CloudlyStatus
	err := c.do(ctx, "status", nil, &s)
	return s, err
}

// Call fires method at node with the node's session and fields in the body.
func (c *Cloudly) Call(ctx context.Context, node, method string, fields map[string]any) (Outcome, error) {
	var o Outcome
	err := c.do(ctx, "call", map[string]any{"node": node, "method": method, "fields": fields}, &o)
	return o, err
}

// Download fires interopDownload at node with a VirtualStream carrying bytes, written in chunks.
func (c *Cloudly) Download(ctx context.Context, node string, bytes, chunk int) (StreamResult, error) {
	var r StreamResult
	err := c.do(ctx, "download", map[string]any{"node": node, "bytes": bytes, "chunk": chunk}, &r)
	r.Node = node
	return r, err
}

// Raw sends frame on the socket that carries node and returns its answer, or nil when none came
// within wait.
func (c *Cloudly) Raw(ctx context.Context, node string, frame any, waitMs int) (json.RawMessage, error) {
	var r json.RawMessage
	err := c.do(ctx, "raw", map[string]any{"node": node, "frame": frame, "waitMs": waitMs}, &r)
	return r, err
}

// Nodes is the library-driven node process (peers/nodes.mjs): any number of nodes, one socket
// each.
type Nodes struct{ *proc }

// StartNodes starts the node peer process from the interop directory dir.
func StartNodes(ctx context.Context, dir string) (*Nodes, error) {
	p, _, err := start(ctx, dir, "nodes", "nodes.mjs")
	if err != nil {
		return nil, err
	}
	return &Nodes{p}, nil
}

// Registration is how connecting and registering went.
type Registration struct {
	Registered []string `json:"registered"`
	Failures   []struct {
		ID      string `json:"id"`
		Failure string `json:"failure"`
	} `json:"failures"`
}

// Connect opens one socket per id to url and registers each node with offer.
func (n *Nodes) Connect(ctx context.Context, url string, ids []string, offer contracts.ProtocolOffer) (Registration, error) {
	var r Registration
	err := n.do(ctx, "connect", map[string]any{"url": url, "ids": ids, "offer": offer}, &r)
	return r, err
}

// Call fires method at Cloudly from node, with the node's session and fields in the body.
func (n *Nodes) Call(ctx context.Context, node, method string, fields map[string]any) (Outcome, error) {
	var o Outcome
	err := n.do(ctx, "call", map[string]any{"node": node, "method": method, "fields": fields}, &o)
	return o, err
}

// Uploads is one upload round: every node's result and the time until the last answer.
type Uploads struct {
	Results []StreamResult `json:"results"`
	Ms      float64        `json:"ms"`
}

// Upload has every node in ids fire interopUpload with a VirtualStream carrying bytes, all at
// once.
func (n *Nodes) Upload(ctx context.Context, ids []string, bytes, chunk int) (Uploads, error) {
	var u Uploads
	err := n.do(ctx, "upload", map[string]any{"nodes": ids, "bytes": bytes, "chunk": chunk}, &u)
	return u, err
}

// Raw sends frame on node's socket and returns its answer, or nil when none came within wait.
func (n *Nodes) Raw(ctx context.Context, node string, frame any, waitMs int) (json.RawMessage, error) {
	var r json.RawMessage
	err := n.do(ctx, "raw", map[string]any{"node": node, "frame": frame, "waitMs": waitMs}, &r)
	return r, err
}

// NodesStatus is every node's socket.
type NodesStatus struct {
	Nodes     []SocketStatus `json:"nodes"`
	Unhandled int            `json:"unhandled"`
}

// Status asks the node process about every node's socket.
func (n *Nodes) Status(ctx context.Context) (NodesStatus, error) {
	var s NodesStatus
	err := n.do(ctx, "status", nil, &s)
	return s, err
}
