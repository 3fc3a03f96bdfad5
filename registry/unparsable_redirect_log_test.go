package registry_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// A redirect whose Location does not parse is a failure to reach the object, and Go's client
// quotes the whole Location in its error: a signed storage URL, query and all. The registry's
// log names the failure, never the Location. Both a cached (sha256) and a forwarded (sha512)
// blob are asked, an absolute and a relative Location each.
func TestUnparsableRedirectLocationNeverReachesTheLog(t *testing.T) {
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
}
