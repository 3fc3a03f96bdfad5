package corestore

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"k8s.io/utils/clock"

	"code.foss.global/serve.zone/relay/contracts"
)

// Defaults; zero Options fields mean these.
const (
	DefaultConnectTimeout    = 5 * time.Second
	DefaultTimeout           = 30 * time.Second
	DefaultMaxResponseBytes  = 1 << 20
	DefaultMaxConnsPerOrigin = 4
)

// maxRefusalBytes bounds what is read of a non-2xx answer to find its reason.
const maxRefusalBytes = 64 << 10

// Options configure a Client. The zero value is a client that trusts the system roots.
type Options struct {
	// Logger is the relay's logger; New adds component "corestore".
	Logger zerolog.Logger
	// Registerer receives the corestore metrics; nil registers none.
	Registerer prometheus.Registerer
	// RootCAs are the roots Corestore certificates are verified against; nil means the system
	// roots. cmd/relay loads --corestore-ca-file into a pool once and passes it here.
	RootCAs *x509.CertPool
	// AllowHTTP permits http: origins (--insecure-plaintext).
	AllowHTTP bool
	// ConnectTimeout bounds the TCP connect and the TLS handshake, each.
	ConnectTimeout time.Duration
	// Timeout bounds a whole call: connect, request, and the answer read to its end.
	Timeout time.Duration
	// MaxResponseBytes bounds a 2xx answer; a longer one is refused.
	MaxResponseBytes int64
	// MaxConnsPerOrigin bounds the connections open to one Corestore.
	MaxConnsPerOrigin int
	// StallTimeout bounds how long a platform closure may stand still at Corestore's end
	// (platform.go); it replaces Timeout for closures, which take as long as they move.
	StallTimeout time.Duration
	// Clock is the time source of the stall bound alone: nil is the wall clock (the daemon's).
	// Tests inject a fake one to pass the bound once a stall has been reached, instead of
	// waiting it out.
	Clock clock.WithDelayedExecution
}

// Client calls node Corestores. It is safe for concurrent use.
type Client struct {
	http    *http.Client   // set at construction
	opts    Options        // set at construction, defaults filled
	log     zerolog.Logger // set at construction
	metrics *metrics       // set at construction
}

// New builds a client. It fails only when its metrics cannot be registered.
func New(opts Options) (*Client, error) {
	if opts.ConnectTimeout <= 0 {
		opts.ConnectTimeout = DefaultConnectTimeout
	}
	if opts.Timeout <= 0 {
		opts.Timeout = DefaultTimeout
	}
	if opts.MaxResponseBytes <= 0 {
		opts.MaxResponseBytes = DefaultMaxResponseBytes
	}
	if opts.MaxConnsPerOrigin <= 0 {
		opts.MaxConnsPerOrigin = DefaultMaxConnsPerOrigin
	}
	if opts.StallTimeout <= 0 {
		opts.StallTimeout = DefaultStallTimeout
	}
	if opts.Clock == nil {
		opts.Clock = clock.RealClock{}
	}
	m, err := newMetrics(opts.Registerer)
	if err != nil {
		return nil, fmt.Errorf("register corestore metrics: %w", err)
	}
	dialer := &net.Dialer{Timeout: opts.ConnectTimeout, KeepAlive: 30 * time.Second}
	transport := &http.Transport{
		// Corestores are inside the cluster: no proxy from the environment.
		Proxy:                 nil,
		DialContext:           dialer.DialContext,
		TLSClientConfig:       &tls.Config{MinVersion: tls.VersionTLS12, RootCAs: opts.RootCAs},
		TLSHandshakeTimeout:   opts.ConnectTimeout,
		ResponseHeaderTimeout: opts.Timeout,
		ForceAttemptHTTP2:     true,
		DisableCompression:    true,
		MaxConnsPerHost:       opts.MaxConnsPerOrigin,
		MaxIdleConnsPerHost:   opts.MaxConnsPerOrigin,
		IdleConnTimeout:       90 * time.Second,
	}
	c := &Client{
		http: &http.Client{
			Transport: transport,
			// A Corestore that redirects is answered as it answered: a 3xx is not a 2xx.
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
		},
		opts:    opts,
		log:     opts.Logger.With().Str("component", "corestore").Logger(),
		metrics: m,
	}
	return c, nil
}

// Close drops idle connections. Calls in flight end by their own timeout.
func (c *Client) Close() { c.http.CloseIdleConnections() }

// Call posts control to <origin>/isolated-restore/<op> and returns the 2xx answer's body. The
// error is a *contracts.Refusal: restore-node-unreachable (dial, TLS, timeout, a broken
// connection) or restore-node-refused (a non-2xx answer with Corestore's reason, or a 2xx answer
// larger than MaxResponseBytes). control is sent byte for byte and never logged.
func (c *Client) Call(ctx context.Context, origin, op string, control json.RawMessage) (json.RawMessage, error) {
	start := time.Now()
	body, outcome, err := c.call(ctx, origin, op, control)
	c.metrics.observe(op, outcome, len(control), len(body), time.Since(start))
	ev := c.log.Debug()
	if outcome == outcomeUnreachable {
		ev = c.log.Info()
	}
	ev.Str("op", op).Str("origin", origin).Int("bytes", len(control)).Int("answer_bytes", len(body)).
		Str("outcome", outcome).Dur("latency", time.Since(start)).Msg("corestore call")
	return body, err
}

func (c *Client) call(ctx context.Context, origin, op string, control json.RawMessage) (json.RawMessage, string, error) {
	if !contracts.IsCanonicalOrigin(origin, "https") && !(c.opts.AllowHTTP && contracts.IsCanonicalOrigin(origin, "http")) {
		return nil, outcomeUnreachable, contracts.RestoreNodeUnreachable.Refuse("Corestore origin %s is not a canonical https origin", origin)
	}
	ctx, cancel := context.WithTimeout(ctx, c.opts.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, origin+contracts.CorestoreIsolatedRestorePathPrefix+op, bytes.NewReader(control))
	if err != nil {
		return nil, outcomeUnreachable, contracts.RestoreNodeUnreachable.Refuse("cannot build a request to Corestore at %s", origin)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.http.Do(req)
	if err != nil {
		return nil, outcomeUnreachable, unreachable(origin, err, c.opts.Timeout.String())
	}
	defer resp.Body.Close()
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		b, err := io.ReadAll(io.LimitReader(resp.Body, maxRefusalBytes))
		if err != nil && !errors.Is(err, io.ErrUnexpectedEOF) {
			return nil, outcomeUnreachable, unreachable(origin, err, c.opts.Timeout.String())
		}
		return nil, outcomeRefused, refused(resp.StatusCode, resp.Header.Get("Content-Type"), b)
	}
	if resp.ContentLength > c.opts.MaxResponseBytes {
		return nil, outcomeOversized, contracts.RestoreNodeRefused.Refuse("Corestore's answer is %d bytes, over the relay's limit of %d",
			resp.ContentLength, c.opts.MaxResponseBytes)
	}
	b, err := io.ReadAll(io.LimitReader(resp.Body, c.opts.MaxResponseBytes+1))
	if err == nil && ctx.Err() != nil {
		// An answer that completes as the deadline passes can be one net/http already gave up on
		// (seen: an empty 200 the server wrote after our cancel reached it). Past the deadline
		// nothing read counts as Corestore's answer.
		err = context.Cause(ctx)
	}
	if err != nil {
		return nil, outcomeUnreachable, unreachable(origin, err, c.opts.Timeout.String())
	}
	if int64(len(b)) > c.opts.MaxResponseBytes {
		return nil, outcomeOversized, contracts.RestoreNodeRefused.Refuse("Corestore's answer is over the relay's limit of %d bytes",
			c.opts.MaxResponseBytes)
	}
	return b, outcomeAnswered, nil
}
