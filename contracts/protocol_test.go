package contracts

import (
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"testing"
)

func TestParseVersionGrammar(t *testing.T) {
	for _, s := range []string{"0.0.0", "32.0.0", "32.10.0", "9007199254740991.0.1"} {
		if !IsReleaseVersion(s) {
			t.Errorf("%q refused", s)
		}
	}
	for _, s := range []string{"v32.0.0", "32.0", "032.0.0", "32.00.0", "32.0.0-rc.1", "32.0.0+build", "32.0.0.0",
		"", "32..0", " 32.0.0", "32.0.0 ", "-1.0.0", "32.0.x", "9007199254740992.0.0", "１.0.0"} {
		if IsReleaseVersion(s) {
			t.Errorf("%q accepted", s)
		}
	}
}

func TestVersionsCompareNumerically(t *testing.T) {
	a, _ := ParseVersion("32.10.0")
	b, _ := ParseVersion("32.9.0")
	if a.Compare(b) <= 0 || b.Compare(a) >= 0 || a.Compare(a) != 0 {
		t.Fatal("32.10.0 must be above 32.9.0")
	}
}

func TestCreateProtocolOfferRefusesABadMinimum(t *testing.T) {
	if _, err := CreateProtocolOffer("32.36.0", "33.0.0"); err == nil {
		t.Error("a minimum in another major was accepted")
	}
	if _, err := CreateProtocolOffer("32.36.0", "32.37.0"); err == nil {
		t.Error("a minimum above the installed release was accepted")
	}
	if RelayOffer.InterfacesVersion != "32.36.0" || RelayOffer.MinimumPeerVersion != "32.0.0" {
		t.Errorf("RelayOffer = %+v", RelayOffer)
	}
}

func TestValidateProtocolOfferReasons(t *testing.T) {
	cases := []struct {
		raw  string
		want []string
	}{
		{`{"interfacesVersion":"32.36.0","minimumPeerVersion":"32.0.0"}`, nil},
		{`{"minimumPeerVersion":"32.0.0","interfacesVersion":"32.36.0"}`, nil},
		{`"32.36.0"`, []string{"protocol offer must use its exact schema"}},
		{`null`, []string{"protocol offer must use its exact schema"}},
		{`[]`, []string{"protocol offer must use its exact schema"}},
		{`{"interfacesVersion":"32.36.0"}`, []string{"protocol offer must use its exact schema"}},
		{`{"interfacesVersion":"32.36.0","minimumPeerVersion":"32.0.0","extra":1}`, []string{"protocol offer must use its exact schema"}},
		// An accessor serialized by a peer arrives as an object: it is not a string, so not the schema.
		{`{"interfacesVersion":{"get":"32.36.0"},"minimumPeerVersion":"32.0.0"}`, []string{"protocol offer must use its exact schema"}},
		{`{"get":{},"set":{}}`, []string{"protocol offer must use its exact schema"}},
		{`{"interfacesVersion":"32.36.0","interfacesVersion":"32.36.0"}`, []string{"protocol offer must use its exact schema"}},
		{`{"interfacesVersion":"v32.0.0","minimumPeerVersion":"32.0"}`, []string{
			"protocol offer interfacesVersion must be a release version",
			"protocol offer minimumPeerVersion must be a release version"}},
		{`{"interfacesVersion":"32.0.0","minimumPeerVersion":"31.0.0"}`, []string{"protocol offer minimumPeerVersion must be in the major of interfacesVersion"}},
		{`{"interfacesVersion":"32.0.0","minimumPeerVersion":"32.0.1"}`, []string{"protocol offer minimumPeerVersion must not be above interfacesVersion"}},
	}
	for _, c := range cases {
		if got := ValidateProtocolOffer([]byte(c.raw), ""); !slices.Equal(got, c.want) {
			t.Errorf("ValidateProtocolOffer(%s) = %q, want %q", c.raw, got, c.want)
		}
	}
}

func TestValidateProtocolOfferOnReadsTheProtocolKeyAsData(t *testing.T) {
	cases := []struct {
		body string
		want []string
	}{
		{`{"protocol":{"interfacesVersion":"32.1.0","minimumPeerVersion":"32.0.0"},"rest":{"anything":1}}`, nil},
		{`{"rest":1}`, []string{"body protocol must use its exact schema"}},
		{`{"protocol":"32.1.0"}`, []string{"body protocol must use its exact schema"}},
		{`{"protocol":{"get":"x"}}`, []string{"body protocol must use its exact schema"}},
		{`[{"protocol":{}}]`, []string{"body protocol must use its exact schema"}},
		{`{"protocol":{"interfacesVersion":"32.1.0","minimumPeerVersion":"32.0.0"},"protocol":{"interfacesVersion":"33.0.0","minimumPeerVersion":"33.0.0"}}`,
			[]string{"body protocol must use its exact schema"}},
	}
	for _, c := range cases {
		if got := ValidateProtocolOfferOn([]byte(c.body), ""); !slices.Equal(got, c.want) {
			t.Errorf("ValidateProtocolOfferOn(%s) = %q, want %q", c.body, got, c.want)
		}
	}
}

func TestReadProtocolOffer(t *testing.T) {
	o, err := ReadProtocolOffer([]byte(`{"bearer":"x","protocol":{"interfacesVersion":"32.9.0","minimumPeerVersion":"32.0.0"}}`))
	if err != nil || o.InterfacesVersion != "32.9.0" || o.MinimumPeerVersion != "32.0.0" {
		t.Fatalf("ReadProtocolOffer = %+v, %v", o, err)
	}
	_, err = ReadProtocolOffer([]byte(`{"protocol":{"interfacesVersion":"032.0.0","minimumPeerVersion":"32.0.0"}}`))
	var inv *InvalidError
	if !errors.As(err, &inv) || !slices.Equal(inv.Reasons, []string{"body protocol interfacesVersion must be a release version"}) {
		t.Fatalf("ReadProtocolOffer err = %v", err)
	}
}

func offer(iv, mv string) ProtocolOffer { return ProtocolOffer{iv, mv} }

func TestNegotiateProtocolOrder(t *testing.T) {
	cases := []struct {
		local, remote ProtocolOffer
		want          ProtocolIncompatibility
	}{
		{offer("32.36.0", "32.0.0"), offer("32.0.0", "32.0.0"), ""},
		{offer("32.36.0", "32.0.0"), offer("32.40.0", "32.36.0"), ""},
		// Different majors are major-mismatch even when a minimum would also fail.
		{offer("32.36.0", "32.30.0"), offer("33.0.0", "33.0.0"), MajorMismatch},
		{offer("32.36.0", "32.30.0"), offer("31.9.0", "31.0.0"), MajorMismatch},
		{offer("32.36.0", "32.30.0"), offer("32.29.9", "32.0.0"), PeerBelowMinimum},
		{offer("32.36.0", "32.0.0"), offer("32.40.0", "32.37.0"), SelfBelowPeerMinimum},
		{offer("32.9.0", "32.0.0"), offer("32.10.0", "32.10.0"), SelfBelowPeerMinimum},
	}
	for _, c := range cases {
		r, err := NegotiateProtocol(c.local, c.remote)
		if err != nil {
			t.Fatal(err)
		}
		switch {
		case c.want == "" && r != nil:
			t.Errorf("%v vs %v: refused %s", c.local, c.remote, r.Reason)
		case c.want != "" && (r == nil || r.Reason != c.want):
			t.Errorf("%v vs %v: got %+v, want %s", c.local, c.remote, r, c.want)
		case r != nil && (r.Code != ProtocolIncompatibleCode || r.Refusing != c.local || r.Refused != c.remote):
			t.Errorf("refusal = %+v", r)
		}
	}
	if _, err := NegotiateProtocol(RelayOffer, offer("v32.0.0", "32.0.0")); err == nil {
		t.Error("NegotiateProtocol accepted an offer that names no release version")
	}
	if got := ProtocolIncompatibilities(); got != [3]ProtocolIncompatibility{"major-mismatch", "peer-below-minimum", "self-below-peer-minimum"} {
		t.Errorf("ProtocolIncompatibilities = %v", got)
	}
}

func TestProtocolRefusalRoundTrip(t *testing.T) {
	r, _ := NegotiateProtocol(RelayOffer, offer("33.1.0", "33.0.0"))
	desc := DescribeProtocolRefusal(*r)
	if !strings.HasPrefix(desc, "protocol-incompatible: major-mismatch: ") || !strings.Contains(desc, "33.1.0") || !strings.Contains(desc, "32.36.0") {
		t.Fatalf("description = %q", desc)
	}
	data := r.Data()
	if string(data) != `{"code":"protocol-incompatible","reason":"major-mismatch","refusing":{"interfacesVersion":"32.36.0","minimumPeerVersion":"32.0.0"},"refused":{"interfacesVersion":"33.1.0","minimumPeerVersion":"33.0.0"}}` {
		t.Fatalf("data = %s", data)
	}
	back, ok := ReadProtocolRefusal(data)
	if !ok || back != *r {
		t.Fatalf("ReadProtocolRefusal = %+v, %v", back, ok)
	}
	for _, bad := range []string{`null`, `{"code":"protocol-incompatible"}`, strings.Replace(string(data), "major-mismatch", "other", 1),
		strings.Replace(string(data), `"code":"protocol-incompatible"`, `"code":"x"`, 1), `{"code":"relay-node-busy"}`} {
		if _, ok := ReadProtocolRefusal([]byte(bad)); ok {
			t.Errorf("ReadProtocolRefusal(%s) accepted", bad)
		}
	}
	if got := ReadRefusalName(desc, data); got != "" && got != ProtocolIncompatibleCode {
		t.Errorf("ReadRefusalName = %q", got)
	}
}

func TestOfferMarshalsInSeedOrder(t *testing.T) {
	b, _ := json.Marshal(RelayOffer)
	if string(b) != `{"interfacesVersion":"32.36.0","minimumPeerVersion":"32.0.0"}` {
		t.Fatalf("%s", b)
	}
}
