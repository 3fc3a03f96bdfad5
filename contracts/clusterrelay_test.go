package contracts

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
)

func TestCanonicalOrigins(t *testing.T) {
	for s, want := range map[string]bool{
		"https://relay.cluster-a.serve.zone:8443": true,
		"https://relay.example":                   true,
		"https://192.0.2.17:8443":                 true,
		"https://[2001:db8::1]:8443":              true,
		"https://relay.example/":                  false,
		"https://relay.example:443":               false,
		"https://Relay.example":                   false,
		"https://relay.example/path":              false,
		"https://relay.example?q":                 false,
		"https://relay.example#f":                 false,
		"https://user@relay.example":              false,
		"http://relay.example":                    false,
		"https://relay.example:":                  false,
		"https://relay.example:08443":             false,
		"https://relay.example:65536":             false,
		"https://192.0.2.017":                     false,
		"https://[2001:DB8::1]":                   false,
		"https://-relay.example":                  true, // new URL keeps it: the parser checks no DNS syntax
		"https://":                                false,
	} {
		if IsCanonicalOrigin(s, "https") != want {
			t.Errorf("IsCanonicalOrigin(%q) = %v", s, !want)
		}
	}
	if !IsCanonicalOrigin("http://127.0.0.1:9000", "http") || IsCanonicalOrigin("http://relay.example:80", "http") {
		t.Error("http origins misjudged")
	}
}

func TestValidateClusterRelayAndCertificateName(t *testing.T) {
	if r := ValidateClusterRelay([]byte(`{"origin":"https://relay.cluster-a.serve.zone:8443"}`), ""); len(r) != 0 {
		t.Fatalf("valid block refused: %q", r)
	}
	for raw, want := range map[string]string{
		`{"origin":"https://relay.example:443"}`:               "cluster relay origin must be a canonical https origin",
		`{"origin":"https://relay.example","schemaVersion":1}`: "cluster relay must use its exact schema",
		`null`: "cluster relay must use its exact schema",
		`{"origin":"https://a.example","origin":"https://b.example"}`: "cluster relay must use its exact schema",
	} {
		if r := ValidateClusterRelay([]byte(raw), ""); !slices.Equal(r, []string{want}) {
			t.Errorf("ValidateClusterRelay(%s) = %q, want %q", raw, r, want)
		}
	}
	if got := ClusterRelayCertificateDomainName(ClusterRelay{"https://relay.cluster-a.serve.zone:8443"}); got != "relay.cluster-a.serve.zone" {
		t.Errorf("certificate name = %q", got)
	}
	if got := ClusterRelayCertificateDomainName(ClusterRelay{"https://relay.example"}); got != "relay.example" {
		t.Errorf("certificate name = %q", got)
	}
}

func validRegistration() RegisterClusterRelayRequest {
	return RegisterClusterRelayRequest{
		Protocol:             RelayOffer,
		Relay:                ClusterRelayRegistration{Version: "4.0.0", NodeID: "node-a", ListenAddress: "192.0.2.17", ListenPort: 8443},
		RegistrationSequence: 0,
	}
}

func TestValidateRegisterClusterRelayRequest(t *testing.T) {
	good, _ := json.Marshal(validRegistration())
	if r := ValidateRegisterClusterRelayRequest(good, ""); len(r) != 0 {
		t.Fatalf("valid registration refused: %q\n%s", r, good)
	}
	// The seed's example, exactly (docs/protocol.md#attaching): the encoding is its four relay members.
	const seed = `{"protocol":{"interfacesVersion":"32.36.0","minimumPeerVersion":"32.0.0"},"relay":{"version":"4.0.0","nodeId":"node-a","listenAddress":"192.0.2.17","listenPort":8443},"registrationSequence":0}`
	if string(good) != seed {
		t.Fatalf("registration encodes as\n%s\nwant\n%s", good, seed)
	}
	bad := validRegistration()
	bad.Relay.ListenAddress = "127.0.0.1"
	bad.Relay.NodeID = "node a"
	bad.Relay.Version = "v4"
	bad.Relay.ListenPort = 0
	bad.RegistrationSequence = -1
	b, _ := json.Marshal(bad)
	want := []string{
		"cluster relay registration relay version must be a release version",
		"cluster relay registration relay nodeId must be a cluster node id",
		"cluster relay registration relay listenAddress must be a unicast IPv4 literal that is neither loopback nor link-local",
		"cluster relay registration relay listenPort must be a port from 1 to 65535",
		"cluster relay registration registrationSequence must be a non-negative safe integer",
	}
	if r := ValidateRegisterClusterRelayRequest(b, ""); !slices.Equal(r, want) {
		t.Fatalf("reasons:\n got %q\nwant %q", r, want)
	}
	// Exact-key at every level, as the seed's validator: a member it does not spell refuses the
	// whole registration, the project's old vpnHub guess above all (null or not).
	for _, c := range []struct{ body, want string }{
		{strings.Replace(seed, `{"protocol"`, `{"schemaVersion":1,"protocol"`, 1), "cluster relay registration must use its exact schema"},
		{strings.Replace(seed, `"listenPort":8443}`, `"listenPort":8443,"vpnHub":null}`, 1), "cluster relay registration relay must use its exact schema"},
		{strings.Replace(seed, `"listenPort":8443}`, `"listenPort":8443,"vpnHub":{"address":"192.0.2.1","quicPort":4433,"noisePublicKey":"AQID"}}`, 1),
			"cluster relay registration relay must use its exact schema"},
		{strings.Replace(seed, `,"listenPort":8443`, ``, 1), "cluster relay registration relay must use its exact schema"},
		{strings.Replace(seed, `"registrationSequence":0}`, `"registrationSequence":0,"vpnHub":null}`, 1), "cluster relay registration must use its exact schema"},
	} {
		if r := ValidateRegisterClusterRelayRequest([]byte(c.body), ""); !slices.Equal(r, []string{c.want}) {
			t.Errorf("%s\nreasons %q, want %q", c.body, r, c.want)
		}
	}
}

func TestRegisterClusterVpnHubRequest(t *testing.T) {
	key := [32]byte{1, 2, 3}
	r := ClusterVpnHubReport{Hub: RuntimeNetworkVpnHub{ClusterID: "cluster-a", Address: "192.0.2.1", QUICPort: 4433}, NoisePublicKey: key}
	b := EncodeRegisterClusterVpnHubRequest(r)
	want := `{"hub":{"clusterId":"cluster-a","address":"192.0.2.1","quicPort":4433},"noisePublicKey":"` + EncodeKey32(key) + `"}`
	if string(b) != want {
		t.Fatalf("encoded\n%s\nwant\n%s", b, want)
	}
	got, err := ReadRegisterClusterVpnHubRequest(b)
	if err != nil || got != r {
		t.Fatalf("read back %+v, %v", got, err)
	}
	for _, c := range []struct{ body, want string }{
		{strings.Replace(want, `"quicPort":4433}`, `"quicPort":4433,"noisePublicKey":"x"}`, 1), "cluster vpn hub report hub must use its exact schema"},
		{strings.Replace(want, `{"hub"`, `{"x":1,"hub"`, 1), "cluster vpn hub report must use its exact schema"},
		{strings.Replace(want, `"192.0.2.1"`, `"127.0.0.1"`, 1), "cluster vpn hub report hub address must be a unicast IPv4 literal that is neither loopback nor link-local"},
		{strings.Replace(want, `4433`, `0`, 1), "cluster vpn hub report hub quicPort must be a port from 1 to 65535"},
		{strings.Replace(want, `"cluster-a"`, `"-a"`, 1), "cluster vpn hub report hub clusterId must be a canonical identifier"},
		{strings.Replace(want, EncodeKey32(key), EncodeKey32(key)+"=", 1), "cluster vpn hub report noisePublicKey must be a 32-byte key in base64url without padding"},
	} {
		_, err := ReadRegisterClusterVpnHubRequest([]byte(c.body))
		var inv *InvalidError
		if !errors.As(err, &inv) || !slices.Equal(inv.Reasons, []string{c.want}) {
			t.Errorf("%s\nerr %v, want %q", c.body, err, c.want)
		}
	}
	if !IsRelayCallToCloudly(MethodRegisterClusterVpnHub) {
		t.Error("registerClusterVpnHub is the relay's own call to Cloudly: a node must never send it through the relay")
	}
}

func TestReadClusterRelayConfigPush(t *testing.T) {
	raw := `{"config":{"clusterId":"cluster-a","relay":{"origin":"https://relay.example:8443"},"corestores":[{"nodeId":"-n1","origin":"https://192.0.2.17:7443"}]}}`
	cfg, err := ReadClusterRelayConfigPush([]byte(raw), false)
	if err != nil || cfg.ClusterID != "cluster-a" || cfg.Relay == nil || cfg.Relay.Origin != "https://relay.example:8443" ||
		len(cfg.Corestores) != 1 || cfg.Corestores[0].NodeID != "-n1" {
		t.Fatalf("cfg = %+v, %v", cfg, err)
	}
	cfg, err = ReadClusterRelayConfigPush([]byte(`{"config":{"clusterId":"c","relay":null,"corestores":[]}}`), false)
	if err != nil || cfg.Relay != nil {
		t.Fatalf("disabled relay: %+v %v", cfg, err)
	}
	httpCore := `{"config":{"clusterId":"c","relay":null,"corestores":[{"nodeId":"n","origin":"http://127.0.0.1:7000"}]}}`
	if _, err := ReadClusterRelayConfigPush([]byte(httpCore), true); err != nil {
		t.Fatalf("http corestore with allowHTTP: %v", err)
	}
	_, err = ReadClusterRelayConfigPush([]byte(httpCore), false)
	var inv *InvalidError
	if !errors.As(err, &inv) || !slices.Equal(inv.Reasons, []string{"cluster relay config corestores[0] origin must be a canonical https origin"}) {
		t.Fatalf("http corestore without allowHTTP: %v", err)
	}
	dup := `{"config":{"clusterId":"c","relay":null,"corestores":[{"nodeId":"n","origin":"https://a.example"},{"nodeId":"n","origin":"https://b.example"}]}}`
	if _, err := ReadClusterRelayConfigPush([]byte(dup), false); err == nil || !strings.Contains(err.Error(), "corestores[1] nodeId must be unique") {
		t.Fatalf("duplicate node: %v", err)
	}
	if _, err := ReadClusterRelayConfigPush([]byte(`{"config":{}}`), false); err == nil || err.Error() != "cluster relay config must be an object carrying clusterId and relay" {
		t.Fatalf("empty config: %v", err)
	}
	// The relay block is seed-spelled (validateClusterRelay): exact, even inside a tolerant push.
	if _, err := ReadClusterRelayConfigPush([]byte(`{"config":{"clusterId":"c","relay":{"origin":"https://r.example","x":1}}}`), false); err == nil ||
		err.Error() != "cluster relay config relay must use its exact schema" {
		t.Fatalf("relay block with an unknown member: %v", err)
	}

	// The push is project-defined (docs/protocol.md#relay-configuration-push): what the relay does not use is ignored, and
	// corestores may be absent (or null): none then.
	t.Run("unknown members are ignored and corestores is optional", func(t *testing.T) {
		raw := `{"config":{"clusterId":"cluster-a","generation":4,"relay":{"origin":"https://relay.example:8443"},` +
			`"corestores":[{"nodeId":"n1","origin":"https://192.0.2.17:7443","version":"1.2.3"}]},"pushedAt":1700000000000}`
		cfg, err := ReadClusterRelayConfigPush([]byte(raw), false)
		if err != nil || cfg.ClusterID != "cluster-a" || cfg.Relay == nil || len(cfg.Corestores) != 1 || cfg.Corestores[0].Origin != "https://192.0.2.17:7443" {
			t.Fatalf("cfg = %+v, %v", cfg, err)
		}
		for _, raw := range []string{`{"config":{"clusterId":"c","relay":null}}`, `{"config":{"clusterId":"c","relay":null,"corestores":null}}`} {
			if cfg, err := ReadClusterRelayConfigPush([]byte(raw), false); err != nil || cfg.Corestores != nil || cfg.Relay != nil {
				t.Fatalf("%s: %+v, %v", raw, cfg, err)
			}
		}
		if _, err := ReadClusterRelayConfigPush([]byte(`{"config":{"clusterId":"c","corestores":[]}}`), false); err == nil {
			t.Fatal("a config without relay read: the relay cannot tell whether it is enabled")
		}
	})
}

func TestReadRegisterClusterRelayResponse(t *testing.T) {
	offer := `{"interfacesVersion":"32.36.0","minimumPeerVersion":"32.0.0"}`
	a, err := ReadRegisterClusterRelayResponse([]byte(`{"protocol":`+offer+`,"origin":"https://relay.example:8443"}`), false)
	if err != nil || a.Protocol != RelayOffer || a.Origin != "https://relay.example:8443" {
		t.Fatalf("%+v %v", a, err)
	}
	// The answer's keys are this project's guess: origin is optional, an origin the relay
	// cannot use is not recorded, unknown members are ignored; only the offer is required.
	t.Run("origin is optional and unknown members are ignored", func(t *testing.T) {
		for body, origin := range map[string]string{
			`{"protocol":` + offer + `}`: "",
			`{"protocol":` + offer + `,"origin":"https://relay.example","cluster":{"id":"c"},"sequence":3}`: "https://relay.example",
			`{"origin":"https://relay.example/path","protocol":` + offer + `}`:                              "",
			`{"protocol":` + offer + `,"origin":null}`:                                                      "",
			`{"protocol":` + offer + `,"origin":"http://127.0.0.1:8443"}`:                                   "",
		} {
			a, err := ReadRegisterClusterRelayResponse([]byte(body), false)
			if err != nil || a.Protocol != RelayOffer || a.Origin != origin {
				t.Errorf("%s: %+v %v, want origin %q", body, a, err, origin)
			}
		}
		if a, err := ReadRegisterClusterRelayResponse([]byte(`{"protocol":`+offer+`,"origin":"http://127.0.0.1:8443"}`), true); err != nil || a.Origin != "http://127.0.0.1:8443" {
			t.Errorf("http origin with allowHTTP: %+v %v", a, err)
		}
	})
	for _, body := range []string{`{"origin":"https://relay.example"}`, `{"protocol":{"interfacesVersion":"32.36.0"}}`, `[]`,
		`{"protocol":` + offer + `,"protocol":` + offer + `}`} {
		if _, err := ReadRegisterClusterRelayResponse([]byte(body), false); err == nil {
			t.Errorf("%s read", body)
		}
	}
	// The sim encodes an answer without origin by leaving it out.
	if b, _ := json.Marshal(RegisterClusterRelayResponse{Protocol: RelayOffer}); strings.Contains(string(b), "origin") {
		t.Errorf("empty origin encoded: %s", b)
	}
}

func TestEncodeCloudlyClientSessionRequest(t *testing.T) {
	jwt := NewSecret("eyJhbGciOi.secret.jwt")
	b := EncodeCloudlyClientSessionRequest(RelayOffer, jwt)
	if string(b) != `{"protocol":{"interfacesVersion":"32.36.0","minimumPeerVersion":"32.0.0"},"jwt":"eyJhbGciOi.secret.jwt"}` {
		t.Fatalf("%s", b)
	}
}

func TestSecretNeverPrints(t *testing.T) {
	s := NewSecret("hunter2-bearer")
	for _, out := range []string{fmt.Sprint(s), fmt.Sprintf("%v %+v %#v %s %q %x", s, s, s, s, s, s), fmt.Sprint(struct{ S Secret }{s})} {
		if strings.Contains(out, "hunter2") {
			t.Fatalf("secret printed: %s", out)
		}
	}
	if _, err := json.Marshal(struct{ S Secret }{s}); !errors.Is(err, ErrSecretMarshal) {
		t.Fatalf("json.Marshal of a secret: %v", err)
	}
}

func TestKey32(t *testing.T) {
	k := [32]byte{0xff, 1, 2}
	s := EncodeKey32(k)
	back, err := DecodeKey32(s)
	if err != nil || back != k || len(s) != 43 {
		t.Fatalf("round trip %q: %v", s, err)
	}
	zero := EncodeKey32([32]byte{})
	for _, bad := range []string{s + "=", zero[:42] + "B" /* stray bits */, zero[:42], zero + "A", strings.Repeat("/", 43)} {
		if IsKey32(bad) {
			t.Errorf("non-canonical key %q accepted", bad)
		}
	}
}
