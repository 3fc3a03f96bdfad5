package faults

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/netip"
	"runtime"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"code.foss.global/serve.zone/relay/contracts"
	"code.foss.global/serve.zone/relay/internal/sim"
	"code.foss.global/serve.zone/relay/relay"
)

// TestFaultHostileLoad is SPEC §15's proof. The relay binary runs as a process of its own; 100
// registered nodes carry traffic both ways through it and escrow holds a run for each. After a
// calm phase, anonymous peers attack from hundreds of loopback source addresses: they open as many
// connections as the relay allows, replay every input of the fuzz corpora (the envelope decoder's
// and the contracts readers') as frames and never read the answers, flood registrations, and hold
// idle HTTP connections. The figures: the relay's peak heap against its peer memory budget (goal:
// budget + 64 MiB), the nodes' p99 during the attack against the calm phase (goal: +10 %; the short
// form allows more, see p99Slack), requests lost, escrowed runs lost, relay restarts (goals: 0).
func TestFaultHostileLoad(t *testing.T) {
	const nodeCount = 100
	// The short form's budget is small, so that a few seconds of hoarding press it.
	budget := size(int64(16<<20), int64(relay.DefaultPeerMemoryBytes))
	calm, sustain := size(3*time.Second, 30*time.Second), size(5*time.Second, 60*time.Second)
	f := figures{fault: fmt.Sprintf("hostile anonymous peers, budget %d MiB", budget>>20), nodes: nodeCount}
	var h hostile
	h.budget = budget
	base := runtime.NumGoroutine()
	func() {
		bin := buildRelay(t)
		cloudly, err := sim.NewCloudly(zerolog.Nop())
		if err != nil {
			t.Fatal(err)
		}
		defer cloudly.Close()
		sim.ServeIngress(cloudly) // Cloudly judges the attackers' ingress registrations as Cloudly does
		rp := startRelay(t, bin, cloudly, true, "--peer-memory-bytes", strconv.FormatInt(budget, 10))
		a := newAttack(rp.listen, budget, corpus(t))

		nodes, renewals := connectNodes(t, rp.url(), nodeCount)
		defer func() {
			for _, n := range nodes {
				n.Close()
			}
		}()
		holdEscrow(t, cloudly, nodes)

		sampler := sample(rp)
		var ta tally
		var lat latencies
		stopTraffic := make(chan struct{})
		traffic := honestTraffic(nodes, cloudly, &ta, &lat, stopTraffic)

		time.Sleep(time.Second) // warm up
		lat.phase.Store(phaseCalm)
		time.Sleep(calm)

		lat.phase.Store(phaseAttack)
		attackStart := time.Now()
		a.start()
		select {
		case <-a.filled:
			h.fillTime = time.Since(attackStart)
		case <-time.After(size(30*time.Second, 60*time.Second)):
			t.Errorf("the holders never had their connections (%d held)", a.held.Load())
		}
		// The hoarders take their places (each source's limit) before the attack is sustained.
		waitFor(size(10*time.Second, 120*time.Second), func() bool { return a.hoarded.Load() >= int64(a.hoarderSources*a.perSource) })
		h.hoardTime = time.Since(attackStart)
		time.Sleep(sustain)
		// Every corpus frame is read by the relay at least once before the attack ends.
		waitFor(size(30*time.Second, 120*time.Second), a.allDelivered)
		lat.phase.Store(phaseAfter)
		if wait := 12*time.Second - time.Since(attackStart); wait > 0 {
			time.Sleep(wait) // the idle HTTP connections' header timeout (10 s) has passed
		}
		h.httpOpen, h.httpTotal = a.httpStillOpen()
		a.stop()
		h.attack = a.summary()
		h.everyFrame = a.allDelivered()
		close(stopTraffic)
		traffic.Wait()
		f.take(&ta, t)

		// The relay let go of everything the attack made it hold.
		waitFor(15*time.Second, func() bool {
			m, err := rp.metrics()
			return err == nil && m["relay_downstream_budget_used_bytes"] == 0 && m["relay_downstream_connections"] == nodeCount
		})
		m, err := rp.metrics()
		if err != nil {
			t.Fatalf("scrape after the attack: %v", err)
		}
		h.after = m
		h.samples = sampler.stop()
		h.restarts = int(m["relay_upstream_attaches_total"]) - 1
		if rp.hasExited() {
			h.restarts++
			t.Errorf("the relay exited: %v\n%s", rp.exitErr, rp.lastLines())
		}
		h.heldRuns = int(m["relay_escrow_runs_held"])

		// Escrow: Cloudly goes away; every node gets the renewal of its current window.
		cloudly.SetAvailable(false)
		waitFor(15*time.Second, func() bool { return released(renewals) == nodeCount })
		h.released = released(renewals)
		h.heapPeak, h.heapLive, h.gcs, h.rss = max(rp.heapPeak.Load(), int64(h.samples.heap)), rp.heapLive.Load(), rp.gcs.Load(), rp.vmHWM()
		f.socketsDropped = dropped(nodes)
		if err := rp.stop(); err != nil {
			t.Errorf("the relay's exit after SIGTERM: %v", err)
		}
		for _, v := range cloudly.Violations() {
			t.Errorf("the relay broke Cloudly's order: %s", v)
		}
		for _, n := range nodes {
			for _, v := range n.Violations() {
				t.Errorf("the relay sent %s what no relay may send: %s", n.ID, v)
			}
		}
		h.calm, h.attacked = lat.p99(phaseCalm), lat.p99(phaseAttack)
		h.calmN, h.attackedN = lat.count(phaseCalm), lat.count(phaseAttack)
	}()
	f.leaked = leakedAfter(t, base)
	f.extra = h.String()
	f.check(t)
	if f.refusedByName != 0 {
		t.Errorf("registered nodes were refused %d times", f.refusedByName)
	}
	h.check(t, nodeCount)
}

// p99Slack is the p99 goal: during the attack at most this much above the calm phase. The long
// form holds SPEC's +10 %. The short form runs inside `go test -race ./...` on a shared 2-core
// machine, where the attackers and the simulated peers (this process, under the race detector)
// and the relay share two cores with whatever else runs: a ratio there measures the machine. It
// only checks that the nodes are still served: p99 at most 2 s above the calm phase's.
func p99Slack(calm time.Duration) time.Duration {
	if long() {
		return calm * 11 / 10
	}
	return calm + 2*time.Second
}

// hostile is the fault's own figures.
type hostile struct {
	budget             int64
	heapPeak, rss      int64
	gcs                int64
	samples            samples
	calm, attacked     time.Duration
	calmN, attackedN   int
	heldRuns, released int
	restarts           int
	httpOpen           int
	httpTotal          int
	fillTime           time.Duration // until the holders met the relay's limit
	hoardTime          time.Duration // until the hoarders had taken their places
	heapLive           int64         // the largest live heap a GC reported
	attack             string
	everyFrame         bool // the relay read every corpus frame at least once
	after              map[string]float64
}

func (h hostile) String() string {
	return fmt.Sprintf("peak heap %d MiB (goal ≤ %d MiB; live at most %d MiB; %d GCs; peak RSS %d MiB; budget used at most %.1f MiB); "+
		"p99 %s calm (%d requests) → %s attacked (%d requests), %+.0f %%; escrowed runs held %d, released %d; "+
		"relay restarts %d; idle HTTP connections still open %d of %d; limit met after %s, hoarders in place after %s; %s; after: %.0f evictions, %.0f refusals, %.0f underflows",
		h.heapPeak>>20, (h.budget+64<<20)>>20, h.heapLive>>20, h.gcs, h.rss>>20, h.samples.budget/(1<<20),
		h.calm.Round(10*time.Microsecond), h.calmN, h.attacked.Round(10*time.Microsecond), h.attackedN,
		100*(float64(h.attacked)/float64(max(h.calm, 1))-1), h.heldRuns, h.released, h.restarts, h.httpOpen, h.httpTotal,
		h.fillTime.Round(time.Millisecond), h.hoardTime.Round(time.Millisecond), h.attack,
		h.after["relay_downstream_budget_evictions_total"], h.after["relay_downstream_budget_refusals_total"],
		h.after["relay_downstream_budget_underflows_total"])
}

func (h hostile) check(t *testing.T, nodes int) {
	t.Helper()
	if goal := h.budget + 64<<20; h.heapPeak > goal {
		t.Errorf("the relay's heap peaked at %d MiB, above the budget + 64 MiB (%d MiB)", h.heapPeak>>20, goal>>20)
	}
	if h.calmN == 0 || h.attackedN == 0 {
		t.Errorf("no requests measured (%d calm, %d attacked)", h.calmN, h.attackedN)
	} else if goal := p99Slack(h.calm); h.attacked > goal {
		t.Errorf("the nodes' p99 rose from %s to %s under the attack (goal ≤ %s)", h.calm, h.attacked, goal)
	}
	if h.heldRuns != nodes {
		t.Errorf("escrow holds %d runs after the attack, want %d", h.heldRuns, nodes)
	}
	if h.released != nodes {
		t.Errorf("%d of %d nodes got their escrowed renewal when the relay detached", h.released, nodes)
	}
	if h.restarts != 0 {
		t.Errorf("%d relay restarts", h.restarts)
	}
	if h.httpOpen != 0 {
		t.Errorf("%d of %d idle HTTP connections still open", h.httpOpen, h.httpTotal)
	}
	if u := h.after["relay_downstream_budget_underflows_total"]; u != 0 {
		t.Errorf("%v budget underflows", u)
	}
	if !h.everyFrame {
		t.Errorf("the relay did not read every corpus frame: the attack was cut short")
	}
}

func waitFor(d time.Duration, cond func() bool) {
	for deadline := time.Now().Add(d); !cond() && time.Now().Before(deadline); {
		time.Sleep(50 * time.Millisecond)
	}
}

// connectNodes connects and registers n simulated nodes, each counting the renewals escrow
// releases to it.
func connectNodes(t *testing.T, url string, n int) ([]*sim.Node, []*sim.RenewalCounter) {
	t.Helper()
	nodes, renewals := make([]*sim.Node, n), make([]*sim.RenewalCounter, n)
	var wg sync.WaitGroup
	errs := make(chan error, n)
	sem := make(chan struct{}, 16)
	for i := range nodes {
		nodes[i] = sim.NewNode(fmt.Sprintf("node-%03d", i), zerolog.Nop())
		renewals[i] = sim.CountRenewals(nodes[i])
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			if err := nodes[i].Connect(ctx, url); err != nil {
				errs <- err
				return
			}
			if _, err := nodes[i].Register(ctx); err != nil {
				errs <- fmt.Errorf("register %s: %w", nodes[i].ID, err)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	return nodes, renewals
}

// holdEscrow has Cloudly hold a run of 32 renewals for every node: 15-minute-style windows shrunk
// to 15 s every 10 s, the first one current now, so that one is due whenever the relay detaches
// within the next five minutes.
func holdEscrow(t *testing.T, cloudly *sim.Cloudly, nodes []*sim.Node) {
	t.Helper()
	start := time.Now()
	for _, n := range nodes {
		body, err := sim.EscrowRun{Session: n.Session(), Start: start, Count: 32, Step: 10 * time.Second, Window: 15 * time.Second}.Request()
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		_, err = cloudly.Call(ctx, contracts.MethodHoldRuntimeNetworkDnsLeaseRenewals, body)
		cancel()
		if err != nil {
			t.Fatalf("hold %s: %v", n.ID, err)
		}
	}
}

func released(renewals []*sim.RenewalCounter) int {
	n := 0
	for _, r := range renewals {
		if r.Admitted() > 0 {
			n++
		}
	}
	return n
}

// The phases a request is counted in, by when it was sent.
const (
	phaseWarm int32 = iota
	phaseCalm
	phaseAttack
	phaseAfter
)

// latencies are the nodes' request round trips by phase.
type latencies struct {
	phase atomic.Int32
	mu    sync.Mutex
	by    [4][]time.Duration // guarded by mu
}

func (l *latencies) add(phase int32, d time.Duration) {
	l.mu.Lock()
	l.by[phase] = append(l.by[phase], d)
	l.mu.Unlock()
}

func (l *latencies) count(phase int32) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.by[phase])
}

func (l *latencies) p99(phase int32) time.Duration {
	l.mu.Lock()
	d := slices.Clone(l.by[phase])
	l.mu.Unlock()
	if len(d) == 0 {
		return 0
	}
	slices.Sort(d)
	return d[len(d)*99/100]
}

// honestTraffic has every node report to Cloudly and Cloudly read from every node, each every
// 100 ms, until stop is closed: 2 000 requests a second through the relay.
func honestTraffic(nodes []*sim.Node, cloudly *sim.Cloudly, ta *tally, lat *latencies, stop <-chan struct{}) *sync.WaitGroup {
	var wg sync.WaitGroup
	loop := func(call func(ctx context.Context, i int) error) {
		defer wg.Done()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			case <-time.After(100 * time.Millisecond):
			}
			phase, start := lat.phase.Load(), time.Now()
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			err := call(ctx, i)
			cancel()
			ta.add(err)
			if err == nil {
				lat.add(phase, time.Since(start))
			}
		}
	}
	for _, n := range nodes {
		wg.Add(2)
		go loop(func(ctx context.Context, i int) error {
			_, err := n.Report(ctx, "reportRuntimeAssignmentObservation", map[string]any{"i": i})
			return err
		})
		go loop(func(ctx context.Context, i int) error {
			body, _ := json.Marshal(map[string]any{"session": cloudly.Session(n.ID), "assignment": map[string]any{"sequence": i}})
			_, err := cloudly.Call(ctx, "readRuntimeAssignmentStats", body)
			return err
		})
	}
	return &wg
}

// samples are the highest values the relay's /metrics showed.
type samples struct{ heap, budget, connections float64 }

type sampler struct {
	stopc chan struct{}
	out   chan samples
}

// sample scrapes the relay every 100 ms until stop.
func sample(rp *relayProcess) *sampler {
	s := &sampler{stopc: make(chan struct{}), out: make(chan samples, 1)}
	go func() {
		var peak samples
		for {
			if m, err := rp.metrics(); err == nil {
				peak.heap = max(peak.heap, m["go_memstats_heap_alloc_bytes"])
				peak.budget = max(peak.budget, m["relay_downstream_budget_used_bytes"])
				peak.connections = max(peak.connections, m["relay_downstream_connections"])
			}
			select {
			case <-s.stopc:
				s.out <- peak
				return
			case <-time.After(100 * time.Millisecond):
			}
		}
	}()
	return s
}

func (s *sampler) stop() samples { close(s.stopc); return <-s.out }

// attack is the anonymous peers. Each kind has source addresses of its own (127.k.x.y) and uses
// at most the relay's per-source limit of each; the holders take whatever else the relay allows.
type attack struct {
	addr  string
	stopc chan struct{}
	wg    sync.WaitGroup

	perSource int // the relay's --max-unregistered-per-source
	// Source addresses per kind (newAttack), each used up to the per-source limit.
	hoarderSources, enderSources, flooderSources int

	filled chan struct{} // closed when the holders met the relay's connection limit
	held   atomic.Int64  // holders' connections open now
	peak   atomic.Int64  // the most the holders held at once

	// The frames, encoded: corpus frames the relay answers, 64 to a hoarder; junk requests in ten
	// amounts; an upgrade and a frame that ends its connection; bursts of registrations.
	hoardChunks, endFrames  [][]byte
	junk                    [10][]byte
	floods                  [4][]byte
	answered                int           // corpus frames the relay answers; ending ones follow them in frames
	frames                  []atomic.Bool // by index: read by the relay at least once
	framesSent, distinct    atomic.Int64  // corpus frames read by the relay; distinct ones
	hoarded, ended          atomic.Int64  // replay connections that held answers; that ended with a frame
	registrations, regConns atomic.Int64
	refused503, dialErrors  atomic.Int64
	httpConns               []httpIdle // set by start, read after stop
}

// The share of an unregistered connection's answers a hoarder makes the relay hold, at most four
// shares before the relay closes it for reading nothing.
const hoardPerConn = 4 * relay.AnonymousShare

// newAttack prepares the anonymous peers of a relay at addr with budget, and every frame they send
// (masked once: the relay does not judge a client's masking keys).
func newAttack(addr string, budget int64, inputs [][]byte) *attack {
	a := &attack{addr: addr, stopc: make(chan struct{}), filled: make(chan struct{}), perSource: relay.DefaultMaxUnregisteredPerSource}
	// Hoarders enough to hold four times the budget at four shares each (half the relay's
	// connections at most: the holders keep the rest).
	a.hoarderSources = min(int(4*budget/(hoardPerConn*int64(a.perSource))), relay.MaxUnregistered/2/a.perSource)
	a.hoarderSources -= a.hoarderSources % hoardWorkers
	a.enderSources, a.flooderSources = endWorkers, 2*floodWorkers

	answered, ending := replayFrames(inputs)
	a.answered = len(answered)
	a.frames = make([]atomic.Bool, len(answered)+len(ending))
	for lo := 0; lo < len(answered); lo += 64 {
		var chunk []byte
		for _, f := range answered[lo:min(lo+64, len(answered))] {
			chunk = appendFrame(chunk, opText, f)
		}
		a.hoardChunks = append(a.hoardChunks, chunk)
	}
	// Junk answers are about 580 bytes; the relay's kernel takes some 130 of them first (75 KiB,
	// more when its socket buffer has grown), then the relay holds up to four shares before it
	// closes a non-reader at its next request: hoarders stop anywhere from before the first share
	// to past the fourth.
	for l := range a.junk {
		for i := range 120 + 25*l {
			a.junk[l] = appendFrame(a.junk[l], opText, junkRequest(i))
		}
	}
	for _, f := range ending {
		a.endFrames = append(a.endFrames, appendFrame(upgradeRequest(), opText, f))
	}
	// As many registrations as a connection may send (8 node registrations with guessed
	// bearers), and more: 4 ingress registrations, 4 node ones.
	for v := range a.floods {
		for i := range 16 {
			id := fmt.Sprintf("node-guess-%d-%d", v, i)
			method, body := contracts.MethodRegisterPalletRuntimeSession, json.RawMessage(nil)
			if i >= 8 && i < 12 {
				method, body = contracts.MethodRegisterClusterIngress, sim.NewIngress(id, "guessed-bearer", zerolog.Nop()).RegistrationBody()
			} else {
				n := sim.NewNode(id, zerolog.Nop())
				n.Bearer = "guessed-bearer-" + strconv.Itoa(v)
				body = n.RegistrationBody()
			}
			a.floods[v] = appendFrame(a.floods[v], opText,
				fmt.Appendf(nil, `{"method":%q,"correlation":{"id":"r%d","phase":"request"},"request":%s}`, method, i, body))
		}
	}
	return a
}

// delivered records that the relay read corpus frame i.
func (a *attack) delivered(i int) {
	a.framesSent.Add(1)
	if !a.frames[i].Swap(true) {
		a.distinct.Add(1)
	}
}

// allDelivered reports whether the relay read every corpus frame at least once.
func (a *attack) allDelivered() bool { return a.distinct.Load() == int64(len(a.frames)) }

func (a *attack) stopped() bool {
	select {
	case <-a.stopc:
		return true
	default:
		return false
	}
}

func (a *attack) stop() {
	close(a.stopc)
	a.wg.Wait()
	for _, c := range a.httpConns {
		c.conn.Close()
	}
}

// start launches every kind of anonymous peer.
func (a *attack) start() {
	a.startHTTP()
	// Holders first: as many connections as the relay allows. The others use their own sources
	// and so find room once the holders have stepped back from the limit.
	reserve := (a.hoarderSources + a.enderSources + a.flooderSources) * a.perSource
	target, keep := holdShort, holdShort
	if long() {
		target, keep = relay.MaxUnregistered+1, relay.MaxUnregistered-reserve
	}
	a.go_(func() { a.hold(target, keep) })
	a.go_(func() {
		select {
		case <-a.filled:
		case <-a.stopc:
			return
		}
		var nextHoard, nextEnd atomic.Int64 // the next replay job of each kind, round and round
		for w := range hoardWorkers {
			a.go_(func() { a.hoard(w, &nextHoard) })
		}
		retry := make(chan int, 1<<16)
		for w := range endWorkers {
			a.go_(func() { a.end(w, &nextEnd, retry) })
		}
		for w := range floodWorkers {
			a.go_(func() { a.floodRegistrations(w) })
		}
	})
}

// holdShort is what the holders open in the short form: 64 source addresses' worth. The long form
// opens every connection the relay allows (relay.MaxUnregistered), which takes too long for CI
// under the race detector on a shared machine.
const holdShort = 4096

// The attackers' workers and their pace: each opens a connection every so often (or as fast as the
// relay upgrades them, when slower). The relay's CPU is what the attack costs the nodes; unpaced,
// the attackers (in this process, on the same cores) would measure this machine rather than the
// relay.
const (
	hoardWorkers, hoardEvery = 4, 20 * time.Millisecond  // 200 hoarding connections a second, ~250 requests each
	endWorkers, endEvery     = 16, 16 * time.Millisecond // 1 000 connections a second, each ended by a frame
	floodWorkers, floodEvery = 2, 20 * time.Millisecond  // 100 connections a second, 16 registrations each
)

// pace sleeps what is left of every after start.
func pace(start time.Time, every time.Duration) {
	if d := every - time.Since(start); d > 0 {
		time.Sleep(d)
	}
}

func (a *attack) go_(f func()) {
	a.wg.Add(1)
	go func() { defer a.wg.Done(); f() }()
}

// hold opens upgrades from fresh sources, each up to the per-source limit (where the relay answers
// 503), until target are open or the relay answers 503 on a source's first: its limit of
// unregistered connections in all. Then it steps back to keep, and keeps that many open,
// replacing those the relay closes (registration deadline, silence).
func (a *attack) hold(target, keep int) {
	var (
		mu    sync.Mutex
		conns []net.Conn // guarded by mu
		src   atomic.Int64
	)
	defer func() {
		for _, c := range conns {
			c.Close()
		}
		a.held.Store(0)
	}()
	// fill opens connections from fresh sources, 16 at a time, until want are open or the relay
	// refuses a fresh source's first upgrade: its limit of unregistered connections in all is met.
	fill := func(want int) {
		var limitMet atomic.Bool
		more := func() bool {
			mu.Lock()
			defer mu.Unlock()
			return len(conns) < want && !limitMet.Load() && !a.stopped()
		}
		var wg sync.WaitGroup
		for range 16 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for more() {
					n := src.Add(1)
					s := loopback(1, byte(n/250), byte(n%250+1))
					for i := 0; i < a.perSource && more(); i++ {
						c, err := upgrade(s, a.addr, false)
						if err != nil {
							if isRefused(err) {
								a.refused503.Add(1)
								limitMet.CompareAndSwap(false, i == 0)
							} else {
								a.dialErrors.Add(1)
							}
							break
						}
						mu.Lock()
						conns = append(conns, c)
						a.held.Store(int64(len(conns)))
						a.peak.Store(max(a.peak.Load(), int64(len(conns))))
						mu.Unlock()
					}
				}
			}()
		}
		wg.Wait()
	}
	fill(target)
	close(a.filled)
	for _, c := range conns[min(keep, len(conns)):] {
		c.Close()
	}
	conns = conns[:min(keep, len(conns))]
	a.held.Store(int64(len(conns)))
	for !a.stopped() {
		select {
		case <-a.stopc:
			return
		case <-time.After(time.Second):
		}
		conns = slices.DeleteFunc(conns, func(c net.Conn) bool {
			if peerClosed(c) {
				c.Close()
				return true
			}
			return false
		})
		a.held.Store(int64(len(conns)))
		fill(keep)
	}
}

// hoard replays the answered corpus frames, 64 to a connection, each followed by junk requests
// (between 1 and 4 shares' worth of answers: some connections stop below the point where the
// relay closes a non-reader, some go past it), on connections that never read and are kept open.
func (a *attack) hoard(w int, next *atomic.Int64) {
	queues := make([]fifo, a.hoarderSources/hoardWorkers)
	for i := range queues {
		queues[i].max = a.perSource
	}
	defer func() {
		for i := range queues {
			queues[i].closeAll()
		}
	}()
	for k := 0; !a.stopped(); k++ {
		start := time.Now()
		j := int(next.Add(1)-1) % len(a.hoardChunks)
		if a.send(loopback(2, byte(w), byte(k%len(queues)+1)), net.Buffers{a.hoardChunks[j], a.junk[k%len(a.junk)]}, true, false, &queues[k%len(queues)]) {
			for i := j * 64; i < min(j*64+64, a.answered); i++ {
				a.delivered(i)
			}
			a.hoarded.Add(1)
		}
		pace(start, hoardEvery)
	}
}

// end replays the corpus frames that end their connection, one to a connection: it sends the
// upgrade and the frame at once and shuts its side (so that the relay's close handshake ends at
// once instead of waiting 5 s for a close frame from a peer that reads nothing), never waiting for
// the relay. Whether the upgrade was accepted is looked at when the connection is closed, 64
// connections later; a frame whose upgrade was not is sent again.
func (a *attack) end(w int, next *atomic.Int64, retry chan int) {
	type sent struct {
		c     net.Conn
		frame int
	}
	queues := make([][]sent, a.enderSources/endWorkers)
	settle := func(s sent) {
		if upgraded(s.c) {
			a.delivered(s.frame)
			a.ended.Add(1)
		} else {
			select {
			case retry <- s.frame - a.answered:
			default:
			}
		}
		s.c.Close()
	}
	defer func() {
		time.Sleep(100 * time.Millisecond) // the last answers arrive
		for _, q := range queues {
			for _, s := range q {
				settle(s)
			}
		}
	}()
	for k := 0; !a.stopped(); k++ {
		start := time.Now()
		var j int
		select {
		case j = <-retry:
		default:
			j = int(next.Add(1)-1) % len(a.endFrames)
		}
		i := k % len(queues)
		if len(queues[i]) >= a.perSource {
			settle(queues[i][0])
			queues[i] = queues[i][1:]
		}
		c, err := dialFrom(loopback(3, byte(w), byte(i+1)), a.addr, false)
		if err != nil {
			a.dialErrors.Add(1)
			continue
		}
		c.SetWriteDeadline(time.Now().Add(5 * time.Second))
		c.Write(a.endFrames[j])
		c.(*net.TCPConn).CloseWrite()
		queues[i] = append(queues[i], sent{c, a.answered + j})
		pace(start, endEvery)
	}
}

// send upgrades a connection from source, writes buf and keeps the connection in q (which closes
// its oldest beyond the per-source limit). It reports whether buf was written.
// With said, it then shuts its sending side: the peer has said all it will.
func (a *attack) send(source netip.Addr, buf net.Buffers, narrow, said bool, q *fifo) bool {
	for attempt := 0; ; attempt++ {
		c, err := upgrade(source, a.addr, narrow)
		if err == nil {
			c.SetWriteDeadline(time.Now().Add(5 * time.Second))
			_, err = buf.WriteTo(c)
			if said {
				c.(*net.TCPConn).CloseWrite()
			}
			q.push(c)
			return err == nil
		}
		if isRefused(err) {
			a.refused503.Add(1)
		} else {
			a.dialErrors.Add(1)
		}
		if attempt == 3 || a.stopped() {
			return false
		}
		// At the per-source limit: the relay has not yet seen the oldest one go. Make room.
		if len(q.conns) > 0 {
			q.conns[0].Close()
			q.conns = q.conns[1:]
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// floodRegistrations sends, on each connection, as many registrations as one may (8 node
// registrations with guessed bearers) and more (4 ingress, 4 node), at once and never reading.
func (a *attack) floodRegistrations(w int) {
	queues := make([]fifo, a.flooderSources/floodWorkers)
	for i := range queues {
		queues[i].max = a.perSource
	}
	defer func() {
		for i := range queues {
			queues[i].closeAll()
		}
	}()
	for k := 0; !a.stopped(); k++ {
		start := time.Now()
		q := &queues[k%len(queues)]
		if a.send(loopback(4, byte(w), byte(k%len(queues)+1)), net.Buffers{a.floods[k%len(a.floods)]}, false, false, q) {
			a.regConns.Add(1)
			a.registrations.Add(16)
		}
		pace(start, floodEvery)
	}
}

// httpIdle is an HTTP connection an anonymous client keeps open.
type httpIdle struct {
	conn net.Conn
	kind string
}

// startHTTP opens idle HTTP connections: 100 that asked for / (426) and 100 for /v2/ (404, no
// registry forwarding), each reading its answer and then waiting to send another request on it;
// 50 that send nothing and 50 that stop inside their headers. The relay must close every one:
// the first ones with their answer, the others at its 10 s header timeout.
func (a *attack) startHTTP() {
	source := loopback(5, 0, 1)
	open := func(kind, send string, readAnswer bool) {
		c, err := dialFrom(source, a.addr, false)
		if err != nil {
			a.dialErrors.Add(1)
			return
		}
		io.WriteString(c, send)
		if readAnswer {
			c.SetReadDeadline(time.Now().Add(5 * time.Second))
			buf := make([]byte, 4096)
			c.Read(buf) // the answer; what follows (if anything) is read by httpStillOpen
			c.SetReadDeadline(time.Time{})
		}
		a.httpConns = append(a.httpConns, httpIdle{c, kind})
	}
	for range 100 {
		open("426", "GET / HTTP/1.1\r\nHost: relay\r\n\r\n", true)
		open("404", "GET /v2/ HTTP/1.1\r\nHost: relay\r\n\r\n", true)
	}
	for range 50 {
		open("silent", "", false)
		open("partial", "GET / HTTP/1.1\r\nHost: re", false)
	}
}

// httpStillOpen counts the idle HTTP connections the relay has not closed.
func (a *attack) httpStillOpen() (open, total int) {
	for _, c := range a.httpConns {
		if !peerClosed(c.conn) {
			open++
		}
	}
	return open, len(a.httpConns)
}

func (a *attack) summary() string {
	return fmt.Sprintf("attack: %d connections held at most (%d upgrades refused 503), %d corpus frames read by the relay (%d of %d distinct) "+
		"(%d hoarding connections, %d ended by a frame), %d registrations on %d connections",
		a.peak.Load(), a.refused503.Load(), a.framesSent.Load(), a.distinct.Load(), len(a.frames), a.hoarded.Load(), a.ended.Load(),
		a.registrations.Load(), a.regConns.Load())
}
