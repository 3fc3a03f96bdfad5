package registry_test

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"fmt"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"code.foss.global/serve.zone/relay/registry"
)

// storageServer is blob storage a registry redirects to: https, under a certificate for
// localhost, 127.0.0.1 and ::1 that the returned pool trusts. It counts the requests it receives
// and remembers the last Authorization it saw.
type storageServer struct {
	*httptest.Server
	roots    *x509.CertPool
	requests atomic.Int64
	auth     atomic.Value // string
}

func newStorage(t *testing.T, blob []byte) *storageServer {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "storage"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		DNSNames: []string{"localhost"}, IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback},
		KeyUsage: x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign, BasicConstraintsValid: true, IsCA: true,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	s := &storageServer{roots: x509.NewCertPool()}
	s.roots.AddCert(cert)
	s.auth.Store("")
	s.Server = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.requests.Add(1)
		s.auth.Store(r.Header.Get("Authorization"))
		w.Header().Set("Content-Length", fmt.Sprint(len(blob)))
		w.Write(blob)
	}))
	s.TLS = &tls.Config{Certificates: []tls.Certificate{{Certificate: [][]byte{der}, PrivateKey: key}}}
	s.StartTLS()
	t.Cleanup(s.Close)
	return s
}

// port is the storage's port.
func (s *storageServer) port() string {
	return s.Listener.Addr().(*net.TCPAddr).AddrPort().String()[len("127.0.0.1:"):]
}

// redirectingUpstream answers HEADs for blob (the authorization) and redirects every GET to
// location(), after checking the caller's Bearer token.
func redirectingUpstream(t *testing.T, blob []byte, location func(*http.Request) string) *httptest.Server {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer good" {
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		if r.Method == http.MethodHead {
			w.Header().Set("Content-Length", fmt.Sprint(len(blob)))
			w.Header().Set("Docker-Content-Digest", sha256Of(blob))
			return
		}
		if strings.HasPrefix(r.URL.Path, "/own/") { // the upstream's own origin serves it
			w.Header().Set("Content-Length", fmt.Sprint(len(blob)))
			w.Write(blob)
			return
		}
		http.Redirect(w, r, location(r), http.StatusTemporaryRedirect)
	}))
	t.Cleanup(up.Close)
	return up
}

func randomBlob(n int) []byte {
	b := make([]byte, n)
	rand.Read(b)
	return b
}

// TestRedirects: GET and HEAD follow the upstream's redirects (a registry sends blob GETs to
// storage), only to public https origins (or the upstream's own), never with the caller's
// credentials off the upstream's origin, and never quoting a Location in the log. Both a blob the
// relay caches (sha256, a fill) and one it only forwards (sha512) are asked each time.
func TestRedirects(t *testing.T) {
	forwarded := "sha512:" + fmt.Sprintf("%0128x", 1)

	// Storage a registry redirects blob GETs to is another origin, even on the registry's own host
	// name: another port (a MinIO beside the registry) or a subdomain. Go's client drops
	// Authorization only for another host name, so the relay drops it itself for any other origin.
	// Loopback stands in for public storage here.
	t.Run("storage gets none of the caller's credentials", func(t *testing.T) {
		for _, tc := range []struct{ name, storageHost string }{
			{"another host", "localhost"},
			{"same host name, another port", "127.0.0.1"},
		} {
			t.Run(tc.name, func(t *testing.T) {
				blob := randomBlob(100 << 10)
				digest := sha256Of(blob)
				storage := newStorage(t, blob)
				storageURL := "https://" + tc.storageHost + ":" + storage.port() + "/signed/object?sig=s3cr3t"
				up := redirectingUpstream(t, blob, func(*http.Request) string { return storageURL })
				e := startRelay(t, up.URL, "", func(o *registry.Options) {
					registry.LoopbackIsPublic(o)
					o.RootCAs = storage.roots
				})
				for _, d := range []string{digest, forwarded} {
					storage.auth.Store("")
					resp, body, err := rawGet(t, e, http.MethodGet, "/v2/r/blobs/"+d, "good", nil)
					if err != nil || resp.StatusCode != http.StatusOK || !bytes.Equal(body, blob) {
						t.Fatalf("redirected blob %s: %v %v, %d bytes", d, resp.StatusCode, err, len(body))
					}
					if a := storage.auth.Load().(string); a != "" {
						t.Fatalf("storage received the caller's Authorization %q for %s", a, d)
					}
				}
				e.settle()
				if _, err := os.Stat(blobPath(e.cacheDir, digest)); err != nil {
					t.Fatalf("redirected blob not cached: %v", err)
				}
				if strings.Contains(e.Logs.String(), "s3cr3t") {
					t.Fatal("the signed storage URL appears in the log")
				}
			})
		}
	})

	// A malicious registry redirected the relay to any https host, and to
	// any host at all with --insecure-plaintext, private and link-local addresses included. Off
	// the upstream's origin the relay now follows only https, and dials only public addresses:
	// the address dialled, so a name resolving to loopback is refused like a loopback literal.
	// Storage here is real and trusted, so only the rule can keep the relay from reaching it.
	t.Run("never to plain http or a private, loopback or link-local address", func(t *testing.T) {
		blob := randomBlob(64 << 10)
		storage := newStorage(t, blob)
		plain := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { storage.requests.Add(1) }))
		t.Cleanup(plain.Close)
		for _, tc := range []struct {
			name, location string
			loopbackPublic bool // the address rule passes loopback: only the scheme rule refuses
		}{
			{"loopback literal", "https://127.0.0.1:" + storage.port() + "/o", false},
			{"a name that resolves to loopback", "https://localhost:" + storage.port() + "/o", false},
			{"IPv4-mapped loopback", "https://[::ffff:127.0.0.1]:" + storage.port() + "/o", false},
			{"link-local: the metadata address", "https://169.254.169.254/latest/meta-data/", false},
			{"private", "https://10.0.0.1/o", false},
			{"plain http", plain.URL + "/o", true},
		} {
			t.Run(tc.name, func(t *testing.T) {
				up := redirectingUpstream(t, blob, func(*http.Request) string { return tc.location })
				e := startRelay(t, up.URL, "", func(o *registry.Options) {
					o.RootCAs = storage.roots
					if tc.loopbackPublic {
						registry.LoopbackIsPublic(o)
					}
				})
				before := storage.requests.Load()
				for _, d := range []string{sha256Of(blob), forwarded} {
					resp, body, err := rawGet(t, e, http.MethodGet, "/v2/r/blobs/"+d, "good", nil)
					if err != nil || resp.StatusCode != http.StatusBadGateway ||
						!bytes.Contains(body, []byte(`"message":"`+string(registry.RegistryRedirectRefused)+`: `)) {
						t.Fatalf("%s: %v %v %.200q; want 502 %s", d, resp.StatusCode, err, body, registry.RegistryRedirectRefused)
					}
				}
				if n := storage.requests.Load() - before; n != 0 {
					t.Fatalf("storage behind a refused redirect received %d requests", n)
				}
				if got := e.Metric("relay_registry_redirects_refused_total"); got != 2 {
					t.Fatalf("redirects_refused_total = %v, want 2", got)
				}
			})
		}
	})

	t.Run("the address rule", func(t *testing.T) {
		for addr, public := range map[string]bool{
			"1.1.1.1": true, "2606:4700:4700::1111": true, "64:ff9b::101:101": true, // 1.1.1.1 through NAT64
			"127.0.0.1": false, "::1": false, "::ffff:127.0.0.1": false, "0.0.0.0": false, "::": false, "0.1.2.3": false,
			"10.1.2.3": false, "172.16.0.1": false, "192.168.1.1": false, "fc00::1": false, "fd00:ec2::254": false,
			"169.254.169.254": false, "fe80::1": false, "100.64.0.1": false, "64:ff9b::a00:1": false, // 10.0.0.1 through NAT64
			"224.0.0.1": false, "ff02::1": false, "255.255.255.255": false,
		} {
			if got := registry.PublicAddr(netip.MustParseAddr(addr)); got != public {
				t.Errorf("%s: public %v, want %v", addr, got, public)
			}
		}
	})

	// The configured upstream is the operator's choice: its own origin is followed wherever it
	// resolves (here, loopback), with the caller's credentials.
	t.Run("the upstream's own origin is followed wherever it resolves", func(t *testing.T) {
		blob := randomBlob(64 << 10)
		var up *httptest.Server
		up = redirectingUpstream(t, blob, func(r *http.Request) string { return up.URL + "/own" + r.URL.Path })
		e := startRelay(t, up.URL, "", nil)
		for _, d := range []string{sha256Of(blob), forwarded} {
			resp, body, err := rawGet(t, e, http.MethodGet, "/v2/r/blobs/"+d, "good", nil)
			if err != nil || resp.StatusCode != http.StatusOK || !bytes.Equal(body, blob) {
				t.Fatalf("%s: %v %v, %d bytes", d, resp.StatusCode, err, len(body))
			}
		}
	})

	// A redirect whose Location does not parse is a failure to reach the object, and Go's client
	// quotes the whole Location in its error: a signed storage URL, query and all. The registry's
	// log names the failure, never the Location. Both a cached (sha256) and a forwarded (sha512)
	// blob are asked, an absolute and a relative Location each.
	t.Run("an unparsable Location never reaches the log", func(t *testing.T) {
		const signature = "SIGNEDSTORAGEsecret0123"
		for _, tc := range []struct{ name, location string }{
			{"absolute", "https://storage.example/obj%zz?X-Amz-Signature=" + signature},
			{"relative", "/signed/obj%zz?X-Amz-Signature=" + signature},
		} {
			t.Run(tc.name, func(t *testing.T) {
				up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					w.Header().Set("Location", tc.location)
					w.WriteHeader(http.StatusTemporaryRedirect)
				}))
				defer up.Close()
				e := startRelay(t, up.URL, "", nil)
				for _, d := range []string{"sha256:" + fmt.Sprintf("%064x", 1), "sha512:" + fmt.Sprintf("%0128x", 1)} {
					resp, body, err := rawGet(t, e, http.MethodGet, "/v2/r/blobs/"+d, "good", nil)
					if err != nil || resp.StatusCode != http.StatusBadGateway {
						t.Fatalf("%s: %v %v", d, resp.StatusCode, err)
					}
					if strings.Contains(string(body), signature) {
						t.Fatalf("%s: the signed storage URL reached the caller's error body: %s", d, body)
					}
				}
				e.settle()
				// Each request is logged as its handler returns, which may be after its caller read it.
				e.Eventually("both requests logged", func() bool {
					return strings.Count(e.Logs.String(), `"message":"registry request"`) == 2
				})
				logs := e.Logs.String()
				if strings.Contains(logs, signature) {
					t.Fatalf("the signed storage URL reached the log:\n%s", logs)
				}
			})
		}
	})
}
