package faults

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/rs/zerolog"

	"code.foss.global/serve.zone/relay/contracts"
	"code.foss.global/serve.zone/relay/relay"
	"code.foss.global/serve.zone/relay/testenv/await"
	"code.foss.global/serve.zone/relay/testenv/sim"
)

// attack is the anonymous peers. Each kind has source addresses of its own (127.k.x.y) and uses
// at most the relay's per-source limit of each; the holders take whatever else the relay allows.
type attack struct {
	addr     string
	budget   int64
	mode     string       // RELAY_FAULTS_ATTACKERS: "" in this process, else in a child scheduled so
	child    *attackChild // the child running the attack (attacker_process_test.go), once started
	stopc    chan struct{}
	stopOnce sync.Once
	wg       sync.WaitGroup

	perSource int // the relay's --max-unregistered-per-source
	// Source addresses per kind (newAttack), each used up to the per-source limit.
	hoarderSources, enderSources, flooderSources int

	filled chan struct{} // closed when the holders have opened theirs (long form: met the relay's limit)
	held   atomic.Int64  // holders' connections open now
	peak   atomic.Int64  // the most the holders held at once

	// The frames, encoded: corpus frames the relay answers, 64 to a hoarder; junk requests in ten
	// amounts; an upgrade and a frame that ends its connection; bursts of registrations.
	hoardChunks, endFrames  [][]byte
	junk                    [10][]byte
	floods                  [4][]byte
	answered                int           // corpus frames the relay answers; ending ones follow them in frames
	frames                  []atomic.Bool // by index: taken by the relay at least once (read, or refused with its connection)
	framesSent, distinct    atomic.Int64  // corpus frames taken by the relay; distinct ones
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
	a := &attack{addr: addr, budget: budget, mode: attackersMode(), stopc: make(chan struct{}), filled: make(chan struct{}),
		perSource: relay.DefaultMaxUnregisteredPerSource}
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

// delivered records that the relay took corpus frame i: read it, or closed the connection that
// carried it (send).
func (a *attack) delivered(i int) {
	a.framesSent.Add(1)
	if !a.frames[i].Swap(true) {
		a.distinct.Add(1)
	}
}

// allDelivered reports whether the relay took every corpus frame at least once.
func (a *attack) allDelivered() bool { return a.distinct.Load() == int64(len(a.frames)) }

func (a *attack) stopped() bool {
	select {
	case <-a.stopc:
		return true
	default:
		return false
	}
}

// stop ends every attacker and closes their connections; it may be called again.
func (a *attack) stop() {
	a.stopOnce.Do(func() {
		close(a.stopc)
		if a.child != nil {
			a.stopChild()
			return
		}
		a.wg.Wait()
		for _, c := range a.httpConns {
			c.conn.Close()
		}
	})
}

// start launches every kind of anonymous peer.
func (a *attack) start() {
	if a.mode != "" {
		a.startChild(a.mode)
		return
	}
	a.startHTTP()
	// Holders first: as many connections as the relay allows. The others use their own sources
	// and so find room once the holders have stepped back from the limit.
	reserve := (a.hoarderSources + a.enderSources + a.flooderSources) * a.perSource
	target, keep := holdShort, holdShort
	if long() {
		target, keep = relay.MaxUnregistered+1, relay.MaxUnregistered-reserve
	}
	a.spawn(func() { a.hold(target, keep, reserve) })
	a.spawn(func() {
		select {
		case <-a.filled:
		case <-a.stopc:
			return
		}
		var nextHoard, nextEnd atomic.Int64 // the next replay job of each kind, round and round
		for w := range hoardWorkers {
			a.spawn(func() { a.hoard(w, &nextHoard) })
		}
		retry := make(chan int, 1<<16)
		for w := range endWorkers {
			a.spawn(func() { a.end(w, &nextEnd, retry) })
		}
		for w := range floodWorkers {
			a.spawn(func() { a.floodRegistrations(w) })
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
	hoardWorkers, hoardEvery = 8, 40 * time.Millisecond  // 200 hoarding connections a second, ~230 requests each
	endWorkers, endEvery     = 16, 16 * time.Millisecond // 1 000 connections a second, each ended by a frame
	floodWorkers, floodEvery = 2, 20 * time.Millisecond  // 100 connections a second, 16 registrations each
)

// pace sleeps what is left of every after start.
func pace(start time.Time, every time.Duration) {
	if d := every - time.Since(start); d > 0 {
		time.Sleep(d) // the attack's rate: its shape
	}
}

func (a *attack) spawn(f func()) {
	a.wg.Add(1)
	go func() { defer a.wg.Done(); f() }()
}

// hold opens upgrades from fresh sources, each up to the per-source limit (where the relay answers
// 503), until target are open or the relay answers 503 on a source's first: its limit of
// unregistered connections in all. Then it steps back to keep, and keeps that many open,
// replacing those the relay closes (registration deadline, silence).
func (a *attack) hold(target, keep, reserve int) {
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
	if got := len(conns); got < keep+reserve {
		// The relay's limit (its connection count, or the budget its connections' own cost is
		// charged to) met before target: leave the other attackers room, at least half of it.
		keep = max(got-reserve, got/2)
	}
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

// fifos is one connection queue per source a worker sends from, each closing its oldest beyond
// the per-source limit; closeFifos closes what they still hold.
func (a *attack) fifos(sources int) []fifo {
	queues := make([]fifo, sources)
	for i := range queues {
		queues[i].max = a.perSource
	}
	return queues
}

func closeFifos(queues []fifo) {
	for i := range queues {
		queues[i].closeAll()
	}
}

// hoard replays the answered corpus frames, 64 to a connection, each followed by junk requests
// (between 1 and 4 shares' worth of answers: some connections stop below the point where the
// relay closes a non-reader, some go past it), on connections that never read and are kept open.
func (a *attack) hoard(w int, next *atomic.Int64) {
	queues := a.fifos(a.hoarderSources / hoardWorkers)
	defer closeFifos(queues)
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
		// The last answers arrive: every connection still queued has its answer or its end to
		// read, or a second has passed.
		await.Within(time.Second, func() bool {
			for _, q := range queues {
				for _, s := range q {
					if !answeredOrEnded(s.c) {
						return false
					}
				}
			}
			return true
		})
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
		// Each connection from the next of 250 addresses: under load the relay admits 16 at once
		// and 4 a second from one address, and every ending frame must reach it in the attack's
		// few seconds; an attacker with many addresses is the one the bucket cannot stop.
		c, err := dialFrom(loopback(3, byte(w), byte(1+k%250)), a.addr, false)
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
// its oldest beyond the per-source limit). It reports whether the relay took buf: it was written
// whole, or the relay closed the connection while it was written — under load the relay closes an
// unregistered connection at its first message it would refuse, reading nothing more, and that is
// its answer to the rest. With said, it then shuts its sending side: the peer has said all it will.
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
			return err == nil || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)
		}
		if isRefused(err) {
			a.refused503.Add(1)
		} else {
			a.dialErrors.Add(1)
		}
		if attempt == 3 || a.stopped() {
			return false
		}
		// At the per-source limit: the relay has not yet seen the oldest one go. Make room, and
		// wait for the relay to end its side, which it does as it lets the connection go.
		if len(q.conns) > 0 {
			closeSeen(q.conns[0])
			q.conns = q.conns[1:]
		}
	}
}

// floodRegistrations sends, on each connection, as many registrations as one may (8 node
// registrations with guessed bearers) and more (4 ingress, 4 node), at once and never reading.
func (a *attack) floodRegistrations(w int) {
	queues := a.fifos(a.flooderSources / floodWorkers)
	defer closeFifos(queues)
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

// httpStillOpen counts the idle HTTP connections the relay has not closed, and names their kinds.
func (a *attack) httpStillOpen() (open, total int, kinds map[string]int) {
	if a.child != nil {
		return a.childHTTP()
	}
	kinds = map[string]int{}
	for _, c := range a.httpConns {
		if !peerClosed(c.conn) {
			open++
			kinds[c.kind]++
		}
	}
	return open, len(a.httpConns), kinds
}

func (a *attack) summary() string {
	if a.child != nil {
		return a.childSummary()
	}
	return fmt.Sprintf("attack: %d connections held at most (%d upgrades refused 503), %d corpus frames taken by the relay (%d of %d distinct) "+
		"(%d hoarding connections, %d ended by a frame), %d registrations on %d connections",
		a.peak.Load(), a.refused503.Load(), a.framesSent.Load(), a.distinct.Load(), len(a.frames), a.hoarded.Load(), a.ended.Load(),
		a.registrations.Load(), a.regConns.Load())
}

// closeSeen ends the sending side of c, reads what the relay still sends until it closes its own
// side (at most 5 s), then closes c: the relay has let the connection go.
func closeSeen(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		tc.CloseWrite()
	}
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	io.Copy(io.Discard, c)
	c.Close()
}
