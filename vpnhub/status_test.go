package vpnhub

import (
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"net/netip"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"code.foss.global/serve.zone/relay/contracts"
)

// TestStatusShowsMembersSessionsAndDropsByReason: members join, one sends a spoofed packet and
// one to a member who never joined, then a membership push removes one; the status and the
// counters the status page lists follow, and the status never shows a key.
func TestStatusShowsMembersSessionsAndDropsByReason(t *testing.T) {
	th := startHub(t, nil)
	if st := hubStatus(t, th, nil); st.Generation != -1 || st.Members != 0 || st.Sessions != 0 {
		t.Fatalf("before any membership: %+v", st)
	}
	ka, kb, kc := testKey(t, 2), testKey(t, 3), testKey(t, 4)
	th.push(t, 1, testMember(ka, "node-a", 2), testMember(kb, "node-b", 3), testMember(kc, "node-c", 4))
	a := th.mustDial(t, ka, "node-a")
	b := th.mustDial(t, kb, "node-b")
	keys := [][32]byte{ka.Public, kb.Public, kc.Public, ka.Private(), kb.Private(), kc.Private(), th.key.Private()}
	st := hubStatus(t, th, keys)
	if st.Generation != 1 || st.Members != 3 || st.Sessions != 2 || testutil.ToFloat64(th.m.handshakes.WithLabelValues(outcomeAccepted)) != 2 {
		t.Fatalf("two of three members joined: %+v", st)
	}

	a.WritePacket(ipv4Packet(addrB, addrB, []byte("a pretending to be b")))
	a.WritePacket(ipv4Packet(addrA, netip.MustParseAddr("10.64.0.4"), []byte("to node-c, who never joined")))
	eventually(t, "a spoofed and an unknown-destination drop", func() bool {
		return testutil.ToFloat64(th.m.dropBy[dropSpoofed]) == 1 && testutil.ToFloat64(th.m.dropBy[dropUnknownDest]) == 1
	})
	if n := testutil.CollectAndCount(th.m.drops); testutil.ToFloat64(th.m.dropBy[dropReplayed]) != 0 || n != int(dropReasons)-1 {
		t.Fatalf("%d drop series: want every reason listed, only the two counted", n)
	}

	th.push(t, 2, testMember(ka, "node-a", 2), testMember(kc, "node-c", 4))
	if err := waitClosed(t, b); !errors.Is(err, contracts.VPNMemberRemoved) {
		t.Fatalf("node-b ended with %v", err)
	}
	st = hubStatus(t, th, keys)
	if st.Generation != 2 || st.Members != 2 || st.Sessions != 1 ||
		testutil.ToFloat64(th.m.closes.WithLabelValues(string(contracts.VPNMemberRemoved))) != 1 {
		t.Fatalf("after node-b was removed: %+v", st)
	}
}

// hubStatus is the hub's Status, checked to marshal without any of keys in any usual encoding.
func hubStatus(t *testing.T, th *testHub, keys [][32]byte) Status {
	t.Helper()
	st, ok := th.Status().(Status)
	if !ok {
		t.Fatalf("Status() is a %T", th.Status())
	}
	out, err := json.Marshal(st)
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range keys {
		for _, enc := range []string{contracts.EncodeKey32(k), base64.StdEncoding.EncodeToString(k[:]), hex.EncodeToString(k[:]),
			contracts.ShortKey(k)} {
			if strings.Contains(string(out), enc) {
				t.Fatalf("the status shows a key (%s): %s", enc, out)
			}
		}
	}
	return st
}
