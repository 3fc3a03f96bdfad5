package registry

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strings"
	"syscall"
	"time"
)

// Redirects (docs/hostile.md). GET and HEAD follow the upstream's redirects: registries send blob GETs
// to storage. A Location is a URL a peer chose, so without a rule a malicious or compromised
// registry could make the relay dial anything the relay can reach — the cluster's private
// services, the node's loopback, the cloud's metadata address — with its answer streamed back to
// the caller. So a redirect off the upstream's own origin (scheme, host, port):
//
//   - is followed only to https, never to plain http (--insecure-plaintext included);
//   - reaches only a public address: the address actually dialled, after name resolution, is
//     checked (net.Dialer.Control), so a public name that resolves to a private address is
//     refused like a private literal, and a connection is vetted once, when it is dialled;
//   - carries none of the caller's credentials (Authorization, cookies).
//
// The upstream's own origin is dialled wherever it resolves: the operator chose it. At most 5
// redirects are followed. A refusal answers the caller 502 registry-redirect-refused.
//
// Environment proxies (HTTPS_PROXY) are not used: behind a proxy the relay would dial the proxy,
// and could not check the address a redirect reaches.

const maxRedirects = 5

// redirectError is a redirect the relay does not follow; reason is fit for the caller and the
// log: it never quotes the Location, which may carry a signed storage URL.
type redirectError struct{ reason string }

func (e *redirectError) Error() string { return "redirect refused: " + e.reason }

var (
	errRedirectTooMany = &redirectError{"the upstream redirected more than 5 times"}
	errRedirectPlain   = &redirectError{"the upstream redirected off its origin to plain http"}
	errRedirectAddress = &redirectError{"the upstream redirected off its origin to an address that is not public"}
)

// checkRedirect is the follow client's CheckRedirect: the scheme and credential rules above (the
// address rule is the dialer's).
func (r *Registry) checkRedirect(req *http.Request, via []*http.Request) error {
	if len(via) >= maxRedirects {
		return errRedirectTooMany
	}
	if sameOrigin(req.URL, r.upstream) {
		return nil
	}
	if req.URL.Scheme != "https" {
		return errRedirectPlain
	}
	// Go's client keeps credentials for the same host name on another port and for subdomains,
	// which are other origins all the same.
	for _, h := range []string{"Authorization", "Cookie", "Cookie2"} {
		req.Header.Del(h)
	}
	return nil
}

// sameOrigin compares scheme, host (case-insensitively) and port, a missing port being the
// scheme's.
func sameOrigin(a, b *url.URL) bool {
	return a.Scheme == b.Scheme && strings.EqualFold(a.Hostname(), b.Hostname()) && port(a) == port(b)
}

func port(u *url.URL) string {
	if p := u.Port(); p != "" {
		return p
	}
	if u.Scheme == "https" {
		return "443"
	}
	return "80"
}

// newTransport reaches the upstream and whatever it redirects to: TLS verified against roots,
// no content coding asked for, at most conns connections per host, and a dialer that reaches
// any host but the upstream's only at addresses public accepts.
func newTransport(upstream *url.URL, roots *x509.CertPool, conns int, public func(netip.Addr) bool) *http.Transport {
	d := &dialer{upstream: net.JoinHostPort(upstream.Hostname(), port(upstream)), public: public,
		Dialer: net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second}}
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.Proxy = nil               // see above: the dialled address must be the one checked
	t.DisableCompression = true // bytes pass as the registry stored them; a fill asks for identity
	t.MaxIdleConnsPerHost = 64  // many nodes pull at once
	t.MaxConnsPerHost = conns
	t.ResponseHeaderTimeout = time.Minute
	t.TLSClientConfig = &tls.Config{MinVersion: tls.VersionTLS12, RootCAs: roots}
	t.DialContext = d.DialContext
	return t
}

// dialer dials the upstream's own host:port wherever it resolves, and every other host (a
// redirect's) only at an address public accepts. The transport asks for a connection by the
// host:port of the URL it serves and pools it under that key, so a connection vetted for one
// host is never reused for another.
type dialer struct {
	upstream string                // set at construction: host:port as the transport spells it
	public   func(netip.Addr) bool // set at construction
	net.Dialer
}

func (d *dialer) DialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	if strings.EqualFold(addr, d.upstream) {
		return d.Dialer.DialContext(ctx, network, addr)
	}
	vetted := d.Dialer
	vetted.Control = func(_, address string, _ syscall.RawConn) error {
		if ap, err := netip.ParseAddrPort(address); err == nil && d.public(ap.Addr()) {
			return nil
		}
		return errRedirectAddress
	}
	return vetted.DialContext(ctx, network, addr)
}

// Address space a redirect never reaches beyond what netip names: "this network", shared
// (carrier-grade NAT, often a cluster's own network) and NAT64's well-known prefix, which embeds
// an IPv4 address that is checked in turn.
var (
	thisNetwork = netip.MustParsePrefix("0.0.0.0/8")
	sharedSpace = netip.MustParsePrefix("100.64.0.0/10")
	nat64       = netip.MustParsePrefix("64:ff9b::/96")
)

// publicAddr reports whether a redirect may reach a: a global unicast address outside private
// (RFC 1918, fc00::/7), shared and "this network" space — so never loopback, link-local (the
// cloud metadata address included), multicast or unspecified.
func publicAddr(a netip.Addr) bool {
	a = a.Unmap()
	if nat64.Contains(a) {
		b := a.As16()
		a = netip.AddrFrom4([4]byte(b[12:]))
	}
	return a.IsGlobalUnicast() && !a.IsPrivate() && !thisNetwork.Contains(a) && !sharedSpace.Contains(a)
}
