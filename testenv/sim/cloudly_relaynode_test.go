package sim

import (
	"strings"
	"testing"

	"github.com/rs/zerolog"

	"code.foss.global/serve.zone/relay/internal/typedsocket"
)

// TestSimCloudlyJudgesRelayNodeID holds the Cloudly stand-in to its own judgement of the envelope's
// relayNodeId: a relay that forgets it on a node's request, names a node Cloudly never accepted,
// names another node than the request's session, or states one on its own call is refused and
// recorded; the relay's rightful requests pass.
func TestSimCloudlyJudgesRelayNodeID(t *testing.T) {
	c, err := NewCloudly(zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.sessions["node-a"] = []byte(`{"nodeId":"node-a"}`)
	c.sessions["node-b"] = []byte(`{"nodeId":"node-b"}`)
	req := func(frame string) *typedsocket.Request {
		env, err := typedsocket.Decode([]byte(frame))
		if err != nil {
			t.Fatal(err)
		}
		return &typedsocket.Request{Method: env.Method, Body: env.Request, RelayNodeRaw: env.RelayNodeRaw}
	}
	const tail = `"response":null,"correlation":{"id":"1","phase":"request"}}`
	for _, f := range []string{
		`{"method":"reportRuntimeAssignmentObservation","relayNodeId":"node-a","request":{},` + tail,
		`{"method":"reportRuntimeAssignmentLogs","relayNodeId":"node-a","request":{"session":{"nodeId":"node-a"}},` + tail,
		`{"method":"registerPalletRuntimeSession","request":{"nodeId":"node-c"},` + tail,
		`{"method":"registerPalletRuntimeSession","relayNodeId":"node-a","request":{"nodeId":"node-a"},` + tail,
		`{"method":"registerClusterRelay","request":{},` + tail,
		`{"method":"registerClusterIngress","request":{},` + tail,
	} {
		if err := c.judgeRelayNode(req(f)); err != nil {
			t.Errorf("%s: refused %v", f, err)
		}
	}
	bad := []string{
		`{"method":"reportRuntimeAssignmentObservation","request":{},` + tail,
		`{"method":"reportRuntimeAssignmentObservation","relayNodeId":"node-x","request":{},` + tail,
		`{"method":"reportRuntimeAssignmentObservation","relayNodeId":"node-a","request":{"session":{"nodeId":"node-b"}},` + tail,
		`{"method":"reportRuntimeAssignmentObservation","relayNodeId":{"id":"node-a"},"request":{},` + tail,
		`{"method":"registerClusterRelay","relayNodeId":"node-a","request":{},` + tail,
		`{"method":"registerClusterIngress","relayNodeId":"node-a","request":{},` + tail,
		`{"method":"registerPalletRuntimeSession","relayNodeId":"node-x","request":{},` + tail,
	}
	for _, f := range bad {
		if err := c.judgeRelayNode(req(f)); err == nil || !strings.HasPrefix(err.Error(), "relay-node-mismatch: ") {
			t.Errorf("%s: judged %v", f, err)
		}
	}
	if got := len(c.Violations()); got != len(bad) {
		t.Fatalf("recorded %d violations, want %d: %q", got, len(bad), c.Violations())
	}
}
