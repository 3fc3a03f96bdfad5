package vpnhub

import (
	"bytes"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"sync"
	"testing"

	"github.com/rs/zerolog"

	"code.foss.global/serve.zone/relay/contracts"
)

// feedLog records what a leader's Replicate sends, as the HA channel would carry it.
type feedLog struct {
	mu   sync.Mutex
	recs []replicaRecord
}

func (f *feedLog) send(key string, value []byte) {
	f.mu.Lock()
	f.recs = append(f.recs, replicaRecord{key, value})
	f.mu.Unlock()
}

// take returns what was sent since the last take.
func (f *feedLog) take() []replicaRecord {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := f.recs
	f.recs = nil
	return out
}

// adoptAll hands recs to the standby in order, as the channel does.
func adoptAll(t *testing.T, standby *testHub, recs []replicaRecord) {
	t.Helper()
	for _, r := range recs {
		if err := standby.Adopt(r.key, r.value); err != nil {
			t.Fatalf("adopt %s: %v", r.key, err)
		}
	}
}

var bigPrefix = netip.MustParsePrefix("10.64.0.0/16")

// bigMembership is a push of n members inside 10.64.0.0/16, node-0…, the first two being ka's and
// kb's, valid until testNow + 60 s.
func bigMembership(generation int64, n int, first ...contracts.VPNMember) []byte {
	m := contracts.VPNMembership{AuthorityID: testAuthority, ControlPrefix: bigPrefix, Generation: generation}
	m.Members = append(m.Members, first...)
	for i := len(first); i < n; i++ {
		var k [32]byte
		k[0], k[1], k[2] = 0xee, byte(i>>8), byte(i)
		a := netip.AddrFrom4([4]byte{10, 64, byte((i + 10) >> 8), byte(i + 10)})
		m.Members = append(m.Members, contracts.VPNMember{NodeID: fmt.Sprintf("node-%d", i), PublicKey: k, ControlAddress: a, ExpiresAt: testNow + 60_000})
	}
	return contracts.EncodeVPNMembershipPush(m)
}

func (th *testHub) pushBody(t *testing.T, body []byte) {
	t.Helper()
	if _, err := th.PushMembership(body); err != nil {
		t.Fatal(err)
	}
}

// held is the membership a hub holds, as a push would carry it; nil when none.
func (th *testHub) held() []byte {
	v := th.view.Load()
	if v == nil {
		return nil
	}
	return contracts.EncodeVPNMembershipPush(contracts.VPNMembership{AuthorityID: v.authorityID, ControlPrefix: v.prefix,
		Generation: v.generation, Members: v.members})
}

func keysOf(recs []replicaRecord) []string {
	var out []string
	for _, r := range recs {
		op := "set"
		if r.value == nil {
			op = "delete"
		}
		out = append(out, op+" "+r.key)
	}
	return out
}

// The leader's membership reaches a standby's hub through Replicate and Adopt, in chunks of 1024
// members, and the standby holds exactly the leader's membership after every change; a change
// that fewer chunks carry removes the chunks past them. While its relay stands by the standby
// serves nothing; the moment it leads, a member joins it with the copied membership.
func TestReplicateAdoptCarriesTheMembership(t *testing.T) {
	checkLeaks(t)
	leader, standby := startHub(t, nil), startHub(t, nil)
	standby.Leading(false)
	ka := testKey(t, 2)
	a := contracts.VPNMember{NodeID: "node-a", PublicKey: ka.Public, ControlAddress: netip.MustParseAddr("10.64.0.2"), ExpiresAt: testNow + 60_000}
	leader.pushBody(t, bigMembership(1, 2500, a))

	var feed feedLog
	stop := leader.Replicate(feed.send)
	first := feed.take()
	if got, want := keysOf(first), []string{"set vpn/members/0", "set vpn/members/1", "set vpn/members/2", "set vpn/membership"}; !slices.Equal(got, want) {
		t.Fatalf("the first copy sends %v, want %v", got, want)
	}
	for _, r := range first {
		if len(r.value) > 200<<10 {
			t.Fatalf("record %s is %d bytes", r.key, len(r.value))
		}
	}
	adoptAll(t, standby, first)
	if !bytes.Equal(standby.held(), leader.held()) {
		t.Fatal("the standby does not hold the leader's membership")
	}
	if st := hubStatus(t, standby, nil); st.Generation != 1 || st.Members != 2500 || st.Serving {
		t.Fatalf("the standby's status: %+v", st)
	}
	if _, err := standby.dial(t, ka, "node-a", testAuthority); !errors.Is(err, contracts.VPNHubStandby) {
		t.Fatalf("a member dialling the standby: %v", err)
	}

	leader.pushBody(t, bigMembership(2, 900, a)) // one chunk now
	change := feed.take()
	if got, want := keysOf(change), []string{"set vpn/members/0", "set vpn/membership", "delete vpn/members/1", "delete vpn/members/2"}; !slices.Equal(got, want) {
		t.Fatalf("the change sends %v, want %v", got, want)
	}
	adoptAll(t, standby, change)
	if !bytes.Equal(standby.held(), leader.held()) || len(standby.copied.chunks) != 1 {
		t.Fatalf("after the change the standby holds generation %d with %d chunks staged", standby.view.Load().generation, len(standby.copied.chunks))
	}

	leader.pushBody(t, bigMembership(2, 10, a)) // not newer: nothing sent
	if got := feed.take(); len(got) != 0 {
		t.Fatalf("a stale push sent %v", keysOf(got))
	}
	leader.pushBody(t, bigMembership(3, 1200, a))
	partial := feed.take()
	adoptAll(t, standby, partial[:2]) // two chunks of generation 3, not its header: not a whole membership
	if g := standby.view.Load().generation; g != 2 {
		t.Fatalf("the standby installed generation %d from a part of the records", g)
	}
	adoptAll(t, standby, partial[2:])
	if !bytes.Equal(standby.held(), leader.held()) {
		t.Fatal("the standby does not hold generation 3 once its header came")
	}

	stop()
	stop() // idempotent
	leader.pushBody(t, bigMembership(4, 3, a))
	if got := feed.take(); len(got) != 0 {
		t.Fatalf("stopped, the leader still sent %v", keysOf(got))
	}

	standby.Leading(true) // elected: it serves the copy at once
	c := standby.mustDial(t, ka, "node-a")
	if c.ControlAddress() != a.ControlAddress {
		t.Fatalf("joined the new leader at %s", c.ControlAddress())
	}

	standby.ForgetCopy()
	if err := waitClosed(t, c); !errors.Is(err, contracts.VPNMemberRemoved) {
		t.Fatalf("the session on a hub that forgot its membership ended with %v", err)
	}
	if st := hubStatus(t, standby, nil); st.Generation != -1 || st.Members != 0 || len(standby.copied.chunks) != 0 {
		t.Fatalf("after ForgetCopy: %+v", st)
	}
}

// A standby whose leader holds no membership holds none either (the leader's whole state is
// what it copies); a record that does not read is refused by name and changes nothing.
func TestAdoptRefusesWhatDoesNotRead(t *testing.T) {
	leader, standby := startHub(t, nil), startHub(t, nil)
	standby.Leading(false)
	leader.push(t, 7, testMember(testKey(t, 2), "node-a", 2))
	var feed feedLog
	defer leader.Replicate(feed.send)()
	recs := feed.take()
	adoptAll(t, standby, recs)
	want := standby.held()
	hdr, chunk := recs[1].value, recs[0].value
	for _, c := range []struct {
		name, key string
		value     []byte
	}{
		{"another part's key", "run/node-a", chunk},
		{"an unknown vpn/ record", "vpn/other", chunk},
		{"a chunk index with a leading zero", "vpn/members/00", chunk},
		{"a chunk index past the bound", "vpn/members/64", chunk},
		{"a header cut short", "vpn/membership", hdr[:10]},
		{"a header with a public prefix", "vpn/membership", append(append(bytes.Clone(hdr[:10]), 8, 8, 8, 0, 24), testAuthority...)},
		{"a header counting 65 chunks", "vpn/membership", append(append(bytes.Clone(hdr[:8]), 0, 65), hdr[10:]...)},
		{"a chunk with a byte after its members", "vpn/members/0", append(bytes.Clone(chunk), 0)},
		{"a chunk cut short", "vpn/members/0", chunk[:len(chunk)-1]},
		{"a chunk counting no members", "vpn/members/0", append(bytes.Clone(chunk[:8]), 0, 0)},
		{"a chunk with a bad node id", "vpn/members/0", bytes.Replace(chunk, []byte("node-a"), []byte("node a"), 1)},
	} {
		if err := standby.Adopt(c.key, c.value); !errors.Is(err, ErrReplicaRecord) {
			t.Errorf("%s: %v, want ErrReplicaRecord", c.name, err)
		}
		if !bytes.Equal(standby.held(), want) {
			t.Fatalf("%s changed the membership held", c.name)
		}
	}
	// Records that read but make no push-valid membership: a member outside the prefix.
	outside := bytes.Replace(chunk, []byte{10, 64, 0, 2}, []byte{10, 65, 0, 2}, 1)
	if err := standby.Adopt("vpn/members/0", outside); !errors.Is(err, ErrReplicaRecord) {
		t.Errorf("a member outside the control prefix: %v", err)
	}
	if !bytes.Equal(standby.held(), want) {
		t.Fatal("an invalid membership was installed")
	}
	if err := standby.Adopt("vpn/membership", nil); err != nil { // the leader holds none
		t.Fatal(err)
	}
	if standby.held() != nil {
		t.Fatal("the leader removed its membership, the standby kept it")
	}
}

// FuzzReplicaRecord feeds a standby's hub records as the leader's channel would: any bytes under
// the header's or a chunk's key. The readers are strict — what they accept is exactly what the
// leader would encode for it — and a record refused changes nothing.
func FuzzReplicaRecord(f *testing.F) {
	v := testView(testMember(testKey(f, 2), "node-a", 2), testMember(testKey(f, 3), "node-b", 3))
	for _, r := range encodeRecords(v) {
		f.Add(r.key == headerKey, r.value)
	}
	f.Fuzz(func(t *testing.T, header bool, value []byte) {
		if header {
			h, err := readHeader(value)
			if err == nil && !bytes.Equal(appendHeader(nil, h), value) {
				t.Fatalf("header %x read as %+v, which encodes otherwise", value, h)
			}
		} else {
			c, err := readChunk(value)
			if err == nil && !bytes.Equal(appendChunk(nil, c.generation, c.members), value) {
				t.Fatalf("chunk %x read as %+v, which encodes otherwise", value, c)
			}
		}
		h := &Hub{log: zerolog.Nop(), m: newMetrics(), clock: newFakeClock(testNow), sessions: map[[32]byte]*session{}, routes: map[uint32]*session{},
			lastHello: map[[32]byte]int64{}}
		h.standby.Store(true)
		for _, r := range encodeRecords(v) {
			if err := h.Adopt(r.key, r.value); err != nil {
				t.Fatal(err)
			}
		}
		key := headerKey
		if !header {
			key = chunkKey(0)
		}
		before := h.view.Load()
		if err := h.Adopt(key, value); err != nil && h.view.Load() != before {
			t.Fatalf("a refused record (%v) changed the membership", err)
		}
	})
}
