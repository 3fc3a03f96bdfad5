package registry_test

import (
	"bytes"
	"crypto/rand"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
)

// Storage that a registry redirects blob GETs to may share the registry's host name: another
// port of the same machine (a MinIO beside the registry), or a subdomain (cdn.<registry>). It is
// another origin all the same, and must not receive the caller's registry credentials.
func TestRedirectToAnotherPortOfTheSameHostDropsCredentials(t *testing.T) {
	blob := make([]byte, 64<<10)
	rand.Read(blob)
	digest := sha256Of(blob)
	var storageAuth atomic.Value
	storageAuth.Store("")
	storage := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		storageAuth.Store(r.Header.Get("Authorization"))
		w.Header().Set("Content-Length", fmt.Sprint(len(blob)))
		w.Write(blob)
	}))
	defer storage.Close()
	// Both on 127.0.0.1: the same host name, another port.
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer good" {
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		http.Redirect(w, r, storage.URL+"/signed/object?sig=x", http.StatusTemporaryRedirect)
	}))
	defer up.Close()
	e := startRelay(t, up.URL, "", nil)
	for _, p := range []string{"/v2/r/blobs/" + digest, "/v2/r/blobs/sha512:" + fmt.Sprintf("%0128x", 1)} {
		storageAuth.Store("")
		resp, body, err := rawGet(t, e, http.MethodGet, p, "good", nil)
		if err != nil || resp.StatusCode != http.StatusOK || !bytes.Equal(body, blob) {
			t.Fatalf("%s: %v %v, %d bytes", p, resp.StatusCode, err, len(body))
		}
		if a := storageAuth.Load().(string); a != "" {
			t.Errorf("%s: storage at another port received the caller's Authorization %q", p, a)
		}
	}
}
