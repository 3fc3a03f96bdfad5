package corestore

import (
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"io"
	"mime"
	"net/http"
	"net/url"
	"sync"
	"time"

	"k8s.io/utils/clock"

	"code.foss.global/serve.zone/relay/contracts"
)

// The Corestore platform calls (docs/platform.md, project-defined): the desired state, ready backups and
// their closures, wanted restores. Each carries the node's Corestore credential as
// Authorization: Bearer and nothing else of the relay's; a credential is never logged. Closures
// stream in both directions and are never held whole: a closure's body is read or written as the
// caller moves it, and a Corestore that stops moving it for StallTimeout is cut.

// Platform operation labels, for metrics and logs.
const (
	OpDesiredState = "desired-state"
	OpReadyBackups = "backups"
	OpBackupGet    = "closure-get"
	OpDelivered    = "delivered"
	OpWanted       = "restores"
	OpRestorePut   = "closure-put"
)

// DefaultStallTimeout bounds how long a closure may stand still at Corestore's end.
const DefaultStallTimeout = 30 * time.Second

// PutDesiredState hands the node's Corestore its desired state: PUT /platform/desired-state with
// body as given.
func (c *Client) PutDesiredState(ctx context.Context, origin string, bearer contracts.Secret, body []byte) error {
	_, err := c.platformCall(ctx, OpDesiredState, http.MethodPut, origin, contracts.CorestoreDesiredStatePath, bearer, body)
	return err
}

// ReadyBackups lists the backups ready to leave the node: GET /platform/backups?state=ready, the
// 2xx answer's body (bounded by MaxResponseBytes).
func (c *Client) ReadyBackups(ctx context.Context, origin string, bearer contracts.Secret) ([]byte, error) {
	return c.platformCall(ctx, OpReadyBackups, http.MethodGet, origin, contracts.CorestoreReadyBackupsPath, bearer, nil)
}

// WantedRestores lists the restores the node wants: GET /platform/restores?state=wanted.
func (c *Client) WantedRestores(ctx context.Context, origin string, bearer contracts.Secret) ([]byte, error) {
	return c.platformCall(ctx, OpWanted, http.MethodGet, origin, contracts.CorestoreWantedPath, bearer, nil)
}

// MarkDelivered tells the node's Corestore Cloudly accepted a backup:
// POST /platform/backups/<id>/delivered.
func (c *Client) MarkDelivered(ctx context.Context, origin string, bearer contracts.Secret, backupID string) error {
	_, err := c.platformCall(ctx, OpDelivered, http.MethodPost, origin, contracts.CorestoreBackupsPrefix+url.PathEscape(backupID)+"/delivered", bearer, nil)
	return err
}

// platformCall is one bounded platform call: the whole call within Timeout, a 2xx answer within
// MaxResponseBytes.
func (c *Client) platformCall(ctx context.Context, op, method, origin, path string, bearer contracts.Secret, body []byte) ([]byte, error) {
	start := time.Now()
	b, outcome, err := c.doPlatform(ctx, op, method, origin, path, bearer, body)
	c.finish(op, origin, outcome, len(body), len(b), start)
	return b, err
}

func (c *Client) doPlatform(ctx context.Context, op, method, origin, path string, bearer contracts.Secret, body []byte) ([]byte, string, error) {
	ctx, cancel := context.WithTimeout(ctx, c.opts.Timeout)
	defer cancel()
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	resp, outcome, err := c.send(ctx, method, origin, path, bearer, rd, "application/json")
	if err != nil {
		return nil, outcome, err
	}
	defer resp.Body.Close()
	if resp.ContentLength > c.opts.MaxResponseBytes {
		return nil, outcomeOversized, contracts.RestoreNodeRefused.Refuse("Corestore's %s answer is %d bytes, over the relay's limit of %d", op,
			resp.ContentLength, c.opts.MaxResponseBytes)
	}
	b, err := io.ReadAll(io.LimitReader(resp.Body, c.opts.MaxResponseBytes+1))
	if err != nil {
		return nil, outcomeUnreachable, unreachable(origin, err, c.opts.Timeout.String())
	}
	if int64(len(b)) > c.opts.MaxResponseBytes {
		return nil, outcomeOversized, contracts.RestoreNodeRefused.Refuse("Corestore's %s answer is over the relay's limit of %d bytes", op, c.opts.MaxResponseBytes)
	}
	return b, outcomeAnswered, nil
}

// send makes one request and returns a 2xx answer with its body unread, or the refusal: a
// non-2xx answer is read (bounded) for Corestore's reason and closed.
func (c *Client) send(ctx context.Context, method, origin, path string, bearer contracts.Secret, body io.Reader, contentType string) (*http.Response, string, error) {
	if err := c.checkOrigin(origin); err != nil {
		return nil, outcomeUnreachable, err
	}
	if bearer.IsZero() {
		return nil, outcomeRefused, contracts.RestoreNodeRefused.Refuse("the relay holds no Corestore credential for this node")
	}
	req, err := http.NewRequestWithContext(ctx, method, origin+path, body)
	if err != nil {
		return nil, outcomeUnreachable, contracts.RestoreNodeUnreachable.Refuse("cannot build a request to Corestore at %s", origin)
	}
	if body != nil {
		req.Header.Set("Content-Type", contentType)
	}
	req.Header.Set("Authorization", "Bearer "+bearer.Reveal())
	resp, err := c.http.Do(req)
	if err != nil {
		return nil, outcomeUnreachable, unreachable(origin, err, c.opts.Timeout.String())
	}
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		defer resp.Body.Close()
		b, err := io.ReadAll(io.LimitReader(resp.Body, maxRefusalBytes))
		if err != nil && !errors.Is(err, io.ErrUnexpectedEOF) {
			return nil, outcomeUnreachable, unreachable(origin, err, c.opts.Timeout.String())
		}
		return nil, outcomeRefused, refused(resp.StatusCode, resp.Header.Get("Content-Type"), b)
	}
	return resp, outcomeAnswered, nil
}

func (c *Client) checkOrigin(origin string) error {
	if !contracts.IsCanonicalOrigin(origin, "https") && !(c.opts.AllowHTTP && contracts.IsCanonicalOrigin(origin, "http")) {
		return contracts.RestoreNodeUnreachable.Refuse("Corestore origin %s is not a canonical https origin", origin)
	}
	return nil
}

// finish counts and logs one platform call: op, origin, sizes and outcome.
func (c *Client) finish(op, origin, outcome string, sent, received int, start time.Time) {
	c.metrics.observe(op, outcome, sent, received, time.Since(start))
	ev := c.log.Debug()
	if outcome != outcomeAnswered {
		ev = c.log.Info()
	}
	ev.Str("op", op).Str("origin", origin).Int("bytes", sent).Int("answer_bytes", received).
		Str("outcome", outcome).Dur("latency", time.Since(start)).Msg("corestore call")
}

// Closure is a backup closure being read from a node's Corestore: Read it to its end, then Close.
// Size is the length Corestore announced, -1 when it announced none.
type Closure struct {
	Size   int64
	body   io.ReadCloser
	w      *stallWatch
	cancel context.CancelCauseFunc
	c      *Client
	op     struct {
		origin string
		start  time.Time
		n      int64
		err    error
	}
	once sync.Once
}

// OpenBackupClosure starts GET /platform/backups/<id>/closure. The answer must be 2xx, served as
// the backup media type and announce no more than MaxCorestoreClosureBytes (else
// relay-request-invalid); reading past that limit fails with relay-request-invalid too. A
// Corestore that sends nothing for StallTimeout while the caller reads is cut
// (relay-closure-stalled).
func (c *Client) OpenBackupClosure(ctx context.Context, origin string, bearer contracts.Secret, backupID string) (io.ReadCloser, error) {
	start := time.Now()
	ctx, cancel := context.WithCancelCause(ctx)
	w := newStallWatch(c.opts.Clock, c.opts.StallTimeout, cancel)
	w.arm() // until the answer's headers come
	resp, outcome, err := c.send(ctx, http.MethodGet, origin, contracts.CorestoreBackupsPrefix+url.PathEscape(backupID)+"/closure", bearer, nil, "")
	w.disarm()
	fail := func(outcome string, err error) (io.ReadCloser, error) {
		cancel(err)
		c.finish(OpBackupGet, origin, outcome, 0, 0, start)
		return nil, err
	}
	if err != nil && w.fired() {
		err = contracts.RelayClosureStalled.Refuse("Corestore at %s did not answer within %s", origin, c.opts.StallTimeout)
	}
	if err != nil {
		return fail(outcome, err)
	}
	if mt, _, perr := mime.ParseMediaType(resp.Header.Get("Content-Type")); perr != nil || mt != contracts.CorestoreDatabaseBackupMediaType {
		resp.Body.Close()
		return fail(outcomeRefused, contracts.RestoreNodeRefused.Refuse("Corestore served the closure as %q, not %s",
			SanitizeReason(resp.Header.Get("Content-Type")), contracts.CorestoreDatabaseBackupMediaType))
	}
	if resp.ContentLength > contracts.MaxCorestoreClosureBytes {
		resp.Body.Close()
		return fail(outcomeOversized, closureTooLong(resp.ContentLength))
	}
	cl := &Closure{Size: resp.ContentLength, body: resp.Body, w: w, cancel: cancel, c: c}
	cl.op.origin, cl.op.start = origin, start
	return cl, nil
}

func closureTooLong(n int64) error {
	return contracts.RelayRequestInvalid.Refuse("the closure is %d bytes, over the Corestore closure limit of %d", n, contracts.MaxCorestoreClosureBytes)
}

// Read reads the closure; past MaxCorestoreClosureBytes it fails with relay-request-invalid.
func (cl *Closure) Read(p []byte) (int, error) {
	cl.w.arm()
	n, err := cl.body.Read(p)
	cl.w.disarm()
	cl.op.n += int64(n)
	if cl.op.n > contracts.MaxCorestoreClosureBytes {
		cl.op.err = closureTooLong(cl.op.n)
		return n, cl.op.err
	}
	if err != nil && err != io.EOF {
		if cl.w.fired() {
			err = contracts.RelayClosureStalled.Refuse("Corestore at %s sent nothing of the closure for %s", cl.op.origin, cl.c.opts.StallTimeout)
		} else {
			err = unreachable(cl.op.origin, err, cl.c.opts.StallTimeout.String())
		}
		cl.op.err = err
	}
	return n, err
}

// Close ends the read and counts it.
func (cl *Closure) Close() error {
	cl.once.Do(func() {
		cl.w.stop()
		cl.body.Close()
		cl.cancel(nil)
		outcome := outcomeAnswered
		switch {
		case errors.Is(cl.op.err, contracts.RelayRequestInvalid):
			outcome = outcomeOversized
		case cl.op.err != nil:
			outcome = outcomeUnreachable
		}
		cl.c.finish(OpBackupGet, cl.op.origin, outcome, 0, int(min(cl.op.n, 1<<31-1)), cl.op.start)
	})
	return nil
}

// PutRestoreClosure streams body into PUT /platform/restores/<id>/closure, served as the backup
// media type with descriptor (its JSON bytes) in base64url in Serve-Zone-Descriptor. It returns
// once Corestore answered: nil for 2xx. A body whose Read fails aborts the request, so Corestore
// never settles a closure cut short; a Corestore that takes nothing for StallTimeout is cut
// (relay-closure-stalled).
func (c *Client) PutRestoreClosure(ctx context.Context, origin string, bearer contracts.Secret, backupID string, descriptor []byte, body io.Reader) error {
	start := time.Now()
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	w := newStallWatch(c.opts.Clock, c.opts.StallTimeout, cancel)
	defer w.stop()
	pr := &putReader{r: body, w: w}
	if err := c.checkOrigin(origin); err != nil {
		c.finish(OpRestorePut, origin, outcomeUnreachable, 0, 0, start)
		return err
	}
	if bearer.IsZero() {
		c.finish(OpRestorePut, origin, outcomeRefused, 0, 0, start)
		return contracts.RestoreNodeRefused.Refuse("the relay holds no Corestore credential for this node")
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPut, origin+contracts.CorestoreRestoresPrefix+url.PathEscape(backupID)+"/closure", pr)
	if err != nil {
		return contracts.RestoreNodeUnreachable.Refuse("cannot build a request to Corestore at %s", origin)
	}
	req.Header.Set("Content-Type", contracts.CorestoreDatabaseBackupMediaType)
	req.Header.Set(contracts.CorestoreDescriptorHeader, base64.RawURLEncoding.EncodeToString(descriptor))
	req.Header.Set("Authorization", "Bearer "+bearer.Reveal())
	w.arm() // the request's first bytes are Corestore's to take
	resp, err := c.http.Do(req)
	w.stop()
	sent := int(min(pr.n, 1<<31-1))
	switch {
	case pr.err != nil:
		// The source failed: the request was aborted with it, whatever Corestore said.
		if resp != nil {
			resp.Body.Close()
		}
		c.finish(OpRestorePut, origin, outcomeAborted, sent, 0, start)
		return pr.err
	case err != nil && w.fired():
		c.finish(OpRestorePut, origin, outcomeUnreachable, sent, 0, start)
		return contracts.RelayClosureStalled.Refuse("Corestore at %s took nothing of the closure for %s", origin, c.opts.StallTimeout)
	case err != nil:
		c.finish(OpRestorePut, origin, outcomeUnreachable, sent, 0, start)
		return unreachable(origin, err, c.opts.StallTimeout.String())
	}
	defer resp.Body.Close()
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, maxRefusalBytes))
		c.finish(OpRestorePut, origin, outcomeRefused, sent, 0, start)
		return refused(resp.StatusCode, resp.Header.Get("Content-Type"), b)
	}
	io.Copy(io.Discard, io.LimitReader(resp.Body, maxRefusalBytes))
	c.finish(OpRestorePut, origin, outcomeAnswered, sent, 0, start)
	return nil
}

// outcomeAborted: the relay cut a closure short (its source failed).
const outcomeAborted = "aborted"

// putReader is a PUT body: the watch runs while the transport holds what Read gave it (Corestore
// is taking it), and stops while Read waits for the source (the relay is waiting, not Corestore).
type putReader struct {
	r   io.Reader
	w   *stallWatch
	n   int64
	err error // the source's failure, when it failed
}

func (p *putReader) Read(b []byte) (int, error) {
	p.w.disarm()
	n, err := p.r.Read(b)
	p.n += int64(n)
	if err != nil && err != io.EOF {
		p.err = err
		return n, err
	}
	p.w.arm()
	return n, err
}

// stallWatch cancels a call when it is armed for longer than d, on its clock, without being
// disarmed.
type stallWatch struct {
	clock  clock.WithDelayedExecution
	d      time.Duration
	cancel context.CancelCauseFunc
	mu     sync.Mutex
	t      clock.Timer // guarded by mu
	fire   bool        // guarded by mu: it went off
	done   bool        // guarded by mu: stopped
}

var errStalled = errors.New("corestore: the closure stood still")

func newStallWatch(clk clock.WithDelayedExecution, d time.Duration, cancel context.CancelCauseFunc) *stallWatch {
	return &stallWatch{clock: clk, d: d, cancel: cancel}
}

func (w *stallWatch) arm() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.done {
		return
	}
	if w.t == nil {
		// trip runs on a goroutine of its own: a clock may call f while it holds a lock of its
		// own that Reset and Stop take (a fake clock's Step does), and arm and disarm hold mu
		// while they reset or stop the timer, so trip must not take mu on the clock's caller.
		w.t = w.clock.AfterFunc(w.d, func() { go w.trip() })
		return
	}
	w.t.Reset(w.d)
}

func (w *stallWatch) trip() {
	w.mu.Lock()
	if w.done {
		w.mu.Unlock()
		return
	}
	w.fire = true
	w.mu.Unlock()
	w.cancel(errStalled)
}

func (w *stallWatch) disarm() {
	w.mu.Lock()
	if w.t != nil {
		w.t.Stop()
	}
	w.mu.Unlock()
}

func (w *stallWatch) stop() {
	w.mu.Lock()
	w.done = true
	if w.t != nil {
		w.t.Stop()
	}
	w.mu.Unlock()
}

func (w *stallWatch) fired() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.fire
}
