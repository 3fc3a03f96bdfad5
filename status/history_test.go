package status

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"
)

// TestSessionLog: the history says why a relay is detached and when it retries, opens one outage
// per loss and closes it at the next attach, keeps the last MaxOutages, and never shows the
// Cloudly URL's query.
func TestSessionLog(t *testing.T) {
	t0 := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	at := func(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }
	l := NewSessionLog("wss://cloudly.example/relay?access=query-secret")

	if r := l.History().DetachedReason(at(0)); r != "attaching" {
		t.Fatalf("before any failure: %q", r)
	}
	l.Dialling()
	l.Failed(at(1), DialFailure(fmt.Errorf("Get %q: dial tcp: connection refused", "https://cloudly.example/relay?access=query-secret")))
	l.Waiting(at(3))
	h := l.History()
	if h.Attempts != 1 || h.LastFailure.Kind != FailDial || len(h.Outages) != 1 || h.Outages[0].End != nil {
		t.Fatalf("after a failed dial: %+v", h)
	}
	if strings.Contains(h.LastFailure.Message, "query-secret") || strings.Contains(h.Outages[0].Cause, "query-secret") {
		t.Fatalf("the URL's query is shown: %q", h.LastFailure.Message)
	}
	if r := h.DetachedReason(at(1)); !strings.HasPrefix(r, "dial failed: ") || !strings.HasSuffix(r, ": next retry in 2s") {
		t.Fatalf("reason = %q", r)
	}

	l.Dialling()
	l.Failed(at(3), Failure{Kind: FailRefused, Step: StepRegistration, Refusal: "relay-node-foreign", Message: "not in the cluster"})
	l.Waiting(at(7))
	h = l.History()
	if r := h.DetachedReason(at(3)); r != "registration refused relay-node-foreign: next retry in 4s" {
		t.Fatalf("reason = %q", r)
	}
	if h.Attempts != 2 || len(h.Outages) != 1 || !strings.HasPrefix(h.Outages[0].Cause, "dial failed") {
		t.Fatalf("a second failure in one outage: %+v", h)
	}
	if r := h.DetachedReason(at(8)); !strings.HasSuffix(r, ": retrying now") {
		t.Fatalf("reason past the retry time = %q", r)
	}

	l.Dialling()
	l.Attached(at(8))
	h = l.History()
	if h.Attempts != 0 || h.NextRetry != nil || h.Outages[0].End == nil || !h.Outages[0].End.Equal(at(8)) {
		t.Fatalf("attached: %+v", h)
	}

	// Losses after attaches: the newest MaxOutages kept, the newest last.
	for i := range MaxOutages + 5 {
		l.Failed(at(100+10*i), Failure{Kind: FailLost, Message: fmt.Sprintf("loss %d", i)})
		l.Attached(at(105 + 10*i))
	}
	h = l.History()
	if len(h.Outages) != MaxOutages || h.Outages[MaxOutages-1].Cause != fmt.Sprintf("session lost: loss %d", MaxOutages+4) ||
		h.Outages[0].Cause != "session lost: loss 5" {
		t.Fatalf("outages: first %+v, last %+v of %d", h.Outages[0], h.Outages[len(h.Outages)-1], len(h.Outages))
	}

	// A shutdown ends an open outage: the relay no longer tries.
	l.Failed(at(1000), Failure{Kind: FailLost, Message: "EOF"})
	l.Stopped(at(1001))
	if h = l.History(); h.Outages[MaxOutages-1].End == nil {
		t.Fatal("a stopped session left its outage open")
	}
}

// TestDialFailureKinds: a refused certificate is a TLS failure, anything else a dial failure.
func TestDialFailureKinds(t *testing.T) {
	if k := DialFailure(fmt.Errorf("dial: %w", errors.New("connection refused"))).Kind; k != FailDial {
		t.Fatalf("connection refused: %s", k)
	}
	if k := DialFailure(fmt.Errorf("get: %w", &tls.CertificateVerificationError{Err: x509.UnknownAuthorityError{}})).Kind; k != FailTLS {
		t.Fatalf("a certificate verification error: %s", k)
	}
}

// TestCounterRates: a rate is over the newest sample at least a minute old, or the oldest before
// there is one; a counter that went down restarted from zero.
func TestCounterRates(t *testing.T) {
	t0 := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	var c counterRates
	if _, ok := c.perMinute(t0, "a{}", 5); ok {
		t.Fatal("a rate without samples")
	}
	c.add(t0, map[string]float64{"a{}": 0})
	if _, ok := c.perMinute(t0, "a{}", 5); ok {
		t.Fatal("a rate over no time")
	}
	if r, _ := c.perMinute(t0.Add(30*time.Second), "a{}", 10); r != 20 {
		t.Fatalf("10 in 30 s = %v/min, want 20", r)
	}
	for s := 10; s <= 120; s += 10 {
		c.add(t0.Add(time.Duration(s)*time.Second), map[string]float64{"a{}": float64(s)})
	}
	if len(c.samples) > int(rateWindow/rateStep)+1 {
		t.Fatalf("%d samples kept", len(c.samples))
	}
	// From 60 s (value 60) to 120 s (value 120): 60 per minute.
	if r, _ := c.perMinute(t0.Add(120*time.Second), "a{}", 120); r != 60 {
		t.Fatalf("rate = %v/min, want 60", r)
	}
	if r, _ := c.perMinute(t0.Add(120*time.Second), "a{}", 6); r != 6 {
		t.Fatalf("after a reset = %v/min, want 6", r)
	}
}
