package registry_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// A fill whose upstream answer is not cacheable (here: a 200 without a length) is handed to its
// leader as a plain forward. When that caller leaves, the upstream request must end with it, as
// it does for every other forwarded request: otherwise a silent upstream holds the handler, its
// goroutine and an upstream connection until the registry closes.
func TestUncacheableAnswerEndsWhenItsCallerLeaves(t *testing.T) {
	upstreamGone, release := make(chan struct{}), make(chan struct{})
	digest := "sha256:" + strings.Repeat("ab", 32)
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusOK)  // no Content-Length: chunked, so not cacheable
		w.Write(make([]byte, 64<<10)) // more than the relay buffers
		w.(http.Flusher).Flush()
		select { // silent until the relay gives up on the request
		case <-r.Context().Done():
			close(upstreamGone)
		case <-release:
		}
	}))
	t.Cleanup(up.Close)
	e := startRelay(t, up.URL, "", nil)
	t.Cleanup(func() { close(release) })

	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+e.addr+"/v2/r/blobs/"+digest, nil)
	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	resp, err := (&http.Client{Transport: tr}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d", resp.StatusCode)
	}
	io.ReadFull(resp.Body, make([]byte, 4))
	cancel() // the caller leaves
	resp.Body.Close()

	select {
	case <-upstreamGone:
	case <-time.After(5 * time.Second):
		t.Fatal("the caller left 5s ago, but the relay still holds its upstream request open")
	}
}
