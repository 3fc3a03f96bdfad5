package relay

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"net/url"
	"strings"
	"sync"
	"time"
)

// The Cloudly session's history, for the status page and /readyz (issue 27): why the relay is
// detached — the newest failure by kind, when it retries, how many attempts since it was last
// attached — and the last maxOutages outages. It does no I/O and reads no clock: every event
// carries its time, so it is tested as a plain value.

// maxOutages is how many outages the status page lists, the newest last.
const maxOutages = 20

// Kinds of attach failure.
const (
	failDial      = "dial"         // TCP, DNS, proxy or the WebSocket upgrade failed
	failTLS       = "tls"          // Cloudly's certificate was refused, or the TLS handshake failed
	failToken     = "token"        // the token file could not be read
	failRefused   = "refused"      // Cloudly refused a step, with a refusal name
	failOffer     = "incompatible" // a protocol offer one side refuses (retried every 5 min)
	failMalformed = "malformed"    // Cloudly's answer had no readable offer
	failStep      = "failed"       // an attach call failed locally: timeout, socket lost
	failLost      = "session-lost" // an attached session was lost
)

// sessionFailure is one failure of the Cloudly session.
type sessionFailure struct {
	Kind    string    `json:"kind"`              // one of the fail… kinds
	Step    string    `json:"step,omitempty"`    // the attach step: "cloudly client session" or "cluster relay registration"
	Refusal string    `json:"refusal,omitempty"` // the refusal name, for kind refused
	Message string    `json:"message"`           // the error, any URL query cut out
	At      time.Time `json:"at"`
}

// summary is the failure in a few words: "registration refused relay-cluster-unknown",
// "dial failed: …", "session lost: …".
func (f sessionFailure) summary() string {
	step := "attach"
	if f.Step == stepRegistration.String() {
		step = "registration"
	} else if f.Step != "" {
		step = "client session"
	}
	switch f.Kind {
	case failRefused:
		return step + " refused " + f.Refusal
	case failDial:
		return "dial failed: " + f.Message
	case failTLS:
		return "TLS failed: " + f.Message
	case failToken:
		return "token unreadable: " + f.Message
	case failOffer:
		return step + " protocol incompatible: " + f.Message
	case failMalformed:
		return step + " answer malformed"
	case failLost:
		return "session lost: " + f.Message
	}
	return step + " failed: " + f.Message
}

// outage is one period detached while the relay led: from the loss (or the first failed attach)
// to the next attach. End is nil while it lasts.
type outage struct {
	Start time.Time  `json:"start"`
	End   *time.Time `json:"end"`
	Cause string     `json:"cause"` // the failure that began it, in a few words
}

// certInfo is a certificate's names and expiry; never its key.
type certInfo struct {
	Subject  string    `json:"subject"`
	DNSNames []string  `json:"dnsNames,omitempty"`
	NotAfter time.Time `json:"notAfter"`
}

func certOf(c *x509.Certificate) *certInfo {
	if c == nil {
		return nil
	}
	return &certInfo{Subject: c.Subject.CommonName, DNSNames: c.DNSNames, NotAfter: c.NotAfter}
}

// sessionHistory is what the status page shows of the history.
type sessionHistory struct {
	LastFailure *sessionFailure `json:"lastFailure,omitempty"` // the newest, attached or not
	NextRetry   *time.Time      `json:"nextRetry,omitempty"`   // while detached and waiting
	// Attempts counts sockets dialled since the relay was last attached (since it started
	// leading, before the first attach).
	Attempts int       `json:"attemptsSinceAttached"`
	Outages  []outage  `json:"outages"` // the last maxOutages, the newest last
	PeerCert *certInfo `json:"-"`       // shown as certificates.cloudly
}

// sessionLog records the history. Guarded by mu; the session loop writes it, the admin
// handlers read it.
type sessionLog struct {
	mu        sync.Mutex
	last      *sessionFailure // guarded by mu
	nextRetry time.Time       // guarded by mu: zero while attached or dialling
	attempts  int             // guarded by mu
	outages   []outage        // guarded by mu: at most maxOutages; the last one open when its End is nil
	peerCert  *certInfo       // guarded by mu: of the newest TLS socket to Cloudly
	query     string          // set at construction: the Cloudly URL's raw query, cut from messages
}

func newSessionLog(cloudlyURL string) *sessionLog {
	l := &sessionLog{}
	if u, err := url.Parse(cloudlyURL); err == nil {
		l.query = u.RawQuery
	}
	return l
}

// dialling: a new socket is being dialled.
func (l *sessionLog) dialling() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.attempts++
	l.nextRetry = time.Time{}
}

// connected: a TLS socket reached Cloudly, whose certificate state names.
func (l *sessionLog) connected(state *tls.ConnectionState) {
	if state == nil || len(state.PeerCertificates) == 0 {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.peerCert = certOf(state.PeerCertificates[0])
}

// failed: an attach failed, or (kind failLost) an attached session was lost. An outage begins
// unless one is open.
func (l *sessionLog) failed(now time.Time, f sessionFailure) {
	f.At = now
	f.Message = l.redact(f.Message)
	l.mu.Lock()
	defer l.mu.Unlock()
	l.last = &f
	if n := len(l.outages); n == 0 || l.outages[n-1].End != nil {
		if n == maxOutages {
			l.outages = append(l.outages[:0], l.outages[1:]...)
		}
		l.outages = append(l.outages, outage{Start: now, Cause: f.summary()})
	}
}

// waiting: the next socket is dialled at t.
func (l *sessionLog) waiting(t time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.nextRetry = t
}

// retryIn is how long from now until the relay dials Cloudly again while detached and waiting (its
// reconnect backoff); 0 while it dials or is attached.
func (l *sessionLog) retryIn(now time.Time) time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.nextRetry.IsZero() || !l.nextRetry.After(now) {
		return 0
	}
	return l.nextRetry.Sub(now)
}

// attached: Cloudly accepted a registration; an open outage ends.
func (l *sessionLog) attached(now time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.attempts, l.nextRetry = 0, time.Time{}
	l.endLocked(now)
}

// stopped: the session was closed on purpose (shutdown, a step down); an open outage ends, as
// the relay no longer tries.
func (l *sessionLog) stopped(now time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.nextRetry = time.Time{}
	l.endLocked(now)
}

func (l *sessionLog) endLocked(now time.Time) {
	if n := len(l.outages); n > 0 && l.outages[n-1].End == nil {
		l.outages[n-1].End = &now
	}
}

// history copies what the status page shows.
func (l *sessionLog) history() sessionHistory {
	l.mu.Lock()
	defer l.mu.Unlock()
	h := sessionHistory{Attempts: l.attempts, Outages: make([]outage, len(l.outages)), PeerCert: l.peerCert}
	copy(h.Outages, l.outages)
	if l.last != nil {
		f := *l.last
		h.LastFailure = &f
	}
	if !l.nextRetry.IsZero() {
		t := l.nextRetry
		h.NextRetry = &t
	}
	return h
}

// detachedReason says why a detached relay is not attached, at now: the newest failure and when
// it retries ("registration refused relay-cluster-unknown: next retry in 4s").
func (h sessionHistory) detachedReason(now time.Time) string {
	if h.LastFailure == nil {
		return "attaching"
	}
	s := h.LastFailure.summary()
	switch {
	case h.NextRetry == nil:
		return s + ": retrying now"
	case !h.NextRetry.After(now):
		return s + ": retrying now"
	}
	d := h.NextRetry.Sub(now)
	if d < time.Second {
		return s + ": next retry in " + d.Round(10*time.Millisecond).String()
	}
	return s + ": next retry in " + d.Round(time.Second).String()
}

// redact cuts the Cloudly URL's query, which may carry a credential, out of an error message.
func (l *sessionLog) redact(msg string) string {
	if l.query == "" {
		return msg
	}
	return strings.ReplaceAll(msg, l.query, "…")
}

// dialFailure names a failed dial: TLS when Cloudly's certificate or handshake was the cause.
func dialFailure(err error) sessionFailure {
	var (
		verify  *tls.CertificateVerificationError
		unknown x509.UnknownAuthorityError
		host    x509.HostnameError
		invalid x509.CertificateInvalidError
		record  tls.RecordHeaderError
		alert   tls.AlertError
	)
	kind := failDial
	if errors.As(err, &verify) || errors.As(err, &unknown) || errors.As(err, &host) || errors.As(err, &invalid) ||
		errors.As(err, &record) || errors.As(err, &alert) {
		kind = failTLS
	}
	// The WebSocket library's own prefix says only what the kind says already.
	return sessionFailure{Kind: kind, Message: strings.TrimPrefix(err.Error(), "failed to WebSocket dial: ")}
}
