package contracts

import "encoding/json"

// RuntimeSession is what the relay reads of the session binding Cloudly answers a node's
// registerPalletRuntimeSession with ({ session, protocol }): the node, controller and runtime
// namespace. Raw keeps the whole binding, which the relay uses opaquely (escrow pushes under it)
// and never changes.
type RuntimeSession struct {
	NodeID           string
	Controller       json.RawMessage // compared as a JSON value
	RuntimeNamespace string
	Raw              json.RawMessage
}

// ReadRegisterPalletRuntimeSessionResponse reads the accepted answer of a node registration.
// Only session.nodeId (node id reader), session.controller (an object) and
// session.runtimeNamespace (canonical id) are judged; everything else stays opaque.
func ReadRegisterPalletRuntimeSessionResponse(raw []byte) (RuntimeSession, error) {
	const path = "node registration answer"
	session, ok, err := Lookup(raw, "session")
	if err != nil || !ok {
		return RuntimeSession{}, &InvalidError{[]string{path + " must carry a session"}}
	}
	s, err := ReadRuntimeSession(session)
	if err != nil {
		return RuntimeSession{}, err
	}
	return s, nil
}

// ReadRuntimeSession reads a serialized IRuntimeSessionBinding.
func ReadRuntimeSession(session []byte) (RuntimeSession, error) {
	const path = "session"
	members, err := ReadObject(session)
	if err != nil {
		return RuntimeSession{}, &InvalidError{[]string{path + " must be an object"}}
	}
	m := MembersByKey(members)
	var s RuntimeSession
	var reasons []string
	if n, err := ReadString(m["nodeId"]); err != nil || !IsClusterNodeID(n) {
		reasons = append(reasons, path+" nodeId must be a cluster node id")
	} else {
		s.NodeID = n
	}
	if KindOf(m["controller"]) != KindObject || Valid(m["controller"]) != nil {
		reasons = append(reasons, path+" controller must be an object")
	} else {
		s.Controller = m["controller"]
	}
	if ns, err := ReadString(m["runtimeNamespace"]); err != nil || !IsCanonicalID(ns) {
		reasons = append(reasons, path+" runtimeNamespace must be a canonical identifier")
	} else {
		s.RuntimeNamespace = ns
	}
	if len(reasons) > 0 {
		return RuntimeSession{}, &InvalidError{reasons}
	}
	s.Raw = session
	return s, nil
}

// ReadRouteNodeID reads the node a Cloudly → node request is for: request.session.nodeId, else
// request.nodeId. ok is false when the body names no node.
func ReadRouteNodeID(body []byte) (nodeID string, ok bool, err error) {
	if session, has, err := Lookup(body, "session"); err != nil {
		return "", false, err
	} else if has && KindOf(session) == KindObject {
		if raw, has, err := Lookup(session, "nodeId"); err != nil {
			return "", false, err
		} else if has {
			n, err := ReadString(raw)
			return n, err == nil, err
		}
	}
	raw, has, err := Lookup(body, "nodeId")
	if err != nil || !has {
		return "", false, err
	}
	n, err := ReadString(raw)
	return n, err == nil, err
}

// ReadSessionNodeID reads request.session.nodeId of a node → Cloudly request. present is false
// when the body has no session or its session names no node.
func ReadSessionNodeID(body []byte) (nodeID string, present bool, err error) {
	session, has, err := Lookup(body, "session")
	if err != nil || !has {
		return "", false, err
	}
	if KindOf(session) != KindObject {
		return "", true, &InvalidError{[]string{"request session must be an object"}}
	}
	raw, has, err := Lookup(session, "nodeId")
	if err != nil || !has {
		return "", false, err
	}
	n, err := ReadString(raw)
	if err != nil {
		return "", true, &InvalidError{[]string{"request session nodeId must be a string"}}
	}
	return n, true, nil
}

// EqualJSON reports whether two JSON values are the same value: equal canonical forms.
func EqualJSON(a, b []byte) bool {
	ca, err1 := Canonicalize(a)
	cb, err2 := Canonicalize(b)
	return err1 == nil && err2 == nil && string(ca) == string(cb)
}
