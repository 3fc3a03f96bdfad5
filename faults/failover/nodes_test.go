package failover

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"

	"code.foss.global/serve.zone/relay/testenv/sim"
)

// requestPace is how often a driven node sends a request through the relay.
const requestPace = 20 * time.Millisecond

// fleet is simulated nodes driven through the Service as Pallet nodes behave: each keeps a
// connection (dialling again, 50 ms apart, when it has none or it ended), registers on every new
// connection with its byte-identical registration, and sends a request every requestPace. Every
// refused request and failed dial is counted; runs of them are the windows in which the node's
// requests were refused.
type fleet struct {
	url   string // the Service stand-in
	nodes []*drivenNode
	stop  chan struct{}
	wg    sync.WaitGroup
}

// drivenNode is one node of a fleet. Its counters and windows are written by its own goroutine.
type drivenNode struct {
	n        *sim.Node
	renewals *sim.RenewalCounter // every DNS lease renewal pushed to it

	ok, refused atomic.Int64

	mu      sync.Mutex
	since   time.Time      // guarded by mu: when the current run of refusals began; zero: none
	windows []window       // guarded by mu: ended runs of refusals
	lastOK  time.Time      // guarded by mu: the newest answered request
	reasons map[string]int // guarded by mu: refusals by their text, first 40 characters
}

// window is one run of refused requests: from the first refusal to the next answered request.
type window struct{ from, to time.Time }

func (w window) length() time.Duration { return w.to.Sub(w.from) }

// startFleet drives n nodes, node-00… , through url until stop.
func startFleet(url string, n int) *fleet {
	f := &fleet{url: url, stop: make(chan struct{})}
	for i := range n {
		d := &drivenNode{n: sim.NewNode(fmt.Sprintf("node-%02d", i), zerolog.Nop()), reasons: map[string]int{}}
		d.renewals = sim.RecordRenewals(d.n)
		f.nodes = append(f.nodes, d)
		f.wg.Add(1)
		go func() { defer f.wg.Done(); d.drive(url, f.stop) }()
	}
	return f
}

// close stops every node and closes its connection.
func (f *fleet) close() {
	select {
	case <-f.stop:
	default:
		close(f.stop)
	}
	f.wg.Wait()
	for _, d := range f.nodes {
		d.n.Close()
	}
}

func (d *drivenNode) drive(url string, stop <-chan struct{}) {
	for i := 0; ; i++ {
		select {
		case <-stop:
			return
		default:
		}
		if c := d.n.Conn(); c == nil || c.Context().Err() != nil {
			if err := d.connect(url); err != nil {
				d.fail(err)
				pause(context.Background(), 50*time.Millisecond) // a node backs off before it dials again
				continue
			}
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_, err := d.n.Report(ctx, "reportRuntimeAssignmentObservation", map[string]any{"i": i})
		cancel()
		if err != nil {
			d.fail(err)
		} else {
			d.answered()
		}
		pause(context.Background(), requestPace)
	}
}

// connect dials the Service and registers, as a node does on every new connection.
func (d *drivenNode) connect(url string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	d.n.Close()
	if err := d.n.Connect(ctx, url); err != nil {
		return err
	}
	if _, err := d.n.Register(ctx); err != nil {
		d.n.Close()
		return fmt.Errorf("register: %w", err)
	}
	return nil
}

func (d *drivenNode) fail(err error) {
	d.refused.Add(1)
	now := time.Now()
	text := err.Error()
	if len(text) > 40 {
		text = text[:40]
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.since.IsZero() {
		d.since = now
	}
	d.reasons[text]++
}

func (d *drivenNode) answered() {
	d.ok.Add(1)
	now := time.Now()
	d.mu.Lock()
	defer d.mu.Unlock()
	if !d.since.IsZero() {
		d.windows = append(d.windows, window{d.since, now})
		d.since = time.Time{}
	}
	d.lastOK = now
}

// answeredSince reports whether the node has had a request answered after t.
func (d *drivenNode) answeredSince(t time.Time) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.lastOK.After(t)
}

// allAnsweredSince reports whether every node has had a request answered after t.
func (f *fleet) allAnsweredSince(t time.Time) bool {
	for _, d := range f.nodes {
		if !d.answeredSince(t) {
			return false
		}
	}
	return true
}

// refusedWindow is the longest run of refusals of any node that ended after t: how long node
// requests were refused across an event at t.
func (f *fleet) refusedWindow(t time.Time) time.Duration {
	var longest time.Duration
	for _, d := range f.nodes {
		d.mu.Lock()
		for _, w := range d.windows {
			if w.to.After(t) {
				longest = max(longest, w.length())
			}
		}
		d.mu.Unlock()
	}
	return longest
}

// reasons sums why requests were refused, for a failure's message.
func (f *fleet) reasons() map[string]int {
	out := map[string]int{}
	for _, d := range f.nodes {
		d.mu.Lock()
		for k, v := range d.reasons {
			out[k] += v
		}
		d.mu.Unlock()
	}
	return out
}
