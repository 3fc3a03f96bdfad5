package contracts

import (
	"bytes"
	"encoding/json"
	"testing"

	"code.foss.global/serve.zone/relay/contracts/strictjson"
)

// FuzzReadHoldRuntimeNetworkDnsLeaseRenewalsRequest feeds the hold request reader arbitrary bytes.
// It must never panic, and whatever it accepts must hold every rule it claims to judge: valid
// JSON with exactly the seed's keys (checked against encoding/json as a slow reference), at most
// 32 renewals, each envelope a byte-identical slice of the input whose digest recomputes, windows
// within 15 min, one node, projection, authority and scope, a horizon within 4 h — and
// re-encoding what it read must read back to the same request.
func FuzzReadHoldRuntimeNetworkDnsLeaseRenewalsRequest(f *testing.F) {
	for _, n := range []int{0, 1, 3, 23} {
		h := testRun(f, n, tenMinutes, MaximumDnsLeaseMs)
		f.Add(h.AppendJSON(nil))
	}
	h := testRun(f, 2, tenMinutes, MaximumDnsLeaseMs)
	h.Renewals[1].Renewal.Sequence = 1
	reseal(f, &h, 1)
	f.Add(h.AppendJSON(nil))
	f.Add([]byte(`{"nodeId":"n","projection":{"id":"p","generation":0,"digest":"sha256:` + zeroHex + `"},"renewals":[],"nodeId":"m"}`))
	f.Fuzz(func(t *testing.T, raw []byte) {
		got, err := ReadHoldRuntimeNetworkDnsLeaseRenewalsRequest(raw)
		if err != nil {
			if _, ok := err.(*InvalidError); !ok {
				t.Fatalf("error is not an *InvalidError: %T", err)
			}
			return
		}
		var ref struct {
			NodeID     string                       `json:"nodeId"`
			Projection map[string]json.RawMessage   `json:"projection"`
			Renewals   []map[string]json.RawMessage `json:"renewals"`
		}
		var top map[string]json.RawMessage
		if json.Unmarshal(raw, &top) != nil || len(top) != 3 || json.Unmarshal(raw, &ref) != nil {
			t.Fatalf("accepted what encoding/json does not read as { nodeId, projection, renewals }: %q", raw)
		}
		if ref.NodeID != got.NodeID || !IsClusterNodeID(got.NodeID) || len(ref.Projection) != 3 {
			t.Fatalf("nodeId or projection misread: %q", raw)
		}
		if len(got.Renewals) > MaximumEscrowedRenewals || len(got.Renewals) != len(ref.Renewals) {
			t.Fatalf("%d renewals accepted", len(got.Renewals))
		}
		for i, s := range got.Renewals {
			if len(ref.Renewals[i]) != 3 || !bytes.Contains(raw, s.Raw) {
				t.Fatalf("renewals[%d] is not the exact envelope received", i)
			}
			renewal, ok, err := strictjson.Lookup(s.Raw, "renewal")
			if err != nil || !ok {
				t.Fatalf("renewals[%d] Raw unreadable: %v", i, err)
			}
			again, rs := readSignedRenewal(s.Raw, "again")
			if len(rs) > 0 || !equalRenewal(again.Renewal, s.Renewal) {
				t.Fatalf("renewals[%d] reads differently on its own: %q", i, rs)
			}
			if d, err := ComputeRuntimeNetworkDnsLeaseRenewalDigest(renewal); err != nil || (d == s.Renewal.Digest) == s.Renewal.DigestUnverified ||
				!IsSha256Digest(s.Renewal.Digest) {
				t.Fatalf("renewals[%d] digest %s: recomputes %v, marked unverified %v", i, s.Renewal.Digest, d == s.Renewal.Digest, s.Renewal.DigestUnverified)
			}
			w := s.Renewal.Dns
			if w.ExpiresAt-w.IssuedAt > MaximumDnsLeaseMs {
				t.Fatalf("renewals[%d] window %+v accepted", i, w)
			}
			if s.Renewal.NodeID != got.NodeID || s.Renewal.Projection != got.Projection ||
				!EqualJSON(s.Authority, got.Renewals[0].Authority) || !EqualJSON(s.Renewal.Controller, got.Renewals[0].Renewal.Controller) ||
				s.Renewal.RuntimeNamespace != got.Renewals[0].Renewal.RuntimeNamespace {
				t.Fatalf("renewals[%d] outside the run's one node, projection, authority or scope", i)
			}
		}
		if from, to := got.Span(); len(got.Renewals) > 0 && to-from > MaximumEscrowHorizonMs {
			t.Fatalf("horizon %d ms accepted", to-from)
		}
		// Re-encoding what was read reads back to the same request.
		back, err := ReadHoldRuntimeNetworkDnsLeaseRenewalsRequest(got.AppendJSON(nil))
		if err != nil || back.NodeID != got.NodeID || back.Projection != got.Projection || len(back.Renewals) != len(got.Renewals) {
			t.Fatalf("re-encoded request reads differently: %v", err)
		}
		for i := range back.Renewals {
			if !bytes.Equal(back.Renewals[i].Raw, got.Renewals[i].Raw) || !equalRenewal(back.Renewals[i].Renewal, got.Renewals[i].Renewal) {
				t.Fatalf("renewals[%d] changed on re-encoding", i)
			}
		}
		// Rebuilding each envelope from its parts keeps its digest valid.
		for i := range got.Renewals {
			s := got.Renewals[i]
			s.Raw = nil
			if _, rs := readSignedRenewal(s.AppendJSON(nil), "rebuilt"); len(rs) > 0 {
				t.Fatalf("renewals[%d] rebuilt from its parts is refused: %q", i, rs)
			}
		}
	})
}

func equalRenewal(a, b RuntimeNetworkDnsLeaseRenewal) bool {
	return bytes.Equal(a.Controller, b.Controller) && a.NodeID == b.NodeID && a.RuntimeNamespace == b.RuntimeNamespace &&
		a.Projection == b.Projection && a.Sequence == b.Sequence && a.Dns == b.Dns && a.Digest == b.Digest &&
		a.DigestUnverified == b.DigestUnverified
}
