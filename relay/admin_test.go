package relay_test

import (
	"runtime"
	"strings"
	"testing"

	"code.foss.global/serve.zone/relay/contracts"
	"code.foss.global/serve.zone/relay/internal/testenv/relaytest"
	"code.foss.global/serve.zone/relay/relay"
)

// TestAdminPprof: net/http/pprof is on the admin listener only with --admin-pprof.
func TestAdminPprof(t *testing.T) {
	t.Run("off by default", func(t *testing.T) {
		e := start(t, relay.Features{})
		if code, _ := e.admin("/debug/pprof/"); code != 404 {
			t.Fatalf("/debug/pprof/ = %d without --admin-pprof, want 404", code)
		}
	})
	t.Run("on", func(t *testing.T) {
		x := relaytest.Start(t, relaytest.Options{Configure: func(c *relay.Config) { c.AdminPprof = true }})
		code, body := statusGet(t, x, "/debug/pprof/")
		if code != 200 || !strings.Contains(body, "goroutine") || !strings.Contains(body, "heap") {
			t.Fatalf("/debug/pprof/ = %d with --admin-pprof:\n%.400s", code, body)
		}
		if code, body := statusGet(t, x, "/debug/pprof/goroutine?debug=1"); code != 200 || !strings.Contains(body, "goroutine profile") {
			t.Fatalf("/debug/pprof/goroutine = %d:\n%.200s", code, body)
		}
	})
}

// TestBuildInfo: /metrics carries relay_build_info with the build, the protocol and Go's version.
func TestBuildInfo(t *testing.T) {
	e := start(t, relay.Features{})
	_, body := e.admin("/metrics")
	want := `relay_build_info{goversion="` + runtime.Version() + `",protocol="` + contracts.InterfacesVersion + `",version="` +
		relay.DefaultBuildVersion + `"} 1`
	if !strings.Contains(body, want) {
		t.Fatalf("/metrics has no %s", want)
	}
}
