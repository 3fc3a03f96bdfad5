package status

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"net/url"
	"strings"
	"sync"
	"time"
)

// The Cloudly session's history, for the status page and /readyz: why the relay is detached —
// the newest failure by kind, when it retries, how many attempts since it was last attached — and
// the last MaxOutages outages. The relay's session loop records into a SessionLog; the page reads
// a copy (History). It does no I/O and reads no clock: every event carries its time, so it is
// tested as a plain value.

// MaxOutages is how many outages the status page lists, the newest last.
const MaxOutages = 20

// Kinds of attach failure (Failure.Kind).
const (
	FailDial      = "dial"         // TCP, DNS, proxy or the WebSocket upgrade failed
	FailTLS       = "tls"          // Cloudly's certificate was refused, or the TLS handshake failed
	FailToken     = "token"        // the token file could not be read
	FailRefused   = "refused"      // Cloudly refused a step, with a refusal name
	FailOffer     = "incompatible" // a protocol offer one side refuses (retried every 5 min)
	FailMalformed = "malformed"    // Cloudly's answer had no readable offer
	FailStep      = "failed"       // an attach call failed locally: timeout, socket lost
	FailLost      = "session-lost" // an attached session was lost
)

// The attach steps a Failure names (Failure.Step).
const (
	StepClientSession = "cloudly client session"     // registerCloudlyClientSession
	StepRegistration  = "cluster relay registration" // registerClusterRelay
)

// Failure is one failure of the Cloudly session.
type Failure struct {
	Kind    string    `json:"kind"`              // one of the Fail… kinds
	Step    string    `json:"step,omitempty"`    // the attach step: StepClientSession or StepRegistration
	Refusal string    `json:"refusal,omitempty"` // the refusal name, for kind refused
	Message string    `json:"message"`           // the error, any URL query cut out
	At      time.Time `json:"at"`
}

// Summary is the failure in a few words: "registration refused relay-cluster-unknown",
// "dial failed: …", "session lost: …".
func (f Failure) Summary() string {
	step := "attach"
	if f.Step == StepRegistration {
		step = "registration"
	} else if f.Step != "" {
		step = "client session"
	}
	switch f.Kind {
	case FailRefused:
		return step + " refused " + f.Refusal
	case FailDial:
		return "dial failed: " + f.Message
	case FailTLS:
		return "TLS failed: " + f.Message
	case FailToken:
		return "token unreadable: " + f.Message
	case FailOffer:
		return step + " protocol incompatible: " + f.Message
	case FailMalformed:
		return step + " answer malformed"
	case FailLost:
		return "session lost: " + f.Message
	}
	return step + " failed: " + f.Message
}

// Outage is one period detached while the relay led: from the loss (or the first failed attach)
// to the next attach. End is nil while it lasts.
type Outage struct {
	Start time.Time  `json:"start"`
	End   *time.Time `json:"end"`
	Cause string     `json:"cause"` // the failure that began it, in a few words
}

// CertInfo is a certificate's names and expiry; never its key.
type CertInfo struct {
	Subject  string    `json:"subject"`
	DNSNames []string  `json:"dnsNames,omitempty"`
	NotAfter time.Time `json:"notAfter"`
}

// CertOf is c's names and expiry; nil for nil.
func CertOf(c *x509.Certificate) *CertInfo {
	if c == nil {
		return nil
	}
	return &CertInfo{Subject: c.Subject.CommonName, DNSNames: c.DNSNames, NotAfter: c.NotAfter}
}

// History is what the status page shows of the session's history.
type History struct {
	LastFailure *Failure   `json:"lastFailure,omitempty"` // the newest, attached or not
	NextRetry   *time.Time `json:"nextRetry,omitempty"`   // while detached and waiting
	// Attempts counts sockets dialled since the relay was last attached (since it started
	// leading, before the first attach).
	Attempts int       `json:"attemptsSinceAttached"`
	Outages  []Outage  `json:"outages"` // the last MaxOutages, the newest last
	PeerCert *CertInfo `json:"-"`       // shown as certificates.cloudly
}

// SessionLog records the history. Guarded by mu; the session loop writes it, the admin
// handlers read it.
type SessionLog struct {
	mu        sync.Mutex
	last      *Failure  // guarded by mu
	nextRetry time.Time // guarded by mu: zero while attached or dialling
	attempts  int       // guarded by mu
	outages   []Outage  // guarded by mu: at most MaxOutages; the last one open when its End is nil
	peerCert  *CertInfo // guarded by mu: of the newest TLS socket to Cloudly
	query     string    // set at construction: the Cloudly URL's raw query, cut from messages
}

// NewSessionLog is the history of a session with the Cloudly at cloudlyURL, whose query (which
// may carry a credential) it cuts out of every message.
func NewSessionLog(cloudlyURL string) *SessionLog {
	l := &SessionLog{}
	if u, err := url.Parse(cloudlyURL); err == nil {
		l.query = u.RawQuery
	}
	return l
}

// Dialling: a new socket is being dialled.
func (l *SessionLog) Dialling() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.attempts++
	l.nextRetry = time.Time{}
}

// Connected: a TLS socket reached Cloudly, whose certificate state names.
func (l *SessionLog) Connected(state *tls.ConnectionState) {
	if state == nil || len(state.PeerCertificates) == 0 {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.peerCert = CertOf(state.PeerCertificates[0])
}

// Failed: an attach failed, or (kind FailLost) an attached session was lost. An outage begins
// unless one is open.
func (l *SessionLog) Failed(now time.Time, f Failure) {
	f.At = now
	f.Message = l.redact(f.Message)
	l.mu.Lock()
	defer l.mu.Unlock()
	l.last = &f
	if n := len(l.outages); n == 0 || l.outages[n-1].End != nil {
		if n == MaxOutages {
			l.outages = append(l.outages[:0], l.outages[1:]...)
		}
		l.outages = append(l.outages, Outage{Start: now, Cause: f.Summary()})
	}
}

// Waiting: the next socket is dialled at t.
func (l *SessionLog) Waiting(t time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.nextRetry = t
}

// RetryIn is how long from now until the relay dials Cloudly again while detached and waiting
// (its reconnect backoff); 0 while it dials or is attached.
func (l *SessionLog) RetryIn(now time.Time) time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.nextRetry.IsZero() || !l.nextRetry.After(now) {
		return 0
	}
	return l.nextRetry.Sub(now)
}

// Attached: Cloudly accepted a registration; an open outage ends.
func (l *SessionLog) Attached(now time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.attempts, l.nextRetry = 0, time.Time{}
	l.endLocked(now)
}

// Stopped: the session was closed on purpose (shutdown, a step down); an open outage ends, as
// the relay no longer tries.
func (l *SessionLog) Stopped(now time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.nextRetry = time.Time{}
	l.endLocked(now)
}

func (l *SessionLog) endLocked(now time.Time) {
	if n := len(l.outages); n > 0 && l.outages[n-1].End == nil {
		l.outages[n-1].End = &now
	}
}

// History copies what the status page shows.
func (l *SessionLog) History() History {
	l.mu.Lock()
	defer l.mu.Unlock()
	h := History{Attempts: l.attempts, Outages: make([]Outage, len(l.outages)), PeerCert: l.peerCert}
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

// DetachedReason says why a detached relay is not attached, at now: the newest failure and when
// it retries ("registration refused relay-cluster-unknown: next retry in 4s").
func (h History) DetachedReason(now time.Time) string {
	if h.LastFailure == nil {
		return "attaching"
	}
	s := h.LastFailure.Summary()
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
func (l *SessionLog) redact(msg string) string {
	if l.query == "" {
		return msg
	}
	return strings.ReplaceAll(msg, l.query, "…")
}

// DialFailure names a failed dial: TLS when Cloudly's certificate or handshake was the cause.
func DialFailure(err error) Failure {
	var (
		verify  *tls.CertificateVerificationError
		unknown x509.UnknownAuthorityError
		host    x509.HostnameError
		invalid x509.CertificateInvalidError
		record  tls.RecordHeaderError
		alert   tls.AlertError
	)
	kind := FailDial
	if errors.As(err, &verify) || errors.As(err, &unknown) || errors.As(err, &host) || errors.As(err, &invalid) ||
		errors.As(err, &record) || errors.As(err, &alert) {
		kind = FailTLS
	}
	// The WebSocket library's own prefix says only what the kind says already.
	return Failure{Kind: kind, Message: strings.TrimPrefix(err.Error(), "failed to WebSocket dial: ")}
}
