package registry

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
)

// Forwarding: the relay's equivalent of httputil.ReverseProxy, kept to what a registry needs so
// that one response writer serves plain forwarding, an uncacheable answer to a fill's leader and
// a refused authorization alike. Bodies stream both ways through a fixed buffer; the relay adds
// and removes only hop-by-hop headers, and never reads or logs Authorization.

// hopHeaders are the hop-by-hop headers of RFC 9110 §7.6.1, never forwarded in either direction.
var hopHeaders = []string{
	"Connection", "Proxy-Connection", "Keep-Alive", "Proxy-Authenticate", "Proxy-Authorization",
	"Te", "Trailer", "Transfer-Encoding", "Upgrade",
}

// copyEndToEnd copies src's end-to-end headers into dst.
func copyEndToEnd(dst, src http.Header) {
	var listed []string
	for _, v := range src["Connection"] {
		for tok := range strings.SplitSeq(v, ",") {
			if tok = strings.TrimSpace(tok); tok != "" {
				listed = append(listed, http.CanonicalHeaderKey(tok))
			}
		}
	}
next:
	for k, vs := range src {
		for _, h := range hopHeaders {
			if k == h {
				continue next
			}
		}
		for _, h := range listed {
			if k == h {
				continue next
			}
		}
		dst[k] = append(dst[k][:0:0], vs...)
	}
}

// upstreamRequest is the caller's request re-addressed to the upstream: same method (unless
// given), path and query, the caller's end-to-end headers (Authorization untouched). plain asks
// for the whole object as stored: no Range, no condition, no content coding — what a fill or an
// authorization needs.
func (r *Registry) upstreamRequest(ctx context.Context, in *http.Request, method string, plain bool) *http.Request {
	u := *r.upstream
	u.Path = r.upstream.Path + in.URL.Path
	u.RawPath = ""
	u.RawQuery = in.URL.RawQuery
	out := (&http.Request{Method: method, URL: &u, Header: make(http.Header, len(in.Header)),
		Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1, Host: u.Host}).WithContext(ctx)
	copyEndToEnd(out.Header, in.Header)
	out.Header.Del("Expect")
	if plain {
		for _, h := range []string{"Range", "If-Range", "If-Match", "If-None-Match", "If-Modified-Since", "If-Unmodified-Since"} {
			out.Header.Del(h)
		}
		out.Header.Set("Accept-Encoding", "identity")
	}
	if _, ok := out.Header["User-Agent"]; !ok {
		out.Header.Set("User-Agent", "") // send none rather than Go's
	}
	return out
}

// forward sends the caller's request to the upstream and writes the upstream's answer back, as
// the upstream sent it. GET and HEAD follow redirects where redirect.go allows (a registry sends
// blob GETs to storage, and nothing in the cluster but the relay dials out); other methods pass a
// redirect on. It holds a fetch slot of the caller's address until the answer is written.
func (r *Registry) forward(x *exchange) {
	x.route, x.source = "forward", sourceUpstream
	sl, err := r.fetches.acquire(x.req.Context(), x.peer, r.slotWait)
	if err != nil {
		r.busy(x, err)
		return
	}
	defer sl.release()
	in := x.req
	out := r.upstreamRequest(in.Context(), in, in.Method, false)
	out.Body, out.ContentLength = in.Body, in.ContentLength
	if in.ContentLength == 0 {
		out.Body = http.NoBody
	}
	var resp *http.Response
	if in.Method == http.MethodGet || in.Method == http.MethodHead {
		resp, err = r.follow.Do(out)
	} else {
		resp, err = r.transport.RoundTrip(out)
	}
	if err != nil {
		r.unreachable(x, err)
		return
	}
	defer resp.Body.Close()
	r.writeResponse(x, resp)
}

// unreachable answers a request the upstream never answered: it could not be reached, or it
// redirected where the relay does not follow.
func (r *Registry) unreachable(x *exchange, err error) {
	if x.req.Context().Err() != nil {
		return // the caller left
	}
	x.err = safeError(err)
	var re *redirectError
	if errors.As(err, &re) {
		r.m.redirectsRefused.Inc()
		writeRefusal(x.w, http.StatusBadGateway, "UNAVAILABLE", RegistryRedirectRefused.Refuse("%s", re.reason))
		return
	}
	writeRefusal(x.w, http.StatusBadGateway, "UNAVAILABLE", RegistryUpstreamUnreachable.Refuse("the registry upstream did not answer"))
}

// busy answers a caller whose wait for a slot ran out: 503 registry-upstream-busy, with
// Retry-After and a reason naming the limit it waited on. A caller who left gets nothing.
func (r *Registry) busy(x *exchange, err error) {
	x.route = "busy"
	var b *errSlotBusy
	if !errors.As(err, &b) {
		return // the caller left
	}
	x.err = err
	what := "upstream fetches"
	if b.pool == poolAuthorize {
		what = "upstream authorizations"
	}
	reason := fmt.Sprintf("this address holds its %d %s", b.n, what)
	if b.limit == limitTotal {
		reason = fmt.Sprintf("the relay holds all its %d %s", b.n, what)
	}
	x.w.Header().Set("Retry-After", r.retryAfter)
	writeRefusal(x.w, http.StatusServiceUnavailable, "UNAVAILABLE",
		RegistryUpstreamBusy.Refuse("%s and none came free within %s", reason, r.slotWait))
}

// writeResponse writes an upstream answer to the caller: status, end-to-end headers (an absolute
// Location on the upstream made relative, so the caller stays on the relay) and the body,
// streamed. A body that breaks off aborts the caller's answer, so the caller sees the break.
func (r *Registry) writeResponse(x *exchange, resp *http.Response) {
	h := x.w.Header()
	copyEndToEnd(h, resp.Header)
	if loc := h.Get("Location"); loc != "" {
		h.Set("Location", r.relativeLocation(loc))
	}
	if resp.ContentLength >= 0 && h.Get("Content-Length") == "" && x.req.Method != http.MethodHead {
		h.Set("Content-Length", strconv.FormatInt(resp.ContentLength, 10))
	}
	x.w.WriteHeader(resp.StatusCode)
	if x.req.Method == http.MethodHead {
		return
	}
	bufp := getBuffer()
	defer putBuffer(bufp)
	_, err := copyBody(x.w, resp.Body, *bufp)
	if err != nil && !errors.Is(err, errWrite) {
		x.err = safeError(err)
		panic(http.ErrAbortHandler) // the upstream broke off: so must the caller's answer
	}
}

// errWrite marks a failed write to the caller (the caller left): nothing more to do.
var errWrite = errors.New("write to caller failed")

// copyBody is io.CopyBuffer that tells a failed write from a failed read.
func copyBody(w io.Writer, src io.Reader, buf []byte) (int64, error) {
	var n int64
	for {
		nr, rerr := src.Read(buf)
		if nr > 0 {
			nw, werr := w.Write(buf[:nr])
			n += int64(nw)
			if werr != nil {
				return n, errWrite
			}
		}
		if rerr == io.EOF {
			return n, nil
		}
		if rerr != nil {
			return n, rerr
		}
	}
}

// relativeLocation turns an absolute URL on the upstream into a path on the relay; any other
// Location passes untouched.
func (r *Registry) relativeLocation(loc string) string {
	u, err := url.Parse(loc)
	if err != nil || !u.IsAbs() || u.Scheme != r.upstream.Scheme || u.Host != r.upstream.Host {
		return loc
	}
	p, ok := strings.CutPrefix(u.EscapedPath(), r.upstream.EscapedPath())
	if !ok || !strings.HasPrefix(p, "/") {
		return loc
	}
	if u.RawQuery != "" {
		p += "?" + u.RawQuery
	}
	return p
}

// safeError is an error fit for a log: a *url.Error quotes the URL (and its query, which may
// carry a signed token), so only its cause is kept. A cause that quotes a URL itself — Go's
// client quotes a redirect's whole Location when it does not parse, a signed storage URL
// included — is replaced by errUnfollowable.
func safeError(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		err = ue.Err
	}
	if err != nil {
		if msg := err.Error(); strings.Contains(msg, "Location") || strings.Contains(msg, "://") {
			return errUnfollowable
		}
	}
	return err
}

// errUnfollowable stands in the log for an error that would quote a URL.
var errUnfollowable = errors.New("the upstream's answer names a URL that cannot be followed")
