package status

import (
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
)

// TestCapRequests: the admin listener serves a bounded number of requests at once; one beyond
// is answered 503 with Retry-After at once, and served again once a slot is free.
func TestCapRequests(t *testing.T) {
	release := make(chan struct{})
	var started, done sync.WaitGroup
	h := capRequests(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		started.Done()
		<-release
	}), 2)
	for range 2 {
		started.Add(1)
		done.Add(1)
		go func() {
			defer done.Done()
			h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest("GET", "/metrics", nil))
		}()
	}
	started.Wait()
	w := httptest.NewRecorder()
	h.ServeHTTP(w, httptest.NewRequest("GET", "/metrics", nil))
	if w.Code != http.StatusServiceUnavailable || w.Header().Get("Retry-After") == "" {
		t.Fatalf("a request beyond the cap: %d, want 503 with Retry-After", w.Code)
	}
	close(release)
	done.Wait()
	started.Add(1)
	w = httptest.NewRecorder()
	h.ServeHTTP(w, httptest.NewRequest("GET", "/metrics", nil))
	if w.Code != http.StatusOK {
		t.Fatalf("a request once the slots are free: %d, want 200", w.Code)
	}
}
