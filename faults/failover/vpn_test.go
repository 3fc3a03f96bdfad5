package failover

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"net/netip"
	"os/exec"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/quic-go/quic-go"
	"github.com/rs/zerolog"

	"code.foss.global/serve.zone/relay/contracts"
	"code.foss.global/serve.zone/relay/testenv/sim"
	"code.foss.global/serve.zone/relay/vpnhub/client"
	"code.foss.global/serve.zone/relay/vpnhub/vpntest"
)

// The VPN across a failover: every relay runs its hub on a loopback port of its own with the one
// hub key (the chart's Secret), the Service stand-in carries UDP to the leader's hub, and two
// members joined with the real client (vpnhub/client's Tunnel, nothing added) send each other a
// packet every vpnPace through it.

// hubAnnotation names a Pod's hub address for the Service stand-in (in a cluster, podIP and the
// hub's container port).
const hubAnnotation = "failover.test/hub"

// vpnPace is how often each member sends its peer a packet.
const vpnPace = 20 * time.Millisecond

// withHub makes every relay started from now on run a VPN hub with one shared key file.
func (c *cluster) withHub() {
	c.t.Helper()
	c.hubKey = filepath.Join(c.dir, "hub.key")
	if out, err := exec.Command(c.bin, "keygen", "--hub-key-file", c.hubKey).CombinedOutput(); err != nil {
		c.t.Fatalf("relay keygen --hub-key-file: %v\n%s", err, out)
	}
}

// hubArgs are the hub flags of relay p, whose hub address it sets; none unless withHub.
func (c *cluster) hubArgs() []string {
	if c.hubKey == "" {
		return nil
	}
	// Each replica binds its own port; the report names the Service's address, the same on all.
	return []string{"--hub-listen", "127.0.0.1:0", "--hub-advertise-address", "192.0.2.1", "--hub-key-file", c.hubKey}
}

// hubStatus is the vpnhub part of a relay's /status.json, and since when the relay has had its
// role.
type hubStatus struct {
	Generation int64 `json:"generation"`
	Members    int   `json:"members"`
	Sessions   int   `json:"sessions"`
	Serving    bool  `json:"serving"`
	roleSince  time.Time
}

func (p *relayProc) hubStatus() (hubStatus, error) {
	resp, err := adminClient.Get("http://" + p.current().admin + "/status.json")
	if err != nil {
		return hubStatus{}, err
	}
	defer resp.Body.Close()
	var st struct {
		HA struct {
			Since time.Time `json:"since"`
		} `json:"ha"`
		Parts []struct {
			Name   string          `json:"name"`
			Status json.RawMessage `json:"status"`
		} `json:"parts"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
		return hubStatus{}, err
	}
	for _, pt := range st.Parts {
		if pt.Name == "vpnhub" {
			h := hubStatus{roleSince: st.HA.Since}
			return h, json.Unmarshal(pt.Status, &h)
		}
	}
	return hubStatus{}, errors.New("no vpnhub part on /status.json")
}

// waitHub waits until relay p's hub says cond.
func (c *cluster) waitHub(p *relayProc, what string, cond func(hubStatus) bool) {
	c.t.Helper()
	c.eventually(p.name+"'s hub: "+what, flowDeadline, func() bool {
		st, err := p.hubStatus()
		return err == nil && cond(st)
	})
}

// vpnFlow is two members exchanging packets through the Service's UDP port.
type vpnFlow struct {
	members [2]*vpnMember
	cancel  context.CancelFunc
	wg      sync.WaitGroup
}

// vpnMember is one member: its tunnel, and the packets its peer's tunnel delivered to it.
type vpnMember struct {
	node *sim.VPNNode
	tu   *client.Tunnel
	dev  *flowDevice

	// sentByKill is the last sequence number this member sent before the leader's SIGKILL had
	// taken effect (set by killLeaderUnderFlow): a packet up to it may still have been forwarded
	// by the killed leader and arrive a moment after the kill.
	sentByKill uint32

	mu    sync.Mutex
	joins []*client.Conn // guarded by mu: every session the tunnel opened, in order
}

// flowDevice is a member's packet device: it gives the tunnel a packet for the peer every
// vpnPace and records what the tunnel writes to it.
type flowDevice struct {
	src, dst netip.Addr
	tick     *time.Ticker
	closed   chan struct{}
	once     sync.Once
	seq      atomic.Uint32 // the last sequence number Read gave the tunnel

	mu  sync.Mutex
	got []arrival // guarded by mu
}

// arrival is one packet delivered: its sequence number and when.
type arrival struct {
	seq uint32
	at  time.Time
}

func (d *flowDevice) Read(bufs [][]byte, sizes []int, offset int) (int, error) {
	select {
	case <-d.tick.C:
	case <-d.closed:
		return 0, client.ErrClosed
	}
	seq := d.seq.Add(1)
	sizes[0] = copy(bufs[0][offset:], vpntest.IPv4Packet(d.src, d.dst, binary.BigEndian.AppendUint32(nil, seq)))
	return 1, nil
}

func (d *flowDevice) Write(bufs [][]byte, offset int) (int, error) {
	now := time.Now()
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, b := range bufs {
		if p := b[offset:]; len(p) >= 32 {
			d.got = append(d.got, arrival{binary.BigEndian.Uint32(p[28:32]), now})
		}
	}
	return len(bufs), nil
}

func (d *flowDevice) BatchSize() int { return 1 }

func (d *flowDevice) Close() error {
	d.once.Do(func() { close(d.closed); d.tick.Stop() })
	return nil
}

// arrivals is what was delivered to the member so far.
func (d *flowDevice) arrivals() []arrival {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]arrival(nil), d.got...)
}

// startVPNFlow joins two members (keys and control addresses from sim) through the Service's UDP
// port, dialling the hub key the leader reported to Cloudly, and starts their flow.
func (c *cluster) startVPNFlow(t testing.TB, nodes []*sim.VPNNode, hubKey [32]byte) *vpnFlow {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	f := &vpnFlow{cancel: cancel}
	for i, n := range nodes {
		peer := nodes[1-i]
		cl, err := client.New(client.Config{Hub: c.svc.UDPAddr(), HubKey: hubKey, AuthorityID: sim.SimVPNAuthority, NodeID: n.ID, Key: n.Key})
		if err != nil {
			t.Fatal(err)
		}
		m := &vpnMember{node: n, dev: &flowDevice{src: n.Address, dst: peer.Address, tick: time.NewTicker(vpnPace), closed: make(chan struct{})}}
		m.tu = &client.Tunnel{Client: cl, Device: m.dev, Logger: zerolog.Nop(), OnJoin: func(conn *client.Conn) {
			m.mu.Lock()
			m.joins = append(m.joins, conn)
			m.mu.Unlock()
		}}
		f.members[i] = m
		f.wg.Add(1)
		go func() { defer f.wg.Done(); m.tu.Run(ctx); cl.Close() }()
	}
	return f
}

func (f *vpnFlow) close() {
	f.cancel()
	f.wg.Wait()
}

// delivered is how many packets each member got after t, the fewer of the two.
func (f *vpnFlow) delivered(after time.Time) int {
	least := -1
	for _, m := range f.members {
		n := 0
		for _, a := range m.dev.arrivals() {
			if a.at.After(after) {
				n++
			}
		}
		if least < 0 || n < least {
			least = n
		}
	}
	return least
}

// waitDelivered waits until each member has had n packets delivered after t.
func (c *cluster) waitDelivered(f *vpnFlow, after time.Time, n int, what string) {
	c.t.Helper()
	c.eventually(what, takeover, func() bool { return f.delivered(after) >= n })
}

// gapAcross is the flow's gap across the moment at, the longer of the two members': from the
// last packet delivered before at to the first after, with the sequence numbers either side.
func (f *vpnFlow) gapAcross(at time.Time) (gap, resumed time.Duration, lastBefore, firstAfter [2]uint32) {
	for i, m := range f.members {
		var before, after *arrival
		got := m.dev.arrivals()
		for j := range got {
			if !got[j].at.After(at) {
				before = &got[j]
			} else if after == nil {
				after = &got[j]
			}
		}
		if before == nil || after == nil {
			continue
		}
		gap, resumed = max(gap, after.at.Sub(before.at)), max(resumed, after.at.Sub(at))
		lastBefore[i], firstAfter[i] = before.seq, after.seq
	}
	return gap, resumed, lastBefore, firstAfter
}

// vpnCluster is two relays with hubs, the first leader, the membership pushed to it once (and
// never again), a complete copy of it on the standby's hub, and two members' flow through the
// Service under way.
func vpnCluster(t testing.TB) (*cluster, *vpnFlow) {
	t.Helper()
	c := newCluster(t)
	c.withHub()
	c.start("relay-a")
	c.start("relay-b")
	first := c.waitLeader(startDeadline)
	ctx, cancel := context.WithTimeout(context.Background(), flowDeadline)
	defer cancel()
	report, err := c.cloudly.WaitVPNHub(ctx)
	if err != nil {
		t.Fatalf("the leader reported no hub: %v", err)
	}
	_, hubKey, err := sim.HubTarget(report)
	if err != nil {
		t.Fatal(err)
	}
	nodes, err := sim.NewVPNNodes(sim.SimVPNControlPrefix, zerolog.Nop(), "vpn-a", "vpn-b")
	if err != nil {
		t.Fatal(err)
	}
	// The one push of this cluster's life: the Cloudly stand-in pushes membership only when told,
	// so whatever a later leader serves came from replication.
	body := sim.VPNMembershipBody(sim.SimVPNAuthority, sim.SimVPNControlPrefix, 1, time.Now().Add(time.Hour).UnixMilli(), nodes)
	if _, err := c.cloudly.Call(ctx, contracts.MethodPushClusterVpnMembership, body); err != nil {
		t.Fatalf("push the membership: %v", err)
	}
	c.waitHub(first, "serving generation 1", func(h hubStatus) bool { return h.Serving && h.Generation == 1 && h.Members == 2 })
	for _, p := range c.running() {
		if p != first {
			c.waitHub(p, "holding the leader's generation 1, unserved", func(h hubStatus) bool {
				return !h.Serving && h.Generation == 1 && h.Members == 2 && h.Sessions == 0
			})
		}
	}
	f := c.startVPNFlow(t, nodes, hubKey)
	t.Cleanup(f.close)
	c.waitDelivered(f, time.Time{}, 20, "the members' packets flowing through the first leader")
	c.waitHub(first, "both members' sessions", func(h hubStatus) bool { return h.Sessions == 2 })
	return c, f
}

// killLeaderUnderFlow SIGKILLs the leader while the flow runs — the kubelet marks its Pod unready
// once its container died, so the Service drops it — and waits until the flow is back: each
// member has had 20 packets delivered after the kill; then the killed relay's Pod is deleted. It
// returns the kill's moment and the new leader.
func (c *cluster) killLeaderUnderFlow(f *vpnFlow) (killed time.Time, next *relayProc) {
	c.t.Helper()
	old := c.waitLeader(takeover)
	killed = time.Now()
	old.kill()
	for _, m := range f.members {
		m.sentByKill = m.dev.seq.Load() // what it sent until the killed relay had exited
	}
	c.kube.SetPodReady(namespace, old.name, false)
	c.waitDelivered(f, killed, 20, "the members' packets flowing again after the SIGKILL of "+old.name)
	c.deletePod(old.name) // its container would restart a standby; here the Pod goes, as its ReplicaSet's would
	next = c.waitLeader(takeover)
	return killed, next
}

// TestHAVPNFlowSurvivesLeaderKilled: a UDP flow between two members through the Service across a
// SIGKILL of the leader. Packets flow through the first leader; it is killed; the flow stops (the
// packets sent meanwhile are lost); the standby leads and serves the membership it copied (Cloudly
// never pushed it again); the members' connections to the dead leader are reset by the new one
// (stateless reset: the replicas derive the reset key from the shared hub key), their tunnels
// redial, and the flow resumes with both sessions on the new leader.
func TestHAVPNFlowSurvivesLeaderKilled(t *testing.T) {
	c, f := vpnCluster(t)
	killed, next := c.killLeaderUnderFlow(f)

	gap, resumed, lastBefore, firstAfter := f.gapAcross(killed)
	st, err := next.hubStatus()
	if err != nil {
		t.Fatal(err)
	}
	// The gap: nothing sent after the killed relay had exited was delivered until the standby led
	// (what it forwarded before it died may land a moment after the kill).
	if !st.roleSince.After(killed) {
		t.Fatalf("%s leads since %s, before the kill at %s", next.name, st.roleSince, killed)
	}
	for i, m := range f.members {
		sender := f.members[1-i]
		for _, a := range m.dev.arrivals() {
			if a.seq > sender.sentByKill && a.at.Before(st.roleSince) {
				t.Errorf("%s got packet %d, sent after the killed leader had exited (its peer had sent %d), %s after the kill, before %s led: the flow never stopped",
					m.node.ID, a.seq, sender.sentByKill, a.at.Sub(killed).Round(time.Millisecond), next.name)
			}
		}
	}
	if !st.Serving || st.Sessions != 2 || st.Generation != 1 {
		t.Errorf("the new leader %s's hub: %+v; want serving the copied generation 1 to both members", next.name, st)
	}
	if n := c.cloudly.Received(contracts.MethodRegisterClusterVpnHub); n < 2 {
		t.Errorf("registerClusterVpnHub received %d times: the new leader did not report its hub", n)
	}
	for _, m := range f.members {
		m.mu.Lock()
		joins := append([]*client.Conn(nil), m.joins...)
		m.mu.Unlock()
		if len(joins) < 2 {
			t.Fatalf("%s joined %d times: its sessions never moved to the new leader", m.node.ID, len(joins))
		}
		var reset *quic.StatelessResetError
		if err := joins[0].Err(); !errors.As(err, &reset) {
			t.Errorf("%s's session on the killed leader ended with %v, want the new leader's stateless reset", m.node.ID, err)
		}
		if joins[len(joins)-1].Err() != nil {
			t.Errorf("%s's newest session ended: %v", m.node.ID, joins[len(joins)-1].Err())
		}
	}
	t.Logf("SIGKILL → %s leads; VPN flow gap %s, resumed %s after the kill (lease %s; sequence numbers %v → %v)",
		next.name, gap.Round(time.Millisecond), resumed.Round(time.Millisecond), leaseDuration, lastBefore, firstAfter)
}
