package registry_test

import (
	"bytes"
	"crypto/rand"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync/atomic"
	"testing"
)

// TestRedirects: GET and HEAD follow the upstream's redirects (a registry sends blob GETs to
// storage), never with the caller's credentials off the upstream's origin, and never quoting a
// Location in the log.
func TestRedirects(t *testing.T) {
	// Storage a registry redirects blob GETs to is another origin, even on the registry's own host
	// name: another port (a MinIO beside the registry) or a subdomain. Go's client drops
	// Authorization only for another host name, so the relay drops it itself for any other origin.
	// Both a blob the relay caches (sha256) and one it only forwards (sha512) are followed.
	t.Run("storage gets none of the caller's credentials", func(t *testing.T) {
		for _, tc := range []struct{ name, storageHost string }{
			{"another host", "localhost"},
			{"same host name, another port", "127.0.0.1"},
		} {
			t.Run(tc.name, func(t *testing.T) {
				blob := make([]byte, 100<<10)
				rand.Read(blob)
				digest := sha256Of(blob)
				forwarded := "sha512:" + fmt.Sprintf("%0128x", 1)
				var storageAuth atomic.Value
				storageAuth.Store("")
				storage := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					storageAuth.Store(r.Header.Get("Authorization"))
					w.Header().Set("Content-Length", fmt.Sprint(len(blob)))
					w.Write(blob)
				}))
				defer storage.Close()
				storageURL := strings.Replace(storage.URL, "127.0.0.1", tc.storageHost, 1) + "/signed/object?sig=s3cr3t"
				up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					if r.Header.Get("Authorization") != "Bearer good" {
						w.WriteHeader(http.StatusUnauthorized)
						return
					}
					if r.Method == http.MethodHead {
						w.Header().Set("Content-Length", fmt.Sprint(len(blob)))
						w.Header().Set("Docker-Content-Digest", digest)
						return
					}
					http.Redirect(w, r, storageURL, http.StatusTemporaryRedirect)
				}))
				defer up.Close()
				e := startRelay(t, up.URL, "", nil)
				for _, d := range []string{digest, forwarded} {
					storageAuth.Store("")
					resp, body, err := rawGet(t, e, http.MethodGet, "/v2/r/blobs/"+d, "good", nil)
					if err != nil || resp.StatusCode != http.StatusOK || !bytes.Equal(body, blob) {
						t.Fatalf("redirected blob %s: %v %v, %d bytes", d, resp.StatusCode, err, len(body))
					}
					if a := storageAuth.Load().(string); a != "" {
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
