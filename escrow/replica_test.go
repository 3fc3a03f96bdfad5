package escrow

import (
	"encoding/json"
	"testing"
)

// TestReplicaCopiesRunsPairsAndKey: a standby fed the leader's records (a snapshot, then every
// change) holds the same runs, re-binds the same registrations, and drops what the leader drops.
func TestReplicaCopiesRunsPairsAndKey(t *testing.T) {
	leader, clk, _ := holdFixture(t)
	standby, err := New(Options{Now: clk.Now})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := leader.Hold(true, gridRun("node-a", 23, slot0).body(t)); err != nil {
		t.Fatal(err)
	}
	registration := json.RawMessage(`{"nodeId":"node-a","bearer":"b","nodeInstanceNonce":"n"}`)
	answer := json.RawMessage(`{"session":{"nodeId":"node-a"},"protocol":{}}`)
	leader.Accepted("node-a", leader.RegistrationDigest(registration), answer)

	var adoptErr error
	stop := leader.Replicate(func(key string, value []byte) {
		if err := standby.Adopt(key, value); err != nil && adoptErr == nil {
			adoptErr = err
		}
	})
	defer stop()
	runB := gridRun("node-b", 6, slot0)
	runB.controller = cloudlyB
	if _, err := leader.Hold(true, runB.body(t)); err != nil {
		t.Fatal(err)
	}
	if adoptErr != nil {
		t.Fatal(adoptErr)
	}
	if got := standby.sched.runs(); got != 2 {
		t.Fatalf("the standby holds %d runs, want node-a's (snapshot) and node-b's (change)", got)
	}
	if got, ok := standby.Rebind(standby.RegistrationDigest(registration)); !ok || string(got) != string(answer) {
		t.Fatalf("the standby re-binds %s, %v: want the leader's answer under the leader's key", got, ok)
	}
	if _, ok := standby.Rebind(standby.RegistrationDigest(json.RawMessage(`{"nodeId":"node-a"}`))); ok {
		t.Fatal("the standby re-bound a registration that differs")
	}

	// The leader clears node-a's run: the run and its pair go on the standby too.
	if _, err := leader.Hold(true, json.RawMessage(`{"nodeId":"node-a","projection":`+string(projectionOf("node-a").AppendJSON(nil))+`,"renewals":[]}`)); err != nil {
		t.Fatal(err)
	}
	if got := standby.sched.runs(); got != 1 {
		t.Fatalf("the standby holds %d runs after the leader cleared one, want 1", got)
	}
	if _, ok := standby.Rebind(standby.RegistrationDigest(registration)); ok {
		t.Fatal("the standby still re-binds a node whose run the leader dropped")
	}

	// Records that do not read change nothing.
	if err := standby.Adopt("run/node-c", []byte(`{"nodeId":"node-c"}`)); err == nil || standby.sched.runs() != 1 {
		t.Fatalf("a replicated run that does not read was adopted: %v", err)
	}
	standby.ForgetCopy()
	if standby.sched.runs() != 0 {
		t.Fatal("ForgetCopy kept a run")
	}
}

// TestRebindHorizon: a kept registration re-binds until the escrow horizon after its acceptance.
func TestRebindHorizon(t *testing.T) {
	e, clk, _ := holdFixture(t)
	reg := json.RawMessage(`{"nodeId":"node-a"}`)
	e.Accepted("node-a", e.RegistrationDigest(reg), json.RawMessage(`{}`))
	if _, ok := e.Rebind(e.RegistrationDigest(reg)); !ok {
		t.Fatal("a kept registration did not re-bind")
	}
	clk.advance(4 * 60 * minute)
	if _, ok := e.Rebind(e.RegistrationDigest(reg)); ok {
		t.Fatal("a registration re-bound past the escrow horizon")
	}
}
