package restore

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/rs/zerolog"

	"code.foss.global/serve.zone/relay/contracts"
	"code.foss.global/serve.zone/relay/testenv/await"
)

// TestStatusShowsCallsInFlightWhileCorestoreBlocks: calls waiting for a Corestore that has not
// answered are in flight, per node, the busiest first; once answered they are counted by how
// they ended, and a call the relay refuses at once is counted by its refusal name.
func TestStatusShowsCallsInFlightWhileCorestoreBlocks(t *testing.T) {
	port := &blockingPort{release: make(chan struct{})}
	r := newRestore(t, port, Options{Logger: zerolog.Nop(), MaxInflightPerNode: 3})
	defer r.Close()
	r.Configured(contracts.ClusterRelayConfig{Corestores: []contracts.CorestoreOrigin{
		{NodeID: "node-a", Origin: "https://corestore.node-a.example"}, {NodeID: "node-b", Origin: "https://corestore.node-b.example"}}})
	replies := make(chan error, 8)
	reply := func(_ json.RawMessage, err error) { replies <- err }
	requestB := strings.Replace(statusRequest, "node-a", "node-b", 1)
	for _, body := range []string{requestB, statusRequest, statusRequest, statusRequest} {
		r.Serve(contracts.MethodGetIsolatedRestoreProgressOnNode, json.RawMessage(body), reply)
	}
	await.Until(t, "four calls at Corestore", 10*time.Second, func() bool { return port.calls.Load() >= 4 })
	r.Serve(contracts.MethodGetIsolatedRestoreProgressOnNode, json.RawMessage(statusRequest), reply) // node-a's fourth: busy
	if err := <-replies; !errors.Is(err, contracts.RelayNodeBusy) {
		t.Fatalf("node-a's fourth call: %v", err)
	}

	st := restoreStatus(t, r)
	if st.Inflight != 4 || st.Corestores != 2 || st.MaxInflightPerNode != 3 || st.MaxInflight != DefaultMaxInflight ||
		len(st.Nodes) != 2 || st.Nodes[0] != (StatusNode{"node-a", 3}) || st.Nodes[1] != (StatusNode{"node-b", 1}) {
		t.Fatalf("four calls waiting: %+v", st)
	}
	if n, busy := outcomes(r, "answered"), outcomes(r, string(contracts.RelayNodeBusy)); n != 0 || busy != 1 {
		t.Fatalf("counts while waiting: answered %v, refused busy %v", n, busy)
	}

	close(port.release) // the stand-in fails every call: each is answered restore-node-unreachable
	for range 4 {
		<-replies
	}
	st = restoreStatus(t, r)
	if st.Inflight != 0 || len(st.Nodes) != 0 || outcomes(r, string(contracts.RestoreNodeUnreachable)) != 4 {
		t.Fatalf("after Corestore answered: %+v", st)
	}
}

// outcomes is relay_restore_requests_total{outcome} summed over the operations: the count the
// status page lists beside the restore's Status.
func outcomes(r *Restore, outcome string) float64 {
	var n float64
	for _, op := range []string{"prepare", "write", "status", "execute", "cleanup", contracts.RefusalLabelOther} {
		n += testutil.ToFloat64(r.metrics.requests.WithLabelValues(op, outcome))
	}
	return n
}

// restoreStatus is the restore's Status, checked to marshal without a control, a grant or an
// origin.
func restoreStatus(t *testing.T, r *Restore) Status {
	t.Helper()
	st, ok := r.Status().(Status)
	if !ok {
		t.Fatalf("Status() is a %T", r.Status())
	}
	out, err := json.Marshal(st)
	if err != nil {
		t.Fatal(err)
	}
	for _, secret := range []string{`"grant"`, "corestore.node-", "secret-looking"} {
		if strings.Contains(string(out), secret) {
			t.Fatalf("the status shows %q: %s", secret, out)
		}
	}
	return st
}
