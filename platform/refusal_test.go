package platform_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"

	"code.foss.global/serve.zone/relay/contracts"
	"code.foss.global/serve.zone/relay/platform"
	"code.foss.global/serve.zone/relay/testenv/sim"
)

// TestNotAccepted: Cloudly answers { accepted: false }: Corestore never hears the backup was
// delivered, and the relay offers it again at the next listing; once Cloudly accepts, it is.
func TestNotAccepted(t *testing.T) {
	t.Parallel()
	h := newHarness(t, harnessOptions{platform: platform.Options{ListInterval: 100 * time.Millisecond}})
	var offers atomic.Int64
	var early atomic.Bool
	h.Cloudly.Platform().SetAccept(func(string) bool {
		if offers.Add(1) < 3 {
			return false
		}
		if h.a.Platform().Delivered() != 0 {
			early.Store(true) // Corestore heard of a delivery Cloudly had refused
		}
		return true
	})
	h.a.Platform().AddBackup("bk-no", sim.PlatformClosure{ServiceID: "svc-1", Size: 300 << 10})
	h.waitFor("delivered once accepted", func() bool { return h.a.Platform().Delivered() == 1 })
	if early.Load() || offers.Load() != 3 {
		t.Fatalf("offers %d, delivered before acceptance %v", offers.Load(), early.Load())
	}
	if got := h.Metric("relay_platform_backups_total", "outcome", "not-accepted"); got != 2 {
		t.Fatalf("not-accepted metric %v", got)
	}
	// Corestore hears of the delivery before the agent counts it: the status follows.
	h.waitFor("the status counting the delivery", func() bool { return h.node("node-a").Delivered == 1 })
}

// TestNoCorestoreOrigin: a push naming no Corestore leaves the agent idle — no desired state, no
// enrollment — and a credential pushed for a node without a Corestore origin is refused
// restore-node-not-carried; a binding for a node without one goes nowhere.
func TestNoCorestoreOrigin(t *testing.T) {
	t.Parallel()
	h := newHarness(t, harnessOptions{noOrigins: true})
	h.waitFor("the configuration applied", func() bool { return h.Cloudly.ConfigPushes() > 0 })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// The relay answers the push and pull in order: a round trip after the push proves it idled.
	if _, err := h.Cloudly.Call(ctx, contracts.MethodPushCorestoreCredential, json.RawMessage(`{"nodeId":"node-a","envelope":"x"}`)); !errors.Is(err, contracts.RestoreNodeNotCarried) {
		t.Fatalf("a credential for a node without a Corestore: %v", err)
	}
	for _, m := range []string{contracts.MethodGetClusterPlatformDesiredState, contracts.MethodBeginSecretRecipientEnrollment} {
		if n := h.Cloudly.Received(m); n != 0 {
			t.Fatalf("%s called %d times with no Corestore configured", m, n)
		}
	}
	if st := h.status(); st.Corestores != 0 || len(st.Nodes) != 0 || st.Enrolled {
		t.Fatalf("status %+v", st)
	}
}

// TestCredentialRefusals: an envelope sealed to another key, one that is not an envelope, a
// credential that cannot be a bearer: each refused relay-request-invalid, by name, without the
// credential in the reason; the node's credential stays what it was.
func TestCredentialRefusals(t *testing.T) {
	t.Parallel()
	h := newHarness(t, harnessOptions{})
	h.waitFor("credentials pushed", func() bool { return h.Cloudly.Platform().CredentialsPushed() == 2 })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := h.Cloudly.Platform().PushCredential(ctx, "node-a", "has a space"); !errors.Is(err, contracts.RelayRequestInvalid) ||
		strings.Contains(err.Error(), "has a space") {
		t.Fatalf("a credential with a space: %v", err)
	}
	for _, env := range []string{"not-an-envelope", strings.Repeat("A", 80)} {
		body, _ := json.Marshal(map[string]string{"nodeId": "node-a", "envelope": env})
		if _, err := h.Cloudly.Call(ctx, contracts.MethodPushCorestoreCredential, body); !errors.Is(err, contracts.RelayRequestInvalid) {
			t.Fatalf("envelope %.10s: %v", env, err)
		}
	}
	if _, err := h.Cloudly.Call(ctx, contracts.MethodPushCorestoreCredential, json.RawMessage(`{"nodeId":"no de","envelope":"x"}`)); !errors.Is(err, contracts.RelayRequestInvalid) {
		t.Fatalf("a bad node id: %v", err)
	}
	if !h.node("node-a").Credential {
		t.Fatal("a refused push dropped the node's credential")
	}
	// A node sending one of the relay's own calls is refused as before.
	n := h.Node("node-n")
	for _, m := range []string{contracts.MethodGetClusterPlatformDesiredState, contracts.MethodBackupServiceDatabaseClosure,
		contracts.MethodRestoreServiceDatabaseClosure, contracts.MethodBeginSecretRecipientEnrollment, contracts.MethodCompleteSecretRecipientEnrollment} {
		if _, err := n.Call(ctx, m, json.RawMessage(`{"session":`+string(n.Session())+`}`)); !errors.Is(err, contracts.RelayMethodUnknown) {
			t.Fatalf("%s from a node: %v", m, err)
		}
	}
	if got := h.Metric("relay_platform_credentials_total", "outcome", "relay-request-invalid"); got < 4 {
		t.Fatalf("refused credential metric %v", got)
	}
}

// TestCredentialDroppedAfterHorizon, on an injected clock: while detached, a node's credential is
// kept for the horizon (the default, 4 h) and then dropped; after the next attach the relay enrols
// again and Cloudly pushes a new one.
func TestCredentialDroppedAfterHorizon(t *testing.T) {
	t.Parallel()
	fake := clocktesting.NewFakeClock(time.Now())
	h := newHarness(t, harnessOptions{platform: platform.Options{Clock: fake}})
	h.waitFor("credentials pushed", func() bool { return h.Cloudly.Platform().CredentialsPushed() == 2 })
	h.Cloudly.SetAvailable(false)
	h.waitFor("the agent detached", func() bool { return !h.Relay.Upstream().Attached() && !h.status().Enrolled })
	fake.Step(platform.DefaultCredentialHorizon - time.Second)
	if !h.node("node-a").Credential || !h.node("node-b").Credential {
		t.Fatal("a credential was dropped before the horizon")
	}
	fake.Step(time.Second)
	h.waitFor("credentials dropped past the horizon", func() bool { return !h.node("node-a").Credential && !h.node("node-b").Credential })
	if got := h.Metric("relay_platform_credentials_dropped_total"); got != 2 {
		t.Fatalf("dropped metric %v", got)
	}
	h.Cloudly.SetAvailable(true)
	h.waitFor("enrolled again, credentials back", func() bool {
		return h.Cloudly.Platform().Enrollments() == 2 && h.node("node-a").Credential && h.node("node-b").Credential
	})
}
