package relay

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/coder/websocket"
	"github.com/rs/zerolog"

	"code.foss.global/serve.zone/relay/contracts"
	"code.foss.global/serve.zone/relay/feature"
	"code.foss.global/serve.zone/relay/internal/backoff"
	"code.foss.global/serve.zone/relay/internal/typedsocket"
	"code.foss.global/serve.zone/relay/testenv/memnet"
)

// fakeHost is the relay side of the seam, recording what the upstream tells it.
type fakeHost struct {
	mu       sync.Mutex
	seq      int64
	accepted int
	attached int
	detached int
	refusals []contracts.RefusalName
}

func (h *fakeHost) serveCloudly(req *typedsocket.Request) {
	req.Fail(contracts.RelayMethodUnknown.Refuse("%s", req.Method))
}
func (h *fakeHost) serveCloudlyStream(*typedsocket.Conn, *typedsocket.StreamFrame) {}
func (h *fakeHost) registration(seq int64) json.RawMessage {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.seq = seq + 1
	return json.RawMessage(`{}`)
}
func (h *fakeHost) registrationAccepted()             { h.mu.Lock(); h.accepted++; h.mu.Unlock() }
func (h *fakeHost) upstreamAttached(feature.Upstream) { h.mu.Lock(); h.attached++; h.mu.Unlock() }
func (h *fakeHost) upstreamDetached()                 { h.mu.Lock(); h.detached++; h.mu.Unlock() }
func (h *fakeHost) undispatched(n contracts.RefusalName) {
	h.mu.Lock()
	h.refusals = append(h.refusals, n)
	h.mu.Unlock()
}
func (h *fakeHost) countDropped(string) {}

// hooks are the fake's methods as the upstream's seam.
func (h *fakeHost) hooks() upstreamHooks {
	return upstreamHooks{serve: h.serveCloudly, serveStream: h.serveCloudlyStream, registration: h.registration,
		accepted: h.registrationAccepted, attached: h.upstreamAttached, detached: h.upstreamDetached,
		undispatched: h.undispatched, dropped: h.countDropped}
}

func (h *fakeHost) counts() (accepted, attached, detached int, undispatched []contracts.RefusalName) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.accepted, h.attached, h.detached, append([]contracts.RefusalName(nil), h.refusals...)
}

// pipeCloudly is a Cloudly reached through in-memory pipes: every dial is one pipe, served by a
// WebSocket server on its other end that answers the two attach steps as answer says. dials
// records when each dial came.
type pipeCloudly struct {
	t      *testing.T
	answer func(method string) (json.RawMessage, error)
	fail   bool // refuse the dial itself

	mu      sync.Mutex
	dials   []time.Time
	conns   []*typedsocket.Conn
	servers []*http.Server
}

func (c *pipeCloudly) dial(ctx context.Context, _, _ string) (net.Conn, error) {
	c.mu.Lock()
	c.dials = append(c.dials, time.Now())
	fail := c.fail
	c.mu.Unlock()
	if fail {
		return nil, errors.New("connection refused")
	}
	client, server := memnet.Pipe()
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ws, err := websocket.Accept(w, r, nil)
		if err != nil {
			return
		}
		conn := typedsocket.New(ws, typedsocket.Options{Logger: zerolog.Nop(),
			Handler: typedsocket.HandlerFunc(func(_ *typedsocket.Conn, req *typedsocket.Request) {
				body, err := c.answer(req.Method)
				req.Answer(typedsocket.Reply{Response: body, Err: err})
			})})
		c.mu.Lock()
		c.conns = append(c.conns, conn)
		c.mu.Unlock()
		conn.Run(context.Background())
	})}
	c.mu.Lock()
	c.servers = append(c.servers, srv)
	c.mu.Unlock()
	go srv.Serve(memnet.Once(server))
	return client, nil
}

// close ends every server and connection, so the test's bubble ends with nothing blocked.
func (c *pipeCloudly) close() {
	c.drop()
	c.mu.Lock()
	servers := c.servers
	c.servers = nil
	c.mu.Unlock()
	for _, srv := range servers {
		srv.Close()
	}
}

// drop ends every served connection, as a Cloudly that goes away.
func (c *pipeCloudly) drop() {
	c.mu.Lock()
	conns := c.conns
	c.conns = nil
	c.mu.Unlock()
	for _, conn := range conns {
		conn.CloseNow()
	}
}

func (c *pipeCloudly) dialTimes() []time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]time.Time(nil), c.dials...)
}

var offer, _ = contracts.RelayOffer.MarshalJSON()

func acceptBoth(method string) (json.RawMessage, error) {
	if method == contracts.MethodRegisterClusterRelay {
		return json.RawMessage(`{"protocol":` + string(offer) + `,"origin":"https://relay.cluster-a.example"}`), nil
	}
	return json.RawMessage(`{"protocol":` + string(offer) + `}`), nil
}

// startUpstream runs an upstream against c until the test function returns (stop: deferred by
// the caller, inside its bubble).
func startUpstream(t *testing.T, c *pipeCloudly) (*upstream, *fakeHost, func()) {
	t.Helper()
	token := filepath.Join(t.TempDir(), "jwt")
	if err := os.WriteFile(token, []byte("jwt"), 0o600); err != nil {
		t.Fatal(err)
	}
	h := &fakeHost{}
	u := newUpstream(upstreamConfig{url: "ws://cloudly.invalid/", tokenFile: token, allowHTTP: true, dial: c.dial},
		zerolog.Nop(), &newMetrics().up, h.hooks())
	u.start(context.Background())
	return u, h, func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		u.close(ctx, "test over")
		c.close()
		synctest.Wait()
	}
}

// TestUpstreamSession drives the Cloudly session through the seam with no socket: attach, judge,
// refusals and backoff, on a fake clock (testing/synctest).
func TestUpstreamSession(t *testing.T) {
	t.Run("attach: both steps accepted, the host hears it once, the origin recorded", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			c := &pipeCloudly{t: t, answer: acceptBoth}
			u, h, stop := startUpstream(t, c)
			defer stop()
			synctest.Wait()
			accepted, attached, _, _ := h.counts()
			if !u.Attached() || accepted != 1 || attached != 1 {
				t.Fatalf("attached %v, accepted %d, told attached %d", u.Attached(), accepted, attached)
			}
			if st := u.state.Load(); st == nil || st.origin != "https://relay.cluster-a.example" || st.sequence != 0 {
				t.Fatalf("session state %+v", st)
			}
			c.drop()
			synctest.Wait()
			if _, _, detached, _ := h.counts(); detached != 1 || u.Attached() {
				t.Fatalf("after Cloudly went: detached told %d times, attached %v", detached, u.Attached())
			}
		})
	})

	t.Run("judge: an offer the relay refuses waits the refused-offer interval", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			old, _ := contracts.ProtocolOffer{InterfacesVersion: "31.0.0", MinimumPeerVersion: "31.0.0"}.MarshalJSON()
			c := &pipeCloudly{t: t, answer: func(string) (json.RawMessage, error) {
				return json.RawMessage(`{"protocol":` + string(old) + `}`), nil
			}}
			u, _, stop := startUpstream(t, c)
			defer stop()
			advance(contracts.RefusedOfferRetryInterval + time.Second) // the fake clock: the wait is the behaviour
			d := c.dialTimes()
			if u.Attached() || len(d) != 2 || d[1].Sub(d[0]) < contracts.RefusedOfferRetryInterval {
				t.Fatalf("attached %v; dials %v: want a second one %s after the refusal", u.Attached(), d, contracts.RefusedOfferRetryInterval)
			}
		})
	})

	t.Run("refusal: an undispatched refusal is the host's to act on, and the relay tries again", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			c := &pipeCloudly{t: t, answer: func(method string) (json.RawMessage, error) {
				if method == contracts.MethodRegisterClusterRelay {
					return nil, contracts.RelayNodeForeign.Refuse("the relay runs on another cluster's node")
				}
				return acceptBoth(method)
			}}
			u, h, stop := startUpstream(t, c)
			defer stop()
			advance(backoff.Cap + time.Second)
			_, attached, _, names := h.counts()
			if u.Attached() || attached != 0 || len(names) < 2 || names[0] != contracts.RelayNodeForeign {
				t.Fatalf("attached %v (%d), undispatched %v: want relay-node-foreign each time, never attached", u.Attached(), attached, names)
			}
		})
	})

	t.Run("backoff: failed dials wait longer and longer, at most the cap, and a success resets it", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			c := &pipeCloudly{t: t, answer: acceptBoth, fail: true}
			u, _, stop := startUpstream(t, c)
			defer stop()
			advance(5 * time.Minute)
			d := c.dialTimes()
			if len(d) < 10 {
				t.Fatalf("%d dials in 5 minutes", len(d))
			}
			for i := 1; i < len(d); i++ {
				if gap := d[i].Sub(d[i-1]); gap > backoff.Cap {
					t.Fatalf("dial %d came %s after the one before, past the cap %s", i, gap, backoff.Cap)
				}
			}
			c.mu.Lock()
			c.fail = false
			c.mu.Unlock()
			advance(backoff.Cap)
			if !u.Attached() {
				t.Fatal("not attached once Cloudly answered")
			}
		})
	})
}

// advance moves the bubble's fake clock on by d and waits until every goroutine in it is blocked:
// the one place these tests let time pass, and time passing is what they test.
func advance(d time.Duration) {
	time.Sleep(d)
	synctest.Wait()
}
