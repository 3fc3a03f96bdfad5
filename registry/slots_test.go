package registry

import (
	"context"
	"errors"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// testPool is a pool of perSource slots per source and total in all, with its gauge and the
// refused waits it counted by limit.
func testPool(perSource, total int) (*slotPool, prometheus.Gauge, map[string]int) {
	g := prometheus.NewGauge(prometheus.GaugeOpts{Name: "g"})
	refused := map[string]int{}
	return newSlotPool(poolFetch, perSource, total, g, func(limit string) { refused[limit]++ }), g, refused
}

// TestSlotPool: the limits per source and in all, a bounded wait, and the order waiters are
// granted in. Time is synctest's, so a 10 s wait takes none.
func TestSlotPool(t *testing.T) {
	const wait = 10 * time.Second
	ctx := context.Background()
	t.Run("a source beyond its share waits; another source does not", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			p, g, refused := testPool(2, 3)
			a1, _ := p.acquire(ctx, "a", wait)
			a2, _ := p.acquire(ctx, "a", wait)
			got := make(chan *slot, 1)
			go func() { s, _ := p.acquire(ctx, "a", wait); got <- s }()
			synctest.Wait()
			if len(got) != 0 {
				t.Fatal("a third slot for a source whose share is two")
			}
			b, err := p.acquire(ctx, "b", wait)
			if err != nil {
				t.Fatalf("another source waited while the pool had room: %v", err)
			}
			if v := testutil.ToFloat64(g); v != 3 {
				t.Fatalf("slots in use %v, want 3", v)
			}
			a1.release()
			a1.release() // a second release gives nothing back
			synctest.Wait()
			a3 := <-got
			if v := testutil.ToFloat64(g); v != 3 || a3 == nil {
				t.Fatalf("after a release: %v in use, waiter granted %v", v, a3 != nil)
			}
			for _, s := range []*slot{a2, a3, b} {
				s.release()
			}
			if held, sources := p.stats(); held != 0 || sources != 0 || len(refused) != 0 {
				t.Fatalf("all released: %d held, %d sources tracked, refused %v", held, sources, refused)
			}
		})
	})
	t.Run("a wait is bounded and names the limit it waited on", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			p, _, refused := testPool(1, 2)
			a, _ := p.acquire(ctx, "a", wait)
			start := time.Now()
			_, err := p.acquire(ctx, "a", wait)
			var busy *errSlotBusy
			if !errors.As(err, &busy) || busy.limit != limitSource || busy.n != 1 || time.Since(start) != wait {
				t.Fatalf("a wait at the source limit: %v after %v", err, time.Since(start))
			}
			b, _ := p.acquire(ctx, "b", wait)
			_, err = p.acquire(ctx, "c", wait)
			if !errors.As(err, &busy) || busy.limit != limitTotal || busy.n != 2 {
				t.Fatalf("a wait at the total limit: %v", err)
			}
			if refused[limitSource] != 1 || refused[limitTotal] != 1 {
				t.Fatalf("refused waits %v", refused)
			}
			// A caller who leaves while waiting is no refusal.
			cctx, cancel := context.WithCancel(ctx)
			time.AfterFunc(time.Second, cancel) // a second into its wait, on the bubble's clock
			if _, err := p.acquire(cctx, "c", wait); !errors.Is(err, context.Canceled) {
				t.Fatalf("a waiter whose caller left: %v", err)
			}
			if refused[limitTotal] != 1 {
				t.Fatalf("a departed caller counted as refused: %v", refused)
			}
			a.release()
			b.release()
			if held, sources := p.stats(); held != 0 || sources != 0 {
				t.Fatalf("all released: %d held, %d sources tracked", held, sources)
			}
		})
	})
	t.Run("waiters are granted round-robin by source", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			p, _, _ := testPool(8, 2)
			h1, _ := p.acquire(ctx, "hog", wait)
			h2, _ := p.acquire(ctx, "hog", wait)
			type grant struct {
				who string
				s   *slot
			}
			grants := make(chan grant, 8)
			waiter := func(who string) {
				go func() {
					if s, err := p.acquire(ctx, who, wait); err == nil {
						grants <- grant{who, s}
					}
				}()
				synctest.Wait() // queued before the next one
			}
			for range 5 { // the hog queues five requests first
				waiter("hog")
			}
			waiter("honest")
			h1.release()
			synctest.Wait()
			g1 := <-grants
			h2.release()
			synctest.Wait()
			g2 := <-grants
			if g1.who != "hog" || g2.who != "honest" {
				t.Fatalf("granted %s then %s; want hog, then honest (not behind the hog's four others)", g1.who, g2.who)
			}
			g1.s.release()
			g2.s.release()
			for range 4 { // the hog's other waiters, one release at a time
				synctest.Wait()
				(<-grants).s.release()
			}
			if n, sources := p.stats(); n != 0 || sources != 0 {
				t.Fatalf("all released: %d held, %d sources tracked", n, sources)
			}
		})
	})
}

// TestSourceOf: a caller's source is its TCP peer's address without the port.
func TestSourceOf(t *testing.T) {
	for in, want := range map[string]string{
		"192.0.2.7:50123":         "192.0.2.7",
		"[::ffff:192.0.2.7]:1":    "192.0.2.7",
		"[2001:db8::1]:443":       "2001:db8::1",
		"[fe80::1%eth0]:443":      "fe80::1",
		"not an address":          "not an address",
		"host.example:8443":       "host.example",
		"[2001:db8::1%zone]:8443": "2001:db8::1",
	} {
		if got := sourceOf(in); got != want {
			t.Errorf("sourceOf(%q) = %q, want %q", in, got, want)
		}
	}
}

// TestConnectionCapCoversTheSlots: the per-host cap is the default where the slots fit in it, and
// grows with slots that do not.
func TestConnectionCapCoversTheSlots(t *testing.T) {
	for _, c := range []struct {
		opts Options
		want int
	}{
		{Options{}, DefaultMaxUpstreamConns},
		{Options{MaxFetches: 300, MaxAuthorizations: 100}, 400},
		{Options{MaxFetches: 8, MaxAuthorizations: 4, MaxUpstreamConns: 12}, 12},
	} {
		c.opts.Upstream = "https://registry.example"
		r, err := New(c.opts)
		if err != nil {
			t.Fatal(err)
		}
		if got := r.transport.MaxConnsPerHost; got != c.want {
			t.Errorf("%+v: MaxConnsPerHost %d, want %d", c.opts, got, c.want)
		}
		r.Close()
	}
}
