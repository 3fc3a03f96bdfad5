package contracts

import (
	"bytes"
	"encoding/json"
	"slices"
	"testing"
	"unicode/utf8"

	"code.foss.global/serve.zone/relay/contracts/strictjson"
)

// FuzzReadProtocolOffer reads arbitrary bodies the way every carrier reads a peer's offer.
func FuzzReadProtocolOffer(f *testing.F) {
	for _, s := range []string{
		`{"protocol":{"interfacesVersion":"32.36.0","minimumPeerVersion":"32.0.0"}}`,
		`{"protocol":{"interfacesVersion":"33.0.0","minimumPeerVersion":"33.0.0"},"bearer":"x"}`,
		`{"protocol":{"get":1}}`, `{"protocol":"32.0.0"}`, `{"protocol":{"interfacesVersion":"032.0.0","minimumPeerVersion":"32.0.0"}}`,
		`{"protocol":{"interfacesVersion":"32.0.0","minimumPeerVersion":"32.0.0"},"protocol":{}}`, `[]`, `null`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		o, err := ReadProtocolOffer(body)
		reasons := ValidateProtocolOfferOn(body, "")
		if (err == nil) != (len(reasons) == 0) {
			t.Fatalf("ReadProtocolOffer and ValidateProtocolOfferOn disagree on %q: %v / %q", body, err, reasons)
		}
		if err != nil {
			return
		}
		r, nerr := NegotiateProtocol(RelayOffer, o)
		if nerr != nil {
			t.Fatalf("a read offer failed negotiation as malformed: %+v: %v", o, nerr)
		}
		if r != nil {
			if back, ok := ReadProtocolRefusal(r.Data()); !ok || back != *r {
				t.Fatalf("refusal does not round-trip: %+v", r)
			}
		}
		b, _ := json.Marshal(struct {
			Protocol ProtocolOffer `json:"protocol"`
		}{o})
		if o2, err := ReadProtocolOffer(b); err != nil || o2 != o {
			t.Fatalf("offer does not round-trip: %+v -> %s", o, b)
		}
	})
}

// FuzzRelayReaders runs every reader the relay applies to a peer's body before forwarding or
// acting on it: the session node id of a node → Cloudly request, the route of a Cloudly → node
// request, a node registration answer, the relay's own registration answer, a configuration push
// and a relay registration.
func FuzzRelayReaders(f *testing.F) {
	for _, s := range []string{
		`{"session":{"nodeId":"node-a","controller":{"kind":"cloudly"},"runtimeNamespace":"rt-1"},"protocol":{"interfacesVersion":"32.36.0","minimumPeerVersion":"32.0.0"}}`,
		`{"session":{"nodeId":"-b"},"nodeId":"c"}`, `{"nodeId":"n"}`, `{"session":"x"}`, `{"session":{"nodeId":7}}`,
		`{"config":{"clusterId":"c","relay":{"origin":"https://r.example"},"corestores":[{"nodeId":"n","origin":"https://c.example:7443"}]}}`,
		`{"protocol":{"interfacesVersion":"32.36.0","minimumPeerVersion":"32.0.0"},"relay":{"version":"1.0.0","nodeId":"n","listenAddress":"192.0.2.1","listenPort":1},"registrationSequence":0}`,
		`{"session":{"nodeId":"a","nodeId":"b"}}`,
		`{"hub":{"clusterId":"c","address":"192.0.2.1","quicPort":4433},"noisePublicKey":"AQIDAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"}`,
		`{"protocol":{"interfacesVersion":"32.36.0","minimumPeerVersion":"32.0.0"},"origin":"https://relay.example:8443","x":1}`,
		`{"protocol":{"interfacesVersion":"32.36.0","minimumPeerVersion":"32.0.0"},"origin":"http://127.0.0.1:9"}`,
		`{"config":{"clusterId":"c","relay":null,"corestores":null,"x":[1]}}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		if node, present, err := ReadSessionNodeID(body); err == nil && present && !utf8.ValidString(node) {
			t.Fatalf("session node id is not valid UTF-8: %q", node)
		}
		if node, ok, err := ReadRouteNodeID(body); err == nil && ok {
			if strictjson.Valid(body) != nil {
				t.Fatalf("routed by a body that is not valid JSON: %q", body)
			}
			_ = IsClusterNodeID(node)
		}
		if s, err := ReadRegisterPalletRuntimeSessionResponse(body); err == nil {
			if !IsClusterNodeID(s.NodeID) || s.RuntimeNamespace != "" && !IsCanonicalID(s.RuntimeNamespace) ||
				s.Controller != nil && strictjson.KindOf(s.Controller) != strictjson.KindObject || strictjson.Valid(s.Raw) != nil {
				t.Fatalf("accepted a session the rules refuse: %+v", s)
			}
		}
		for _, allowHTTP := range []bool{false, true} {
			if a, err := ReadRegisterClusterRelayResponse(body, allowHTTP); err == nil {
				if a.Origin != "" && !(IsCanonicalOrigin(a.Origin, "https") || allowHTTP && IsCanonicalOrigin(a.Origin, "http")) {
					t.Fatalf("recorded an origin the rules refuse: %q", a.Origin)
				}
				if _, err := NegotiateProtocol(RelayOffer, a.Protocol); err != nil {
					t.Fatalf("read an offer that is not one: %+v", a.Protocol)
				}
			}
		}
		for _, allowHTTP := range []bool{false, true} {
			if cfg, err := ReadClusterRelayConfigPush(body, allowHTTP); err == nil {
				for _, c := range cfg.Corestores {
					if !IsClusterNodeID(c.NodeID) || !(IsCanonicalOrigin(c.Origin, "https") || allowHTTP && IsCanonicalOrigin(c.Origin, "http")) {
						t.Fatalf("accepted a corestore the rules refuse: %+v", c)
					}
				}
			}
		}
		_ = ValidateRegisterClusterRelayRequest(body, "")
		// The hub report is read exactly: what it accepts encodes back to the same value.
		if r, err := ReadRegisterClusterVpnHubRequest(body); err == nil {
			again, err := ReadRegisterClusterVpnHubRequest(EncodeRegisterClusterVpnHubRequest(r))
			if err != nil || again != r {
				t.Fatalf("hub report %+v does not survive its encoding: %+v %v", r, again, err)
			}
		}
	})
}

// registrationMessages are every reason ValidateClusterIngressRegistration may give with its
// default path: fixed texts, so no reason can carry a value from the body (the bearer above all).
var registrationMessages = map[string]bool{
	"cluster ingress registration must use its exact schema":                                             true,
	"cluster ingress registration bearer must be a string":                                               true,
	"cluster ingress registration version must be a string":                                              true,
	"cluster ingress registration nodeId must be a cluster node id":                                      true,
	"cluster ingress registration capabilities must be an array of strings":                              true,
	"cluster ingress registration protocol must use its exact schema":                                    true,
	"cluster ingress registration protocol interfacesVersion must be a release version":                  true,
	"cluster ingress registration protocol minimumPeerVersion must be a release version":                 true,
	"cluster ingress registration protocol minimumPeerVersion must be in the major of interfacesVersion": true,
	"cluster ingress registration protocol minimumPeerVersion must not be above interfacesVersion":       true,
}

// FuzzReadClusterIngressRegistration reads arbitrary bodies the way the relay reads an ingress
// registration: the reader and the validator agree, every reason is a fixed text, and an accepted
// registration re-encodes to the same JSON value.
func FuzzReadClusterIngressRegistration(f *testing.F) {
	for _, s := range []string{
		`{"bearer":"b","version":"3.0.0","nodeId":"node-a","protocol":{"interfacesVersion":"32.36.0","minimumPeerVersion":"32.0.0"}}`,
		`{"bearer":"b\u00e9","version":"3.0.0","nodeId":"_a","capabilities":["a","b-1"],"protocol":{"interfacesVersion":"32.0.0","minimumPeerVersion":"32.0.0"}}`,
		`{"bearer":"","version":"03.0.0","nodeId":"a b","capabilities":["b","a"],"protocol":{"interfacesVersion":"33.0.0","minimumPeerVersion":"34.0.0"}}`,
		`{"protocol":{"interfacesVersion":"32.36.0","minimumPeerVersion":"32.0.0"}}`,
		`{"bearer":"b","version":"3.0.0","nodeId":"n","protocol":{"interfacesVersion":"32.36.0","minimumPeerVersion":"32.0.0"},"protocol":{}}`,
		`{"bearer":"b","version":"3.0.0","nodeId":"n","capabilities":null,"protocol":{"interfacesVersion":"32.36.0","minimumPeerVersion":"32.0.0"}}`,
		`[]`, `null`, `{"bearer":"\ud800"}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		r, err := ReadClusterIngressRegistration(body)
		reasons := ValidateClusterIngressRegistration(body, "")
		if (err == nil) != (len(reasons) == 0) {
			t.Fatalf("reader and validator disagree on %q: %v / %q", body, err, reasons)
		}
		for _, reason := range reasons {
			if !registrationMessages[reason] {
				t.Fatalf("reason %q is not a fixed message", reason)
			}
		}
		if err != nil {
			return
		}
		if !IsClusterNodeID(r.NodeID) {
			t.Fatalf("accepted an invalid registration: %q", body)
		}
		enc := EncodeClusterIngressRegistration(r)
		if !EqualJSON(enc, body) {
			t.Fatalf("re-encoding changed the value: %q -> %q", body, enc)
		}
		if r2, err := ReadClusterIngressRegistration(enc); err != nil || r2.Bearer.Reveal() != r.Bearer.Reveal() ||
			r2.NodeID != r.NodeID || r2.Protocol != r.Protocol || !slices.Equal(r2.Capabilities, r.Capabilities) {
			t.Fatalf("does not round-trip: %q -> %q (%v)", body, enc, err)
		}
	})
}

// FuzzIngressReaders reads arbitrary bodies as the relay reads what crosses it for the ingress: a
// route table push or pull answer and an ingress's statistics page. A table keeps its bytes and
// has a safe revision, derived exactly when it states none; a page holds at most limit buckets,
// each exactly as it arrived, with only a real calendar day read as its day.
func FuzzIngressReaders(f *testing.F) {
	for _, s := range []string{
		`{"table":{"revision":7,"routes":[]}}`, `{"table":null}`, `{"table":{"routes":[]}}`, `{"table":[1]}`,
		`{"table":{"revision":1,"revision":2}}`, `{"table":{"revision":-1}}`, `{"table":"x","extra":1}`,
		`{"statistics":[{"dayUtc":"2024-05-02","nodeId":"a"},{"nodeId":7},1,{"dayUtc":"2024-02-30"}],"nextCursor":"c"}`,
		`{"statistics":[{"dayUtc":"2024-05-02","dayUtc":"2024-05-03"}]}`, `{"statistics":[],"nextCursor":null}`,
	} {
		f.Add([]byte(s))
	}
	req := TrafficStatisticsRequest{FromDayUTC: "2024-05-01", ToDayUTC: "2024-05-31", Limit: 3}
	f.Fuzz(func(t *testing.T, body []byte) {
		if tbl, err := ReadPushClusterRouteTableRequest(body); err == nil && !tbl.IsNull() {
			if strictjson.Valid(tbl.Raw) != nil || !bytes.Contains(body, tbl.Raw) || tbl.Revision < 0 || tbl.Revision > strictjson.MaxSafeInteger {
				t.Fatalf("table %+v from %q", tbl, body)
			}
			stated, ok, _ := strictjson.Lookup(tbl.Raw, "revision")
			n, counter := strictjson.ReadCounter(stated)
			if tbl.Derived == (ok && counter) || !tbl.Derived && n != tbl.Revision || tbl.Derived && tbl.Revision != DeriveRouteTableRevision(tbl.Raw) {
				t.Fatalf("revision misread: %+v from %q", tbl, body)
			}
		}
		page, err := ReadGetClusterTrafficStatisticsResponse(body, req)
		if err != nil {
			return
		}
		if len(page.Buckets) > req.Limit || page.NextCursor != "" && !IsTrafficStatisticsCursor(page.NextCursor) {
			t.Fatalf("page %+v from %q", page, body)
		}
		for _, b := range page.Buckets {
			if strictjson.Valid(b.Raw) != nil || !bytes.Contains(body, b.Raw) || b.Day != "" && !IsUTCCalendarDay(b.Day) ||
				b.Object && strictjson.KindOf(b.Raw) != strictjson.KindObject || !b.Object && (b.Day != "" || b.NodeStated) {
				t.Fatalf("bucket %+v from %q", b, body)
			}
		}
	})
}
