package sim

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"
	"golang.org/x/sync/errgroup"

	"code.foss.global/serve.zone/relay/contracts"
)

// Counts are what the simulated peers observed during a scenario: answers they received, not the
// relay's own counters.
type Counts struct {
	Nodes          int64 // nodes whose registration was accepted
	Requests       int64 // requests answered end to end, both directions
	VPNPackets     int64 // packets delivered between VPN clients
	EscrowReleased int64 // DNS lease renewals nodes admitted from escrow
	// OutageReleased is how many of them nodes admitted since the latest outage began: once it
	// reaches the nodes' number in an outage, every node has had the renewal current at the cut.
	OutageReleased int64
	RouteTables    int64 // route tables the ingress received
	Restores       int64 // isolated restores completed end to end
	Streams        int64 // VirtualStreams received whole, both directions
	Outages        int64 // times Cloudly went away
	Recoveries     int64 // outages after which the relay re-attached and every node registered again
	// The platform agent's, as the first node's Corestore saw them.
	PlatformStates   int64 // desired states it took
	Backups          int64 // backups Cloudly accepted, and the relay said so
	PlatformRestores int64 // database restores it took whole
}

// Summary is the one line `relay-dev` ends with.
func (c Counts) Summary() string {
	return fmt.Sprintf("nodes=%d requests=%d vpnPackets=%d escrowReleased=%d routeTables=%d restores=%d streams=%d outages=%d recoveries=%d"+
		" platformStates=%d backups=%d platformRestores=%d",
		c.Nodes, c.Requests, c.VPNPackets, c.EscrowReleased, c.RouteTables, c.Restores, c.Streams, c.Outages, c.Recoveries,
		c.PlatformStates, c.Backups, c.PlatformRestores)
}

// Timing is the scenario's cycle: traffic while the relay is attached, a Cloudly outage, the
// recovery, again. Zero fields take the defaults.
type Timing struct {
	FirstAttached time.Duration // traffic before the first outage (default 2 s)
	Attached      time.Duration // traffic from a recovery to the next outage (default 15 s)
	Outage        time.Duration // how long Cloudly stays away (default 4 s)
}

// WithDefaults is t with its zero fields set to the defaults.
func (t Timing) WithDefaults() Timing {
	if t.FirstAttached <= 0 {
		t.FirstAttached = 2 * time.Second
	}
	if t.Attached <= 0 {
		t.Attached = 15 * time.Second
	}
	if t.Outage <= 0 {
		t.Outage = 4 * time.Second
	}
	return t
}

// Scenario drives real traffic through a relay with every simulated peer: nodes register, report
// to Cloudly and answer its pushes; the ingress registers and receives route tables; a Corestore
// runs isolated restores; and again and again Cloudly holds DNS lease renewals, goes away and
// comes back (cycles). Build it with NewScenario before the relay starts (Cloudly must know the
// Corestore when the relay attaches), then Run it.
//
// It keeps counts, never bodies: it can run for as long as anyone likes.
type Scenario struct {
	Cloudly *Cloudly
	Log     zerolog.Logger
	// Timing is the outage cycle; set before Run.
	Timing Timing
	// Story, when set before Run, is told each turn of the cycle in a line of its own: attached,
	// an outage, Cloudly back, the recovery. It is called from one goroutine, in order.
	Story func(line string)

	nodes     int
	corestore *Corestore
	authority *RestoreAuthority
	ingress   *IngressControl

	requests, restores atomic.Int64
	streams            atomic.Int64
	registered         atomic.Int64
	in                 atomic.Pointer[Ingress]
	renewals           atomic.Pointer[[]*RenewalCounter] // published by Run before any traffic
	live               atomic.Pointer[[]*Node]           // published by Run before any traffic
	outages            atomic.Int64
	outageFrom         atomic.Int64 // released() as the latest outage began
	recoveries         atomic.Int64
	vpn                []*VPNNode // set by Run before any traffic
	vpnJoined          atomic.Bool

	// The relay's VPN hub, where the nodes dial it; unset: no VPN traffic.
	HubAddr netip.AddrPort
	HubKey  [32]byte
}

// The ingress runs on the first node; its bearer is the simulator's own.
const (
	scenarioIngressBearer = "sim-ingress-bearer"
	scenarioNodeName      = "node-000.sim"
)

// NewScenario prepares n nodes, a Corestore for the first one, and Cloudly's side of the ingress.
func NewScenario(n int, cloudly *Cloudly, log zerolog.Logger) (*Scenario, error) {
	auth, err := NewRestoreAuthority()
	if err != nil {
		return nil, err
	}
	s := &Scenario{Cloudly: cloudly, Log: log, nodes: n, authority: auth}
	s.corestore = NewCorestore(CorestoreOptions{ClusterID: cloudly.ClusterID, NodeName: scenarioNodeName,
		Authority: auth.PublicKey(), Plaintext: true, Log: log})
	cloudly.SetCorestores([]contracts.CorestoreOrigin{{NodeID: nodeName(0), Origin: s.corestore.Origin()}})
	s.preparePlatform()
	s.ingress = ServeIngress(cloudly)
	s.ingress.Designate(nodeName(0), scenarioIngressBearer)
	return s, nil
}

// The platform agent's part of the scenario: the first node's Corestore has a binding in Cloudly's
// desired state, always one 64 KiB backup ready and one restore wanted (four ids, reused), and
// Cloudly pushes its credential after every enrollment.
const (
	scenarioCorestoreCredential = "sim-corestore-credential-node-000"
	scenarioClosureBytes        = 64 << 10
	scenarioClosureIDs          = 4
)

func (s *Scenario) preparePlatform() {
	pc, cl := s.corestore.Platform(), s.Cloudly.Platform()
	pc.SetBearer(scenarioCorestoreCredential)
	cl.SetCredential(nodeName(0), scenarioCorestoreCredential)
	cl.SetDesiredState(json.RawMessage(`{"capabilities":{"corestore-inventory":true},"providerConfigs":[],"bindings":[` +
		`{"nodeId":"` + nodeName(0) + `","binding":{"serviceId":"svc-sim","engine":"postgres"}}]}`))
	for i := range scenarioClosureIDs {
		cl.ServeRestore(fmt.Sprintf("sim-restore-%d", i), RestoreSource{Size: scenarioClosureBytes})
	}
	var backups, restores atomic.Int64
	pc.AddBackup("sim-backup-0", PlatformClosure{ServiceID: "svc-sim", Size: scenarioClosureBytes})
	pc.WantRestore("sim-restore-0", "svc-sim")
	pc.Refill(func(p *PlatformCorestore) {
		if d := p.Delivered(); d > backups.Load() {
			backups.Store(d)
			p.AddBackup(fmt.Sprintf("sim-backup-%d", d%scenarioClosureIDs), PlatformClosure{ServiceID: "svc-sim", Size: scenarioClosureBytes})
		}
		if n := p.Settled(); n > restores.Load() {
			restores.Store(n)
			p.WantRestore(fmt.Sprintf("sim-restore-%d", n%scenarioClosureIDs), "svc-sim")
		}
	})
}

// Close stops the Corestore.
func (s *Scenario) Close() { s.corestore.Close() }

func nodeName(i int) string { return fmt.Sprintf("node-%03d", i) }

// StreamBytesKept is the memory the simulated peers hold, by design, of streams' bytes (Cloudly's
// and every node's, sim.Node.StreamBytesKept): a stream an outage cut stays with its node until
// its writer has been silent for a minute, and a loaded machine's outages cut more of them.
func (s *Scenario) StreamBytesKept() int64 {
	kept := s.Cloudly.StreamBytesKept()
	if nodes := s.live.Load(); nodes != nil {
		for _, n := range *nodes {
			kept += n.StreamBytesKept()
		}
	}
	return kept
}

// Snapshot reads the counts so far.
func (s *Scenario) Snapshot() Counts {
	c := Counts{Nodes: s.registered.Load(), Requests: s.requests.Load(), Restores: s.restores.Load(), Streams: s.streams.Load(),
		Outages: s.outages.Load(), Recoveries: s.recoveries.Load(), EscrowReleased: s.released()}
	c.OutageReleased = c.EscrowReleased - s.outageFrom.Load()
	if in := s.in.Load(); in != nil {
		c.RouteTables = in.TablesReceived()
	}
	pc := s.corestore.Platform()
	c.PlatformStates, _ = pc.DesiredStates()
	c.Backups, c.PlatformRestores = pc.Delivered(), pc.Settled()
	if s.vpnJoined.Load() {
		for _, n := range s.vpn {
			c.VPNPackets += n.Received()
		}
	}
	return c
}

// released is how many renewals the nodes admitted from escrow.
func (s *Scenario) released() int64 {
	var n int64
	if rs := s.renewals.Load(); rs != nil {
		for _, r := range *rs {
			n += r.Admitted()
		}
	}
	return n
}

func (s *Scenario) say(format string, args ...any) {
	if s.Story != nil {
		s.Story(fmt.Sprintf(format, args...))
	}
}

// Run connects and registers the nodes and the ingress, then drives every part until ctx ends.
func (s *Scenario) Run(ctx context.Context, relayURL string) error {
	nodes, err := s.connectNodes(ctx, relayURL)
	defer func() {
		for _, n := range nodes {
			if n != nil && n.Conn() != nil {
				n.Close()
			}
		}
	}()
	if err != nil {
		return err
	}
	in := NewIngress(nodeName(0), scenarioIngressBearer, s.Log)
	if err := in.Connect(ctx, relayURL); err != nil {
		return err
	}
	defer in.Close()
	if _, err := in.Register(ctx); err != nil {
		return fmt.Errorf("ingress register: %w", err)
	}
	s.in.Store(in)

	var g errgroup.Group
	if s.HubAddr.IsValid() {
		g.Go(func() error {
			err := s.vpnLoop(ctx)
			if err != nil {
				s.Log.Warn().Err(err).Msg("vpn scenario stopped")
			}
			return err
		})
	}
	g.Go(func() error { s.cycles(ctx, nodes, in); return nil })
	g.Go(func() error { s.traffic(ctx, nodes); return nil })
	g.Go(func() error { s.routeTables(ctx); return nil })
	g.Go(func() error { s.streamsLoop(ctx, nodes); return nil })
	g.Go(func() error { return s.restoresLoop(ctx) })
	return g.Wait()
}

func (s *Scenario) connectNodes(ctx context.Context, url string) ([]*Node, error) {
	nodes := make([]*Node, s.nodes)
	renewals := make([]*RenewalCounter, s.nodes)
	for i := range nodes {
		nodes[i] = NewNode(nodeName(i), s.Log)
		// Cloudly's streams to a node give up after streamGiveUp; one an outage cut (the relay
		// does not tell nodes it detached) is let go then too, not a minute later.
		nodes[i].SetStreamIdle(streamGiveUp)
		renewals[i] = CountRenewals(nodes[i])
	}
	s.renewals.Store(&renewals)
	s.live.Store(&nodes)
	var g errgroup.Group
	g.SetLimit(64)
	for _, n := range nodes {
		g.Go(func() error {
			if err := n.Connect(ctx, url); err != nil {
				return err
			}
			rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			defer cancel()
			if _, err := n.Register(rctx); err != nil {
				return fmt.Errorf("node %s register: %w", n.ID, err)
			}
			s.registered.Add(1)
			return nil
		})
	}
	return nodes, g.Wait()
}

// vpnMembershipLife is how long each member of a pushed VPN membership stays valid.
const vpnMembershipLife = time.Hour

// vpnLoop: Cloudly pushes the membership (and a newer one every 20 minutes), every node joins the
// hub, and every 500 ms each node sends 5 packets to the next one through it.
func (s *Scenario) vpnLoop(ctx context.Context) error {
	ids := make([]string, s.nodes)
	for i := range ids {
		ids[i] = nodeName(i)
	}
	members, err := NewVPNNodes(SimVPNControlPrefix, s.Log, ids...)
	if err != nil {
		return err
	}
	for _, m := range members {
		m.LightSocket = true // hundreds of members in one process
	}
	s.vpn = members
	defer func() {
		for _, m := range members {
			m.Close()
		}
	}()
	generation := int64(1)
	push := func() error {
		body := VPNMembershipBody(SimVPNAuthority, SimVPNControlPrefix, generation, time.Now().Add(vpnMembershipLife).UnixMilli(), members)
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		if _, err := s.Cloudly.Call(cctx, contracts.MethodPushClusterVpnMembership, body); err != nil {
			return fmt.Errorf("vpn membership push: %w", err)
		}
		return nil
	}
	if err := push(); err != nil {
		return err
	}
	pushed := time.Now()
	// Every simulated node dials from 127.0.0.1, so the hub's per-source handshake limit (20/s,
	// burst 5) applies to all of them together: join a few at a time and try again when refused.
	var g errgroup.Group
	g.SetLimit(4)
	for _, m := range members {
		g.Go(func() error {
			for attempt := 0; ; attempt++ {
				jctx, cancel := context.WithTimeout(ctx, 10*time.Second)
				err := m.Join(jctx, s.HubAddr, s.HubKey, SimVPNAuthority)
				cancel()
				if err == nil || attempt == 50 || !sleepCtx(ctx, 200*time.Millisecond) {
					return err
				}
			}
		})
	}
	if err := g.Wait(); err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return fmt.Errorf("vpn join: %w", err)
	}
	s.vpnJoined.Store(true)
	for sleepCtx(ctx, 500*time.Millisecond) {
		// Renew the membership well before it expires, as Cloudly does; a run may last for days.
		if time.Since(pushed) > vpnMembershipLife/3 && s.Cloudly.Attached() {
			generation++ // never reused: a push whose answer was lost may still have been applied
			if push() == nil {
				pushed = time.Now()
			}
		}
		for i, m := range members {
			m.Send(members[(i+1)%len(members)], 5, 200)
		}
	}
	return nil
}

// The escrow runs Cloudly holds: a renewal every renewalStep, each window renewalWindow long.
const (
	renewalStep   = 2 * time.Second
	renewalWindow = 3 * time.Second
)

// recoveryWait bounds how long a scenario that ends during an outage waits for the recovery.
const recoveryWait = 20 * time.Second

// cycles tells the scenario's story, again and again:
//
//   - attached: Cloudly holds a run of short DNS lease renewals for every node (a 3 s window
//     every 2 s, through the next outage) while traffic flows;
//   - outage: Cloudly goes away for Timing.Outage; the relay detaches and releases each node's
//     current renewal from escrow, and the next one as its slot opens;
//   - recovery: Cloudly comes back, the relay re-attaches, every node and the ingress register
//     again (a new session each), and the next run is held for the new sessions.
//
// When ctx ends during an outage, Cloudly comes back at once, and cycles waits for the recovery
// (at most recoveryWait) before it returns: a run does not end detached.
func (s *Scenario) cycles(ctx context.Context, nodes []*Node, in *Ingress) {
	t := s.Timing.WithDefaults()
	s.say("attached: %d nodes and the ingress registered; traffic flows", len(nodes))
	sequence := int64(1) // every run continues the sequences of the one before: a node admits only newer ones
	attached := t.FirstAttached
	for outage := int64(1); ; outage++ {
		count := int((attached+t.Outage)/renewalStep) + 3
		s.hold(ctx, nodes, sequence, count)
		sequence += int64(count)
		if !sleepCtx(ctx, attached) {
			return
		}

		before := registrations(nodes, in)
		released := s.released()
		s.outageFrom.Store(released) // before the count: a snapshot that sees the outage sees its start
		s.outages.Add(1)
		s.say("outage %d: Cloudly goes away for %s; the relay detaches and releases the renewals it holds", outage, t.Outage)
		s.Cloudly.SetAvailable(false)
		sleepCtx(ctx, t.Outage) // cut short when ctx ends: Cloudly comes back at once
		s.Cloudly.SetAvailable(true)
		back := time.Now()
		s.say("outage %d over: Cloudly is back", outage)
		if !s.recovered(ctx, nodes, in, before) {
			return
		}
		s.recoveries.Add(1)
		s.say("recovered %.1f s after Cloudly came back: the relay re-attached, %d nodes and the ingress registered again; %d renewals released from escrow while detached",
			time.Since(back).Seconds(), len(nodes), s.released()-released)
		if ctx.Err() != nil {
			return
		}
		attached = t.Attached
	}
}

// hold has Cloudly hold a run of count renewals for every node, sequences from first.
func (s *Scenario) hold(ctx context.Context, nodes []*Node, first int64, count int) {
	start := time.Now().Add(500 * time.Millisecond)
	var g errgroup.Group
	g.SetLimit(16)
	for _, n := range nodes {
		g.Go(func() error {
			body, err := EscrowRun{Session: n.Session(), Start: start, Count: count, Step: renewalStep, Window: renewalWindow,
				FirstSequence: first}.Request()
			if err != nil {
				return nil
			}
			cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			defer cancel()
			if _, err := s.Cloudly.Call(cctx, contracts.MethodHoldRuntimeNetworkDnsLeaseRenewals, body); err != nil && ctx.Err() == nil {
				s.Log.Debug().Err(err).Str("node", n.ID).Msg("hold failed")
			}
			return nil
		})
	}
	g.Wait()
}

// registrations are the accepted registrations of every node, then of the ingress.
func registrations(nodes []*Node, in *Ingress) []int64 {
	out := make([]int64, len(nodes)+1)
	for i, n := range nodes {
		out[i] = n.Registrations()
	}
	out[len(nodes)] = in.Registrations()
	return out
}

// reregisterAfter is how long a node (or the ingress) that has not registered again since the
// relay re-attached waits before it tries by itself, as Pallet retries a failed registration.
const reregisterAfter = 10 * time.Second

// recovered waits until the relay is attached again and every node and the ingress registered
// since before; a node whose registration after the relay's push failed tries again after
// reregisterAfter. Once ctx ends it waits at most recoveryWait more; false if that passes first.
func (s *Scenario) recovered(ctx context.Context, nodes []*Node, in *Ingress, before []int64) bool {
	var deadline time.Time   // set once ctx ends
	var attachedAt time.Time // since when the relay is attached; zero while it is not
	for {
		attached := s.Cloudly.Attached()
		var late []int // not registered again: indexes into nodes, len(nodes) for the ingress
		for i, n := range registrations(nodes, in) {
			if n <= before[i] {
				late = append(late, i)
			}
		}
		switch {
		case attached && len(late) == 0:
			return true
		case !attached:
			attachedAt = time.Time{}
		case attachedAt.IsZero():
			attachedAt = time.Now()
		case time.Since(attachedAt) > reregisterAfter:
			attachedAt = time.Now()
			s.registerAgain(nodes, in, late)
		}
		switch {
		case ctx.Err() == nil:
		case deadline.IsZero():
			deadline = time.Now().Add(recoveryWait)
			s.say("the run ends before the recovery: waiting for it (at most %s)", recoveryWait)
		case time.Now().After(deadline):
			return false
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// registerAgain registers the late nodes (and the ingress, index len(nodes)) once more.
func (s *Scenario) registerAgain(nodes []*Node, in *Ingress, late []int) {
	var names []string
	for _, i := range late {
		if i == len(nodes) {
			names = append(names, "the ingress")
		} else {
			names = append(names, nodes[i].ID)
		}
	}
	if len(names) > 3 {
		names = append(names[:3], fmt.Sprintf("%d more", len(late)-3))
	}
	s.say("%s did not register again within %s of the relay's re-attachment: trying again", strings.Join(names, ", "), reregisterAfter)
	var g errgroup.Group
	g.SetLimit(16)
	for _, i := range late {
		g.Go(func() error {
			ctx, cancel := context.WithTimeout(context.Background(), reregisterAfter)
			defer cancel()
			var err error
			id := in.NodeID + " (ingress)"
			if i == len(nodes) {
				_, err = in.Register(ctx)
			} else {
				id = nodes[i].ID
				_, err = nodes[i].Register(ctx)
			}
			if err != nil {
				s.Log.Warn().Err(err).Str("node", id).Msg("registration failed again")
			}
			return nil
		})
	}
	g.Wait()
}

func sleepCtx(ctx context.Context, d time.Duration) bool {
	select {
	case <-ctx.Done():
		return false
	case <-time.After(d):
		return true
	}
}

// traffic: every 200 ms each node reports to Cloudly and Cloudly reads each node's stats.
// One round at a time: a round that takes longer than 200 ms delays the next instead of piling
// goroutines and requests on top of it.
func (s *Scenario) traffic(ctx context.Context, nodes []*Node) {
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	var wg sync.WaitGroup
	for seq := 1; ; seq++ {
		wg.Wait()
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		for _, n := range nodes {
			wg.Add(2)
			go func() {
				defer wg.Done()
				cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
				defer cancel()
				if _, err := n.Report(cctx, "reportRuntimeAssignmentObservation", map[string]any{"sequence": seq}); err == nil {
					s.requests.Add(1)
				}
			}()
			go func() {
				defer wg.Done()
				cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
				defer cancel()
				// Cloudly addresses the node by the session it issued it, as every runtime-session request does.
				body, _ := json.Marshal(map[string]any{"session": s.Cloudly.Session(n.ID), "assignment": map[string]any{"sequence": seq}})
				if _, err := s.Cloudly.Call(cctx, "readRuntimeAssignmentStats", body); err == nil {
					s.requests.Add(1)
				}
			}()
		}
	}
}

// streamsLoop: every second while attached, one node streams an image to Cloudly and Cloudly
// streams one to the next node, each 256 KiB in 32 KiB chunks, as the published library's
// VirtualStream carries them. (While the relay is detached a node's stream frames have nowhere to
// go: the relay drops them, and the stream times out, as it would for a real node.)
// streamGiveUp is how long the scenario gives an image stream, either way.
const streamGiveUp = 5 * time.Second

func (s *Scenario) streamsLoop(ctx context.Context, nodes []*Node) {
	image := bytes.Repeat([]byte("serve.zone image layer "), 256<<10/23)
	for i := 0; i == 0 || sleepCtx(ctx, time.Second); i++ {
		if !s.Cloudly.Attached() {
			continue
		}
		up, down := nodes[i%len(nodes)], nodes[(i+1)%len(nodes)]
		var wg sync.WaitGroup
		wg.Add(2)
		go func() {
			defer wg.Done()
			cctx, cancel := context.WithTimeout(ctx, streamGiveUp)
			defer cancel()
			if err := up.PushImage(cctx, image, 32<<10); err == nil {
				s.streams.Add(1)
			} else {
				s.Log.Debug().Err(err).Str("node", up.ID).Msg("image stream to Cloudly failed")
			}
		}()
		go func() {
			defer wg.Done()
			cctx, cancel := context.WithTimeout(ctx, streamGiveUp)
			defer cancel()
			if err := s.Cloudly.PushImage(cctx, down.ID, image, 32<<10); err == nil {
				s.streams.Add(1)
			} else {
				s.Log.Debug().Err(err).Str("node", down.ID).Msg("image stream to the node failed")
			}
		}()
		wg.Wait()
	}
}

// routeTables: Cloudly pushes a newer route table every 2 s; the ingress pulls it on the hint.
func (s *Scenario) routeTables(ctx context.Context) {
	for revision := 1; ; revision++ {
		table, _ := json.Marshal(map[string]any{"revision": revision, "routes": []map[string]any{
			{"hostname": "app.example", "target": map[string]any{"address": "10.64.0.7", "port": 8080}},
		}})
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		_, err := s.ingress.PushTable(cctx, table)
		cancel()
		if err != nil && ctx.Err() == nil {
			s.Log.Debug().Err(err).Msg("route table push failed")
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(2 * time.Second):
		}
	}
}

// restoresLoop runs one isolated restore of two objects after another through the relay.
func (s *Scenario) restoresLoop(ctx context.Context) error {
	for i := 1; ctx.Err() == nil; i++ {
		p := &RestorePlan{RestoreID: fmt.Sprintf("restore-%d", i), NodeID: nodeName(0), NodeName: scenarioNodeName,
			Mappings:   []string{"db->db-restored"},
			ChunkBytes: 64 << 10,
			Objects: []RestoreObject{
				{Key: "base.tar", Data: bytes.Repeat([]byte{byte(i)}, 150<<10)},
				{Key: "wal.tar", Data: bytes.Repeat([]byte{byte(i + 1)}, 40<<10)},
			}}
		rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		_, err := RunIsolatedRestore(rctx, s.Cloudly.Call, s.authority, p)
		cancel()
		switch {
		case err == nil:
			s.restores.Add(1)
		case ctx.Err() != nil || errors.Is(err, context.Canceled):
			return nil
		default:
			s.Log.Debug().Err(err).Msg("restore failed")
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(500 * time.Millisecond):
		}
	}
	return nil
}
