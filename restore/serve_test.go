package restore

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"code.foss.global/serve.zone/relay/contracts"
	"code.foss.global/serve.zone/relay/testenv/await"
)

func newRestore(t *testing.T, cs Corestore, opts Options) *Restore {
	t.Helper()
	r, err := New(cs, opts)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// blockingPort is a Corestore port that answers only when its context ends or release is closed.
type blockingPort struct {
	release chan struct{}
	calls   atomic.Int64
}

func (p *blockingPort) Call(ctx context.Context, _, _ string, _ json.RawMessage) (json.RawMessage, error) {
	p.calls.Add(1)
	select {
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-p.release:
		return nil, errors.New("dial tcp 127.0.0.1:1: secret-looking local detail")
	}
}

const statusRequest = `{"nodeId":"node-a","control":{"grant":"g"}}`

// TestServeNeverBlocksAndRepliesOnce: Serve returns while the Corestore call is still waiting,
// the reply comes once, and a port error that is not a refusal is answered as unreachable without
// its text.
func TestServeNeverBlocksAndRepliesOnce(t *testing.T) {
	port := &blockingPort{release: make(chan struct{})}
	r := newRestore(t, port, Options{Logger: zerolog.Nop()})
	defer r.Close()
	r.Configured(contracts.ClusterRelayConfig{Corestores: []contracts.CorestoreOrigin{{NodeID: "node-a", Origin: "https://corestore.node-a.example"}}})
	replies := make(chan error, 2)
	served := make(chan struct{})
	go func() {
		r.Serve(contracts.MethodGetIsolatedRestoreProgressOnNode, json.RawMessage(statusRequest), func(_ json.RawMessage, err error) { replies <- err })
		close(served)
	}()
	// The port is released only after Serve has returned: a Serve that waits for the call never does.
	select {
	case <-served:
	case <-time.After(10 * time.Second):
		t.Fatal("Serve blocked on the Corestore call")
	}
	select {
	case <-replies:
		t.Fatal("replied before Corestore answered")
	case <-time.After(20 * time.Millisecond):
	}
	close(port.release)
	err := <-replies
	if !errors.Is(err, contracts.RestoreNodeUnreachable) || err.Error() != "restore-node-unreachable: the call to the node's Corestore failed" {
		t.Fatalf("reply %v", err)
	}
	select {
	case err := <-replies:
		t.Fatalf("a second reply: %v", err)
	case <-time.After(20 * time.Millisecond):
	}
}

// TestAnsweredCallHasFreedItsSlot: a node that calls again the moment it has its answer is not
// refused relay-node-busy for the call it just finished (the slot is free before the answer).
func TestAnsweredCallHasFreedItsSlot(t *testing.T) {
	port := &blockingPort{release: make(chan struct{})}
	close(port.release) // every call fails at once: restore-node-unreachable
	r := newRestore(t, port, Options{Logger: zerolog.Nop(), MaxInflightPerNode: 1})
	defer r.Close()
	r.Configured(contracts.ClusterRelayConfig{Corestores: []contracts.CorestoreOrigin{{NodeID: "node-a", Origin: "https://corestore.node-a.example"}}})
	second := make(chan error, 1)
	r.Serve(contracts.MethodGetIsolatedRestoreProgressOnNode, json.RawMessage(statusRequest), func(json.RawMessage, error) {
		// Called again from the answer itself, as a node that polls progress does.
		r.Serve(contracts.MethodGetIsolatedRestoreProgressOnNode, json.RawMessage(statusRequest), func(_ json.RawMessage, err error) { second <- err })
	})
	if err := <-second; !errors.Is(err, contracts.RestoreNodeUnreachable) {
		t.Fatalf("the call made on the first one's answer: %v (want restore-node-unreachable from the stand-in)", err)
	}
}

// TestCloseAnswersCallsInFlight: Close abandons waiting calls, each answered once, and refuses
// new ones.
func TestCloseAnswersCallsInFlight(t *testing.T) {
	port := &blockingPort{release: make(chan struct{})}
	r := newRestore(t, port, Options{Logger: zerolog.Nop()})
	r.Configured(contracts.ClusterRelayConfig{Corestores: []contracts.CorestoreOrigin{{NodeID: "node-a", Origin: "https://corestore.node-a.example"}}})
	replies := make(chan error, 8)
	for range 3 {
		r.Serve(contracts.MethodGetIsolatedRestoreProgressOnNode, json.RawMessage(statusRequest), func(_ json.RawMessage, err error) { replies <- err })
	}
	await.Until(t, "three calls at Corestore", 10*time.Second, func() bool { return port.calls.Load() >= 3 })
	r.Close()
	for range 3 {
		if err := <-replies; !errors.Is(err, contracts.RestoreNodeUnreachable) {
			t.Fatalf("abandoned call answered %v", err)
		}
	}
	r.Serve(contracts.MethodGetIsolatedRestoreProgressOnNode, json.RawMessage(statusRequest), func(_ json.RawMessage, err error) { replies <- err })
	if err := <-replies; err == nil || err.Error() != "restore-node-unreachable: the relay is shutting down" {
		t.Fatalf("after Close: %v", err)
	}
}

func TestOverallBoundRefusesAtOnce(t *testing.T) {
	port := &blockingPort{release: make(chan struct{})}
	r := newRestore(t, port, Options{Logger: zerolog.Nop(), MaxInflight: 2, MaxInflightPerNode: 2})
	defer r.Close()
	defer close(port.release)
	r.Configured(contracts.ClusterRelayConfig{Corestores: []contracts.CorestoreOrigin{{NodeID: "node-a", Origin: "https://a.example"}, {NodeID: "node-b", Origin: "https://b.example"}}})
	replies := make(chan error, 8)
	reply := func(_ json.RawMessage, err error) { replies <- err }
	r.Serve(contracts.MethodGetIsolatedRestoreProgressOnNode, json.RawMessage(statusRequest), reply)
	r.Serve(contracts.MethodGetIsolatedRestoreProgressOnNode, json.RawMessage(statusRequest), reply)
	r.Serve(contracts.MethodGetIsolatedRestoreProgressOnNode, json.RawMessage(strings.Replace(statusRequest, "node-a", "node-b", 1)), reply)
	if err := <-replies; err == nil || err.Error() != "relay-node-busy: the relay already has 2 isolated-restore calls in flight" {
		t.Fatalf("third call: %v", err)
	}
}

func TestUnknownMethodIsRefused(t *testing.T) {
	r := newRestore(t, &blockingPort{}, Options{Logger: zerolog.Nop()})
	defer r.Close()
	var got error
	r.Serve("pushClusterRouteTable", json.RawMessage(statusRequest), func(_ json.RawMessage, err error) { got = err })
	if !errors.Is(got, contracts.RelayMethodUnknown) {
		t.Fatalf("answered %v", got)
	}
}

func TestMetricNames(t *testing.T) {
	reg := prometheus.NewRegistry()
	r := newRestore(t, &blockingPort{}, Options{Registerer: reg, Logger: zerolog.Nop()})
	defer r.Close()
	r.Serve(contracts.MethodPrepareIsolatedRestoreOnNode, json.RawMessage(`{}`), func(json.RawMessage, error) {})
	r.Configured(contracts.ClusterRelayConfig{Corestores: nil})
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]bool{"relay_restore_requests_total": true, "relay_restore_corestores": true, "relay_restore_inflight": true}
	for _, f := range families {
		name := f.GetName()
		if !want[name] {
			t.Errorf("unexpected metric %s", name)
		}
		if !strings.HasPrefix(name, "relay_restore_") {
			t.Errorf("metric %s is outside namespace relay, subsystem restore", name)
		}
		if f.GetType().String() == "COUNTER" && !strings.HasSuffix(name, "_total") {
			t.Errorf("counter %s does not end in _total", name)
		}
		if f.GetType().String() != "COUNTER" && strings.HasSuffix(name, "_total") {
			t.Errorf("%s ends in _total but is not a counter", name)
		}
		delete(want, name)
	}
	if len(want) > 0 {
		t.Errorf("missing metrics %v", want)
	}
}
