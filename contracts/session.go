package contracts

import (
	"encoding/json"

	"code.foss.global/serve.zone/relay/contracts/strictjson"
)

// RuntimeSession is what the relay reads of the session binding Cloudly answers a node's
// registerPalletRuntimeSession with ({ session, protocol }): the node, controller and runtime
// namespace. Raw keeps the whole binding, which the relay uses opaquely (escrow pushes under it)
// and never changes.
type RuntimeSession struct {
	NodeID           string
	Controller       json.RawMessage // compared as a JSON value; nil when the binding states none
	RuntimeNamespace string          // "" when the binding states none
	Raw              json.RawMessage
}

// ReadRegisterPalletRuntimeSessionResponse reads the accepted answer of a node registration: its
// session (ReadRuntimeSession). The answer is Cloudly's, forwarded to the node untouched; every
// other member stays opaque.
func ReadRegisterPalletRuntimeSessionResponse(raw []byte) (RuntimeSession, error) {
	const path = "node registration answer"
	session, ok, err := strictjson.Lookup(raw, "session")
	if err != nil || !ok {
		return RuntimeSession{}, &InvalidError{[]string{path + " must carry a session"}}
	}
	return ReadRuntimeSession(session)
}

// ReadRuntimeSession reads a serialized IRuntimeSessionBinding tolerantly: the seeds name some of
// its members and not all (docs/protocol.md#node-registration), so the relay takes what it uses and keeps the rest
// opaque in Raw. nodeId is required (node id reader): the relay binds the connection to it.
// controller (an object) and runtimeNamespace (a canonical id) only scope escrowed runs; when
// either is absent or not of its kind, it is left empty, and escrow then finds no run in that
// session's scope (escrow-run-foreign-session) instead of the node being refused.
func ReadRuntimeSession(session []byte) (RuntimeSession, error) {
	const path = "session"
	var nodeID, controller, namespace []byte
	if strictjson.ReadTolerant(session, strictjson.Req("nodeId", &nodeID), strictjson.Opt("controller", &controller), strictjson.Opt("runtimeNamespace", &namespace)) != nil {
		return RuntimeSession{}, &InvalidError{[]string{path + " must be an object carrying nodeId"}}
	}
	n, err := strictjson.ReadString(nodeID)
	if err != nil || !IsClusterNodeID(n) {
		return RuntimeSession{}, &InvalidError{[]string{path + " nodeId must be a cluster node id"}}
	}
	s := RuntimeSession{NodeID: n, Raw: strictjson.TrimSpace(session)}
	if strictjson.KindOf(controller) == strictjson.KindObject {
		s.Controller = controller
	}
	if ns, err := strictjson.ReadString(namespace); err == nil && IsCanonicalID(ns) {
		s.RuntimeNamespace = ns
	}
	return s, nil
}

// ReadRouteNodeID reads the node a Cloudly → node request is for: request.session.nodeId, else
// request.nodeId. ok is false when the body names no node.
func ReadRouteNodeID(body []byte) (nodeID string, ok bool, err error) {
	if session, has, err := strictjson.Lookup(body, "session"); err != nil {
		return "", false, err
	} else if has && strictjson.KindOf(session) == strictjson.KindObject {
		if raw, has, err := strictjson.Lookup(session, "nodeId"); err != nil {
			return "", false, err
		} else if has {
			n, err := strictjson.ReadString(raw)
			return n, err == nil, err
		}
	}
	raw, has, err := strictjson.Lookup(body, "nodeId")
	if err != nil || !has {
		return "", false, err
	}
	n, err := strictjson.ReadString(raw)
	return n, err == nil, err
}

// ReadSessionNodeID reads request.session.nodeId of a node → Cloudly request. present is false
// when the body has no session or its session names no node.
func ReadSessionNodeID(body []byte) (nodeID string, present bool, err error) {
	session, has, err := strictjson.Lookup(body, "session")
	if err != nil || !has {
		return "", false, err
	}
	if strictjson.KindOf(session) != strictjson.KindObject {
		return "", true, &InvalidError{[]string{"request session must be an object"}}
	}
	raw, has, err := strictjson.Lookup(session, "nodeId")
	if err != nil || !has {
		return "", false, err
	}
	n, err := strictjson.ReadString(raw)
	if err != nil {
		return "", true, &InvalidError{[]string{"request session nodeId must be a string"}}
	}
	return n, true, nil
}

// EqualJSON reports whether two JSON values are the same value: equal canonical forms.
func EqualJSON(a, b []byte) bool {
	ca, err1 := strictjson.Canonicalize(a)
	cb, err2 := strictjson.Canonicalize(b)
	return err1 == nil && err2 == nil && string(ca) == string(cb)
}
