package relay_test

import (
	"context"
	"errors"
	"regexp"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"

	"code.foss.global/serve.zone/relay/contracts"
	"code.foss.global/serve.zone/relay/relay"
	"code.foss.global/serve.zone/relay/testenv/relaytest"
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

// TestStatusPageShowsTheHARole: with an election, the page and status.json show the role, and
// /readyz a standby's reason.
func TestStatusPageShowsTheHARole(t *testing.T) {
	el := &fakeElector{stepDown: make(chan struct{})}
	x := relaytest.Start(t, relaytest.Options{Build: func(cfg relay.Config, o relay.Options) (*relay.Relay, error) {
		o.Elector = el
		return relay.New(cfg, relay.Features{}, o)
	}})
	role := func() string {
		_, page := statusGet(t, x, "/status")
		m := regexp.MustCompile(`id="role">([a-z]+)<`).FindStringSubmatch(page)
		if m == nil {
			t.Fatalf("/status shows no role:\n%s", page)
		}
		return m[1]
	}
	if r := role(); r != "leader" {
		t.Fatalf("role %q while leading", r)
	}
	close(el.stepDown)
	x.Eventually("standing by", func() bool { return role() == "standby" })
	// A standby is detached by design: once its Cloudly session is closed (the fence closes it
	// after the role changes), nothing on its page is painted as failing.
	x.Eventually("the standby's page detached", func() bool {
		_, page := statusGet(t, x, "/status")
		return strings.Contains(page, `id="attached">detached<`)
	})
	if _, page := statusGet(t, x, "/status"); strings.Contains(page, `class="bad"`) ||
		!strings.Contains(page, `<b class="idle" id="attached">detached</b>`) || !strings.Contains(page, `<h2>ha <small class="ok">standby</small></h2>`) {
		t.Fatalf("a healthy standby's page paints a failure, or does not show it standing by:\n%s", page)
	}
	if code, body := statusGet(t, x, "/readyz"); code != 200 || !strings.Contains(body, "ready: standby") {
		t.Fatalf("/readyz = %d %q on a standby that could lead", code, body)
	}
	el.notReady.Store(true)
	if code, body := statusGet(t, x, "/readyz"); code != 503 || !strings.Contains(body, "not ready: standby: the API is silent") {
		t.Fatalf("/readyz = %d %q on a standby that could not lead", code, body)
	}
}

// fakeElector leads at once, until stepDown is closed; then it stands by until its context ends.
type fakeElector struct {
	stepDown chan struct{}
	notReady atomic.Bool
}

func (f *fakeElector) Run(ctx context.Context, lead func(context.Context)) error {
	leadCtx, cancel := context.WithCancel(ctx)
	go func() {
		select {
		case <-f.stepDown:
		case <-ctx.Done():
		}
		cancel()
	}()
	lead(leadCtx)
	<-ctx.Done()
	return nil
}

func (f *fakeElector) Ready() error {
	if f.notReady.Load() {
		return errors.New("the API is silent")
	}
	return nil
}

func (f *fakeElector) Status() any { return map[string]string{"holder": "pod-a"} }
