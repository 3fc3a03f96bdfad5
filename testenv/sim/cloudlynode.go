package sim

import (
	"encoding/json"

	"code.foss.global/serve.zone/relay/contracts"
	"code.foss.global/serve.zone/relay/contracts/strictjson"
	"code.foss.global/serve.zone/relay/internal/typedsocket"
)

// How the Cloudly stand-in knows the node behind the relay's one socket: the envelope member
// relayNodeId the relay writes on every node request it forwards.

// judgeRelayNode judges the envelope's relayNodeId as a Cloudly that knows the relay's one socket
// carries many nodes must: the relay's own calls and the ingress's registration state none; a
// node's request states the node whose registration Cloudly accepted, the same node its session
// names when it carries one; a first node registration states none and a node rotating on its
// connection states a registered node. Anything else is recorded as a violation and refused. A
// socket that opened no client session is a node's own (AcceptNodesDirectly) and is not judged.
func (c *Cloudly) judgeRelayNode(req *typedsocket.Request) error {
	raw := req.RelayNodeRaw
	refuse := func(why string) error {
		return c.violation(&typedsocket.Error{Text: "relay-node-mismatch: " + req.Method + " " + why, Data: json.RawMessage("null")})
	}
	switch m := req.Method; {
	case m == contracts.MethodRegisterCloudlyClientSession, contracts.IsRelayCallToCloudly(m), m == contracts.MethodRegisterClusterIngress:
		if raw != nil {
			return refuse("states a relayNodeId on a call that is not a node's")
		}
		return nil
	case c.direct.Load() && raw == nil:
		return nil // a node's own socket
	case m == contracts.MethodRegisterPalletRuntimeSession && raw == nil:
		return nil // a first registration: the connection carries no node yet
	}
	node, ok := rawNodeID(raw)
	if !ok {
		return refuse("states no relayNodeId naming a node")
	}
	c.mu.Lock()
	_, known := c.sessions[string(node)] // no copy: the lookup converts in place
	c.mu.Unlock()
	if !known {
		return refuse("states a relayNodeId of a node whose registration Cloudly never accepted")
	}
	if req.Method == contracts.MethodRegisterPalletRuntimeSession {
		return nil
	}
	if claimed, ok := sessionNodeRaw(req.Body); ok && string(claimed) != string(node) {
		return refuse("carries a session of another node than its relayNodeId")
	}
	return nil
}

// sessionNodeRaw is request.session.nodeId when the body carries one, decoded; without a copy
// unless it is escaped.
func sessionNodeRaw(body []byte) ([]byte, bool) {
	session, ok, err := strictjson.Lookup(body, "session")
	if err != nil || !ok || strictjson.KindOf(session) != strictjson.KindObject {
		return nil, false
	}
	raw, ok, err := strictjson.Lookup(session, "nodeId")
	if err != nil || !ok {
		return nil, false
	}
	if id, plain := rawNodeID(raw); plain {
		return id, true
	}
	id, err := strictjson.ReadString(raw)
	return []byte(id), err == nil
}

// rawNodeID is the node id inside a relayNodeId value as the relay writes it: a JSON string of a
// cluster node id (which needs no escape), without a copy.
func rawNodeID(raw []byte) ([]byte, bool) {
	if len(raw) < 3 || raw[0] != '"' || raw[len(raw)-1] != '"' {
		return nil, false
	}
	id := raw[1 : len(raw)-1]
	for _, b := range id {
		if !(b >= 'a' && b <= 'z' || b >= 'A' && b <= 'Z' || b >= '0' && b <= '9' || b == '-' || b == '_') {
			return nil, false
		}
	}
	return id, len(id) <= 128
}

// serveStream takes the relay's stream frames: a node's frame reaches Cloudly without a
// relayNodeId (the stream's binding is the authority; a node cannot name a node).
func (c *Cloudly) serveStream(conn *typedsocket.Conn, f *typedsocket.StreamFrame) {
	if f.RelayNodeID {
		c.violation(&typedsocket.Error{Text: "relay-node-mismatch: a stream frame reached Cloudly with a relayNodeId", Data: json.RawMessage("null")})
	}
	c.mu.Lock()
	c.actedLocked(conn, "a stream frame")
	c.mu.Unlock()
	c.streams.serve(conn, f)
}
