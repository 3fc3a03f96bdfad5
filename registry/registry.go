package registry

import (
	"context"
	"crypto/x509"
	"fmt"
	"math"
	"net/http"
	"net/netip"
	"net/url"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
)

// Defaults; a zero Options field means its default.
const (
	DefaultCacheMaxBytes    = 10 << 30 // 10 GiB: a few dozen typical images
	DefaultStallTimeout     = 60 * time.Second
	DefaultAuthorizeTimeout = 30 * time.Second
	// DefaultProgressTimeout bounds each write to a caller (one copy buffer, 256 KiB, or the
	// answer's last bytes) and each read of its request body: a caller slower than about 4 KiB/s
	// is cut off rather than pinning a stored object or an upstream connection for ever.
	DefaultProgressTimeout = 60 * time.Second
	// DefaultMaxUpstreamConns caps the connections to one upstream (or storage) host: many
	// nodes pull at once, but never with a connection each without bound. The slots below bound
	// them first; the cap is never below their sum.
	DefaultMaxUpstreamConns = 256

	// Fairness (docs/hostile.md, slots.go): upstream fetches per source address and in all; the
	// authorization HEADs of hits and joins, a pool of their own; the bound on a wait for a
	// slot; the minimum read rate and the window of writing time it is judged over.
	DefaultMaxFetchesPerSource        = 8
	DefaultMaxFetches                 = 64
	DefaultMaxAuthorizationsPerSource = 4
	DefaultMaxAuthorizations          = 32
	DefaultSlotWait                   = 10 * time.Second
	DefaultMinReadRate                = 64 << 10 // bytes per second
	DefaultReadRateWindow             = 30 * time.Second
)

// Options configure New.
type Options struct {
	// Logger is the registry's logger; New adds component "registry". The zero Logger logs
	// nothing.
	Logger zerolog.Logger
	// Registerer gets the registry's metrics; nil keeps them unregistered.
	Registerer prometheus.Registerer

	Upstream      string // the registry /v2/ is forwarded to: https://host[:port][/prefix]
	CacheDir      string // the digest cache; empty: no cache
	CacheMaxBytes int64  // the cache bound; 0: DefaultCacheMaxBytes

	// RootCAs verifies the upstream's (and its storage's) certificates; nil: the system roots.
	RootCAs *x509.CertPool
	// StallTimeout ends a fill that receives no byte for this long; 0: DefaultStallTimeout.
	StallTimeout time.Duration
	// AuthorizeTimeout bounds the authorization HEAD; 0: DefaultAuthorizeTimeout.
	AuthorizeTimeout time.Duration
	// ProgressTimeout bounds each write to a caller and each read of its body; 0:
	// DefaultProgressTimeout.
	ProgressTimeout time.Duration
	// MaxUpstreamConns caps the connections per upstream host; 0: DefaultMaxUpstreamConns, or
	// MaxFetches + MaxAuthorizations where that is more. New refuses a cap below that sum: a
	// request holding a slot would wait for a connection, unseen.
	MaxUpstreamConns int

	// Fairness (docs/hostile.md, slots.go): every request sent upstream holds a slot for as long as it
	// holds the upstream connection, charged to the caller's source address (its TCP peer).
	//
	// MaxFetchesPerSource and MaxFetches bound forwards and fills per source address and in
	// all; 0: DefaultMaxFetchesPerSource, DefaultMaxFetches.
	MaxFetchesPerSource, MaxFetches int
	// MaxAuthorizationsPerSource and MaxAuthorizations bound the authorization HEADs of cache
	// hits and joins, which never wait behind fetches; 0: DefaultMaxAuthorizationsPerSource,
	// DefaultMaxAuthorizations.
	MaxAuthorizationsPerSource, MaxAuthorizations int
	// SlotWait bounds a wait for a slot, then the caller is answered 503 registry-upstream-busy
	// with Retry-After; 0: DefaultSlotWait.
	SlotWait time.Duration
	// MinReadRate (bytes per second) and ReadRateWindow: a caller that takes its answer more
	// slowly, over a window of the time spent writing to it, is cut (progress.go); 0:
	// DefaultMinReadRate, DefaultReadRateWindow.
	MinReadRate    int64
	ReadRateWindow time.Duration

	// publicAddr decides which addresses a redirect off the upstream's origin may reach; nil:
	// publicAddr. Tests set it (export_test.go) to stand loopback storage in for public storage.
	publicAddr func(netip.Addr) bool
	// now is the clock the cache's disk pause is kept by; nil: time.Now. Tests set it
	// (export_test.go) to pass the pause without waiting it out.
	now func() time.Time
}

// Registry serves /v2/: an http.Handler for the relay's downstream listener.
type Registry struct {
	upstream         *url.URL        // set at construction
	transport        *http.Transport // set at construction: dials redirects' hosts only at public addresses
	follow           *http.Client    // set at construction: transport, following redirects
	cacheDir         string          // set at construction; empty: no cache
	cacheMax         int64           // set at construction
	cache            atomic.Pointer[cache]
	reopenMu         sync.Mutex
	reopenTried      time.Time        // guarded by reopenMu: the last attempt to open an unusable cache
	now              func() time.Time // set at construction: the clock of the disk pause
	m                *metrics         // set at construction
	log              zerolog.Logger   // set at construction
	stallTimeout     time.Duration    // set at construction
	authorizeTimeout time.Duration    // set at construction
	progressTimeout  time.Duration    // set at construction
	fetches          *slotPool        // set at construction: forwards and fills
	auths            *slotPool        // set at construction: the authorization HEADs of hits and joins
	slotWait         time.Duration    // set at construction
	retryAfter       string           // set at construction: a refused wait's Retry-After, in seconds
	readRate         readRate         // set at construction

	ctx     context.Context         // set at construction: the life of fills; ends at Close
	cancel  context.CancelCauseFunc // set at construction
	fillsWG sync.WaitGroup          // fill goroutines running

	closeMu sync.Mutex
	closed  bool // guarded by closeMu: no fill starts once set
}

// New builds the handler. The upstream URL must be https (http only where the caller allows it:
// the relay's configuration admits it with --insecure-plaintext) and carry no credentials, query
// or fragment: every credential comes from the caller. A cache directory that cannot be used is
// not an error: the registry serves uncached, logs it once and counts each request it could not
// cache. New fails on such a URL, or when its metrics cannot be registered.
func New(opts Options) (*Registry, error) {
	u, err := url.Parse(opts.Upstream)
	if err != nil || u.Host == "" || u.User != nil || u.RawQuery != "" || u.ForceQuery || u.Fragment != "" ||
		u.Scheme != "https" && u.Scheme != "http" {
		return nil, ErrUpstreamURL
	}
	for len(u.Path) > 0 && u.Path[len(u.Path)-1] == '/' {
		u.Path = u.Path[:len(u.Path)-1]
	}
	u.RawPath = ""
	m, err := newMetrics(opts.Registerer)
	if err != nil {
		return nil, fmt.Errorf("register registry metrics: %w", err)
	}
	r := &Registry{upstream: u, m: m, log: opts.Logger.With().Str("component", "registry").Logger(),
		stallTimeout: opts.StallTimeout, authorizeTimeout: opts.AuthorizeTimeout, progressTimeout: opts.ProgressTimeout}
	if r.stallTimeout <= 0 {
		r.stallTimeout = DefaultStallTimeout
	}
	if r.authorizeTimeout <= 0 {
		r.authorizeTimeout = DefaultAuthorizeTimeout
	}
	if r.progressTimeout <= 0 {
		r.progressTimeout = DefaultProgressTimeout
	}
	orDefault := func(v, def int) int {
		if v <= 0 {
			return def
		}
		return v
	}
	fetchesPer, fetches := orDefault(opts.MaxFetchesPerSource, DefaultMaxFetchesPerSource), orDefault(opts.MaxFetches, DefaultMaxFetches)
	authsPer, auths := orDefault(opts.MaxAuthorizationsPerSource, DefaultMaxAuthorizationsPerSource), orDefault(opts.MaxAuthorizations, DefaultMaxAuthorizations)
	conns := opts.MaxUpstreamConns
	if conns <= 0 {
		conns = max(DefaultMaxUpstreamConns, fetches+auths)
	}
	if conns < fetches+auths {
		return nil, fmt.Errorf("registry: MaxUpstreamConns %d is below MaxFetches + MaxAuthorizations (%d): "+
			"requests holding a slot would wait for a connection", conns, fetches+auths)
	}
	r.fetches = newSlotPool(poolFetch, fetchesPer, fetches, m.slotsInUse.WithLabelValues(poolFetch),
		func(limit string) { m.slotWaitsRefused.WithLabelValues(poolFetch, limit).Inc() })
	r.auths = newSlotPool(poolAuthorize, authsPer, auths, m.slotsInUse.WithLabelValues(poolAuthorize),
		func(limit string) { m.slotWaitsRefused.WithLabelValues(poolAuthorize, limit).Inc() })
	r.slotWait = opts.SlotWait
	if r.slotWait <= 0 {
		r.slotWait = DefaultSlotWait
	}
	r.retryAfter = strconv.Itoa(max(1, int(math.Ceil(r.slotWait.Seconds()))))
	r.readRate = readRate{min: opts.MinReadRate, window: opts.ReadRateWindow, cut: m.slowReadersCut.Inc}
	if r.readRate.min <= 0 {
		r.readRate.min = DefaultMinReadRate
	}
	if r.readRate.window <= 0 {
		r.readRate.window = DefaultReadRateWindow
	}
	public := opts.publicAddr
	if public == nil {
		public = publicAddr
	}
	r.transport = newTransport(u, opts.RootCAs, conns, public)
	r.follow = &http.Client{Transport: r.transport, CheckRedirect: r.checkRedirect}
	r.ctx, r.cancel = context.WithCancelCause(context.Background())
	bound := opts.CacheMaxBytes
	if bound <= 0 {
		bound = DefaultCacheMaxBytes
	}
	r.cacheDir, r.cacheMax = opts.CacheDir, bound
	r.now = opts.now
	if r.now == nil {
		r.now = time.Now
	}
	upstreamLog := u.Scheme + "://" + u.Host
	if c := r.currentCache(); c != nil {
		used, objects := c.stats()
		r.log.Info().Str("upstream", upstreamLog).Int64("bytes", used).Int("objects", objects).Int64("max", bound).
			Msg("registry forwarding with a digest cache")
	} else {
		r.log.Info().Str("upstream", upstreamLog).Msg("registry forwarding without a cache")
	}
	return r, nil
}

// currentCache is the cache, or nil when none is configured or its directory is unusable. An
// unusable directory (not mounted yet, read-only, not a directory) is tried again at most once a
// diskPause; meanwhile requests are served uncached and counted.
func (r *Registry) currentCache() *cache {
	if c := r.cache.Load(); c != nil || r.cacheDir == "" {
		return c
	}
	r.reopenMu.Lock()
	defer r.reopenMu.Unlock()
	if c := r.cache.Load(); c != nil {
		return c
	}
	if !r.reopenTried.IsZero() && r.now().Sub(r.reopenTried) < diskPause {
		return nil
	}
	r.reopenTried = r.now()
	c, err := openCache(r.cacheDir, r.cacheMax, r.m, r.log)
	if err != nil {
		r.log.Warn().Err(err).Str("outcome", "cache-off").Msg("registry cache directory unusable; serving uncached")
		return nil
	}
	c.now = r.now
	r.cache.Store(c)
	return c
}

// Close ends every fill in progress (callers reading them get broken answers) and waits for them.
// In-flight requests that do not read a fill are not waited for: their server owns them.
func (r *Registry) Close() error {
	r.closeMu.Lock()
	r.closed = true
	r.closeMu.Unlock()
	r.cancel(errClosed)
	r.fillsWG.Wait()
	r.transport.CloseIdleConnections()
	return nil
}

// exchange is one request as the registry serves it.
type exchange struct {
	w      *callerWriter
	req    *http.Request
	c      *cache // nil: no cache
	t      target
	peer   string // the caller's source address, its slots' owner (slots.go)
	route  string // how it was served: forward, hit, fill, join, refused, busy
	source string // where body bytes came from: upstream or cache
	err    error  // a local error for the log (never a peer's text)
}

// ServeHTTP serves one request under /v2/. Every write to the caller and every read of its body
// must complete within the progress timeout (progress.go).
func (r *Registry) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	start := time.Now()
	x := &exchange{w: newCallerWriter(w, r.progressTimeout, r.readRate), req: req, peer: sourceOf(req.RemoteAddr), source: sourceUpstream}
	if req.Body != nil && req.Body != http.NoBody {
		req.Body = &callerBody{ReadCloser: req.Body, rc: x.w.rc, timeout: r.progressTimeout}
	}
	t, parsed := parsePath(req.URL.Path)
	x.t = t
	r.m.requests.WithLabelValues(t.Kind.String(), methodLabel(req.Method)).Inc()
	served := false
	defer func() {
		r.m.bytes.WithLabelValues(x.source).Add(float64(x.w.n))
		if e := r.log.Debug(); e.Enabled() {
			e = e.Str("method", methodLabel(req.Method)).Str("kind", t.Kind.String()).Str("outcome", x.route).
				Int("status", x.w.status).Int64("bytes", x.w.n).Dur("latency", time.Since(start))
			if t.byDigest() {
				e = e.Str("digest", t.Digest.String())
			}
			if x.err != nil {
				e = e.AnErr("error", x.err)
			}
			e.Msg("registry request")
		}
		if served { // not after a panic: an aborted answer's connection is closed
			x.w.finish()
		}
	}()
	r.serve(x, parsed)
	if x.w.cut { // cut for reading slowly: break the answer off, whatever its framing
		x.err = errSlowReader
		panic(http.ErrAbortHandler)
	}
	served = true
}

// serve answers one request.
func (r *Registry) serve(x *exchange, parsed bool) {
	req, t := x.req, x.t
	if !cleanPath(req.URL.Path, req.URL.EscapedPath()) {
		x.route = "refused"
		writeRefusal(x.w, http.StatusBadRequest, "NAME_INVALID", RegistryPathInvalid.Refuse("a /v2/ path must have no empty, dot or escaped segment"))
		return
	}
	if req.Method != http.MethodGet || !parsed || !t.byDigest() || !t.Digest.isSHA256() || req.URL.RawQuery != "" {
		r.forward(x) // HEAD, tags, uploads, other digest algorithms: never cached
		return
	}
	if x.c = r.currentCache(); x.c == nil {
		if r.cacheDir != "" {
			r.m.bypassed(bypassDisk)
		}
		r.forward(x)
		return
	}
	if req.Header.Get("Range") != "" {
		if file, size, ok := x.c.open(t.Digest.Encoded); ok {
			r.serveHit(x, file, size)
			return
		}
		r.forward(x) // a partial answer is never cached, and never starts a fill
		return
	}
	r.serveByDigest(x, 0)
}

// maxRejoin bounds how often a caller whose fill was abandoned (its leader was refused, say)
// tries the next fill before it fetches for itself.
const maxRejoin = 3

// serveByDigest serves a whole GET by sha256 digest from the cache: a hit, a new fill, or a
// fill in progress.
func (r *Registry) serveByDigest(x *exchange, attempt int) {
	file, size, f, leader := x.c.acquire(x.t.Digest.Encoded)
	switch {
	case file != nil:
		r.serveHit(x, file, size)
	case f == nil:
		r.m.bypassed(bypassDisk)
		r.forward(x)
	case leader:
		r.lead(x, f)
	default:
		r.join(x, f, attempt)
	}
}

// methodLabel is the metric label (and log value) of a request's method: one of a fixed set,
// kebab-case; any other method a caller sends counts as other.
func methodLabel(m string) string {
	switch m {
	case http.MethodGet:
		return "get"
	case http.MethodHead:
		return "head"
	case http.MethodPost:
		return "post"
	case http.MethodPut:
		return "put"
	case http.MethodPatch:
		return "patch"
	case http.MethodDelete:
		return "delete"
	}
	return "other"
}

// authorize asks the upstream whether the caller may read the object with this very request: a
// HEAD of the same path with the caller's headers (its Authorization untouched, Range and
// conditions dropped). On a 2xx it returns the answer's headers. On anything else the caller's
// own request is forwarded, so the caller gets the registry's whole answer to it — status,
// challenge and error body — and never a cached byte.
func (r *Registry) authorize(x *exchange) (http.Header, bool) {
	sl, err := r.auths.acquire(x.req.Context(), x.peer, r.slotWait)
	if err != nil {
		r.busy(x, err)
		return nil, false
	}
	ctx, cancel := context.WithTimeout(x.req.Context(), r.authorizeTimeout)
	resp, err := r.follow.Do(r.upstreamRequest(ctx, x.req, http.MethodHead, true))
	if err == nil {
		resp.Body.Close()
	}
	cancel()
	sl.release() // before any forward below, which takes a fetch slot of its own
	if err != nil {
		r.m.authorizations.WithLabelValues(authError).Inc()
		x.err = safeError(err)
		r.forward(x)
		return nil, false
	}
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		r.m.authorizations.WithLabelValues(authRefused).Inc()
		r.forward(x)
		if x.route != "busy" {
			x.route = "refused"
		}
		return nil, false
	}
	r.m.authorizations.WithLabelValues(authAllowed).Inc()
	return resp.Header, true
}

// consistent reports whether the upstream's authorization answer describes the object the
// relay holds: same length and digest where it states them, and a media type for a manifest.
func consistent(h http.Header, t target, size int64) bool {
	if cl := h.Get("Content-Length"); cl != "" {
		if n, err := strconv.ParseInt(cl, 10, 64); err != nil || n != size {
			return false
		}
	}
	if d := h.Get("Docker-Content-Digest"); d != "" && d != t.Digest.String() {
		return false
	}
	return t.Kind != kindManifest || h.Get("Content-Type") != ""
}

// cachedHeaders sets the answer's headers for bytes the relay serves itself: the upstream's
// headers for this request (from the authorization HEAD or the leader's GET) less what describes
// a transfer rather than the object.
func cachedHeaders(w http.ResponseWriter, from http.Header, t target) {
	h := w.Header()
	copyEndToEnd(h, from)
	for _, k := range []string{"Content-Length", "Content-Range", "Accept-Ranges", "Content-Encoding", "Date", "Last-Modified"} {
		h.Del(k)
	}
	if h.Get("Content-Type") == "" {
		h.Set("Content-Type", "application/octet-stream")
	}
	h.Set("Docker-Content-Digest", t.Digest.String())
}

// serveHit serves a stored object after the upstream authorized the caller. Range and
// conditional requests are answered by http.ServeContent from the file.
func (r *Registry) serveHit(x *exchange, file *os.File, size int64) {
	defer file.Close()
	hdr, ok := r.authorize(x)
	if !ok {
		return
	}
	if !consistent(hdr, x.t, size) {
		r.m.bypassed(bypassInconsistent)
		r.log.Warn().Str("digest", x.t.Digest.String()).Str("outcome", bypassInconsistent).
			Msg("upstream describes a stored object differently; forwarding")
		r.forward(x)
		return
	}
	x.route, x.source = "hit", sourceCache
	r.m.hit(x.t.Kind)
	x.c.touch(x.t.Digest.Encoded)
	cachedHeaders(x.w, hdr, x.t)
	http.ServeContent(x.w, x.req, "", time.Time{}, file)
}

// lead starts the fill with the caller's own GET, whose answer is the caller's authorization,
// then serves the caller from the fill like anyone else. An answer that is not cacheable (a
// refusal, a challenge, a 404) goes to the caller as the upstream sent it. The fill holds a fetch
// slot charged to the leader's address until the upstream's answer is closed: when the fill
// ends, or when the leader has written an answer handed over to it.
func (r *Registry) lead(x *exchange, f *fill) {
	sl, err := r.fetches.acquire(x.req.Context(), x.peer, r.slotWait)
	if err != nil { // callers who joined start over: one of them may have a slot
		f.c.done(f)
		f.abandon(nil, nil, err)
		r.busy(x, err)
		return
	}
	r.closeMu.Lock()
	if r.closed {
		r.closeMu.Unlock()
		sl.release()
		f.c.done(f)
		f.abandon(nil, nil, errClosed)
		x.route = "forward"
		r.unreachable(x, errClosed)
		return
	}
	r.fillsWG.Add(1)
	r.closeMu.Unlock()
	ctx, cancel := context.WithCancelCause(r.ctx)
	out := r.upstreamRequest(ctx, x.req, http.MethodGet, true)
	go r.runFill(f, out, cancel, sl)
	if f.wait(nil) == fillAbandoned { // bounded by the transport's response header timeout
		f.mu.Lock()
		resp, stop, err := f.resp, f.stop, f.err
		f.mu.Unlock()
		if resp == nil {
			x.route = "forward"
			r.unreachable(x, err)
			return
		}
		defer stop()
		// The fill's request lives under the registry, not the caller: tie the answer handed
		// over to the caller's request, as a forward is, so that it ends when the caller leaves.
		defer context.AfterFunc(x.req.Context(), stop)()
		x.route = "forward"
		r.writeResponse(x, resp)
		return
	}
	r.m.miss(x.t.Kind)
	x.route = "fill"
	f.mu.Lock()
	hdr := f.header
	f.mu.Unlock()
	if !r.serveFill(x, f, hdr) {
		r.forward(x) // the fill failed at once; the leader's answer is the upstream's own
	}
}

// join serves a caller from a fill another caller leads, after the upstream authorized it. When
// the leader's answer was not cacheable (a refused leader, typically) the caller starts over: it
// leads the next fill, or joins it, and fetches alone only after maxRejoin tries.
func (r *Registry) join(x *exchange, f *fill, attempt int) {
	hdr, ok := r.authorize(x)
	if !ok {
		return
	}
	switch f.wait(x.req.Context()) {
	case fillWaiting:
		return // the caller left
	case fillAbandoned:
		r.rejoin(x, attempt)
		return
	}
	x.route = "join"
	if !r.serveFill(x, f, hdr) { // it failed before this caller had a byte, not on bad content
		r.rejoin(x, attempt)
	}
}

// badContent reports whether a fill failed because the upstream's bytes were wrong; a caller who
// has had none of them is then refused rather than sent the same bytes uncached.
func badContent(err error) bool { return err == errDigestMismatch || err == errSizeMismatch }

// rejoin starts over for a caller who has not had a byte of a fill that ended without one.
func (r *Registry) rejoin(x *exchange, attempt int) {
	if attempt < maxRejoin {
		r.serveByDigest(x, attempt+1)
		return
	}
	r.forward(x)
}

// serveFill answers from a fill in progress: the head at once, the bytes as they arrive, the last
// byte after verification. An empty object is verified before its head is sent. It reports false,
// having sent nothing, when the fill failed before the caller could open it.
func (r *Registry) serveFill(x *exchange, f *fill, hdr http.Header) bool {
	file, size, err := f.open()
	if badContent(err) {
		x.source = sourceCache
		writeRefusal(x.w, http.StatusBadGateway, "DIGEST_INVALID",
			RegistryDigestMismatch.Refuse("the upstream's content does not match %s", x.t.Digest))
		return true
	}
	if err != nil {
		return false
	}
	defer file.Close()
	if x.route == "join" && !consistent(hdr, x.t, size) {
		r.m.bypassed(bypassInconsistent)
		r.forward(x)
		return true
	}
	if x.route == "join" {
		r.m.coalesce(x.t.Kind)
	}
	x.source = sourceCache
	if x.route == "fill" {
		x.source = sourceUpstream
	}
	if size == 0 {
		for {
			f.mu.Lock()
			st, ch := f.state, f.changed
			f.mu.Unlock()
			if st == fillFailed {
				f.mu.Lock()
				err := f.err
				f.mu.Unlock()
				if badContent(err) {
					writeRefusal(x.w, http.StatusBadGateway, "DIGEST_INVALID",
						RegistryDigestMismatch.Refuse("the upstream's content does not match %s", x.t.Digest))
				} else {
					r.unreachable(x, err)
				}
				return true
			}
			if st == fillVerified {
				break
			}
			select {
			case <-ch:
			case <-x.req.Context().Done():
				return true
			}
		}
	}
	head := func() {
		cachedHeaders(x.w, hdr, x.t)
		x.w.Header().Set("Content-Length", strconv.FormatInt(size, 10))
		x.w.WriteHeader(http.StatusOK)
	}
	if size == 0 {
		head()
		head = nil
	}
	err = f.tail(x.req.Context(), x.w, file, &head)
	switch {
	case err != errFillFailed:
	case head != nil: // failed before the caller's first byte: refuse, as for an empty object
		f.mu.Lock()
		err := f.err
		f.mu.Unlock()
		if badContent(err) {
			writeRefusal(x.w, http.StatusBadGateway, "DIGEST_INVALID",
				RegistryDigestMismatch.Refuse("the upstream's content does not match %s", x.t.Digest))
		} else {
			r.unreachable(x, err)
		}
	default:
		x.err = errFillFailed
		panic(http.ErrAbortHandler) // cut short of Content-Length: the caller sees a broken transfer
	}
	return true
}
