package contracts

import (
	"encoding/json"
	"os"
	"strings"
	"testing"
)

// TestIsCanonicalOriginRefusesWhatURLRewrites: the seed's rule for IClusterRelay.origin is
// "so that `new URL(origin).origin === origin`" (seeds/001_77c140022293acc0.txt, the Cluster
// Relay Block: "It must be an `https:` origin with no path, query, fragment, userinfo or trailing
// slash"). Each origin below is one the WHATWG parser rewrites — checked with Node 'new URL(o).origin':
//
//	https://[::ffff:1.2.3.4] → https://[::ffff:102:304]  (IPv6 pieces serialize in hex only)
//	https://1.2.3.4.         → https://1.2.3.4           (a host ending in a number is IPv4; the dot goes)
//	https://10.0.0.1.        → https://10.0.0.1
func TestIsCanonicalOriginRefusesWhatURLRewrites(t *testing.T) {
	for _, o := range []string{"https://[::ffff:1.2.3.4]", "https://[::ffff:1.2.3.4]:8443", "https://1.2.3.4.", "https://10.0.0.1.:8443"} {
		if IsCanonicalOrigin(o, "https") {
			t.Errorf("IsCanonicalOrigin(%q) = true, but new URL rewrites it", o)
		}
		if r := ValidateClusterRelay([]byte(`{"origin":"`+o+`"}`), ""); len(r) == 0 {
			t.Errorf("ValidateClusterRelay accepted origin %q", o)
		}
	}
	// What URL keeps as it is stays canonical.
	for _, o := range []string{"https://[::ffff:102:304]", "https://1.2.3.4", "https://relay.example.", "https://[2001:db8::1]:8443"} {
		if !IsCanonicalOrigin(o, "https") {
			t.Errorf("IsCanonicalOrigin(%q) = false, but new URL keeps it", o)
		}
	}
}

// TestIsCanonicalOriginKeepsWhatURLKeeps: the seed's rule is the URL parser's, which checks no DNS
// syntax, so the relay refuses no origin a Cloudly that validated it can send. Each origin below
// and its verdict was checked with Node 20's new URL(o).origin === o.
func TestIsCanonicalOriginKeepsWhatURLKeeps(t *testing.T) {
	for o, want := range map[string]bool{
		"https://relay_1.example": true, "https://-a.example": true, "https://a-.example": true,
		"https://" + strings.Repeat("a", 70) + ".example": true, "https://a..b": true, "https://.a": true, "https://a..": true,
		"https://a!b.example": true, "https://a$b.example": true, "https://a*b.example": true, "https://a~b.example": true,
		"https://a\"b.example": true, "https://a{b.example": true, "https://a`b.example": true, "https://a,b.example": true,
		"https://a;b.example": true, "https://a=b.example": true, "https://a&b.example": true, "https://a(b.example": true,
		"https://a+b.example": true, "https://a'b.example": true, "https://xn--nxasmq6b.example": true,
		"https://1abc": true, "https://a.1abc": true, "https://0x.a": true, "https://a.b.": true,
		"https://a:0": true, "https://1.2.3.4:0": true, "https://a:65535": true,
		"https://0x7f.0.0.1": false, "https://A.example": false, "https://a%41.example": false, "https://ex%ample.com": false,
		"https://a.0x": false, "https://a.0x1": false, "https://a.09": false, "https://a.b.1.": false, "https://1.2.3": false,
		"https://01.2.3.4": false, "https://4294967295": false, "https://a.B": false, "https://a|b": false, "https://a^b": false,
		"https://a:00": false, "https://a:65536": false, "https://a:443": false, "https://a:": false, "https://a\\b": false,
		"https://\u00e9.example": false,
	} {
		if got := IsCanonicalOrigin(o, "https"); got != want {
			t.Errorf("IsCanonicalOrigin(%q) = %v; new URL says %v", o, got, want)
		}
	}
}

// TestIsCanonicalOriginMatchesTheURLParser holds IsCanonicalOrigin to the WHATWG URL parser itself:
// testdata/origin/whatwg.json lists 1 580 origins — hosts with every kind of label, address and
// code point, with and without ports, https and http — and whether Node 20's
// new URL(o).origin === o. The one difference allowed: an xn-- label is not decoded, so a few
// labels the parser refuses are accepted.
func TestIsCanonicalOriginMatchesTheURLParser(t *testing.T) {
	raw, err := os.ReadFile("testdata/origin/whatwg.json")
	if err != nil {
		t.Fatal(err)
	}
	var golden struct {
		Origins [][2]json.RawMessage `json:"origins"`
	}
	if err := json.Unmarshal(raw, &golden); err != nil || len(golden.Origins) < 1000 {
		t.Fatalf("golden origins unreadable: %v", err)
	}
	for _, o := range golden.Origins {
		var s string
		var want bool
		if json.Unmarshal(o[0], &s) != nil || json.Unmarshal(o[1], &want) != nil {
			t.Fatalf("golden entry %s", o)
		}
		scheme, _, _ := strings.Cut(s, "://")
		got := IsCanonicalOrigin(s, scheme)
		if got != want && !(got && strings.Contains(s, "xn--")) {
			t.Errorf("IsCanonicalOrigin(%q) = %v; new URL says %v", s, got, want)
		}
	}
}

// FuzzIsCanonicalOrigin: what IsCanonicalOrigin accepts is what the parser would not rewrite in
// any way this package can see: no upper case, no byte outside printable ASCII, and a certificate
// name that is its host.
func FuzzIsCanonicalOrigin(f *testing.F) {
	for _, s := range []string{"https://relay.example:8443", "https://relay_1.example", "https://1.2.3.4", "https://[::1]:8443", "https://a..b", "https://0x7f.1"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if !IsCanonicalOrigin(s, "https") {
			return
		}
		if strings.ToLower(s) != s {
			t.Fatalf("accepted %q with upper case", s)
		}
		for i := 0; i < len(s); i++ {
			if s[i] <= ' ' || s[i] >= 0x7f {
				t.Fatalf("accepted %q with byte %#x", s, s[i])
			}
		}
		name := ClusterRelayCertificateDomainName(ClusterRelay{Origin: s})
		if name == "" || !strings.HasPrefix(strings.TrimPrefix(s, "https://"), name) {
			t.Fatalf("certificate name %q of %q is not its host", name, s)
		}
	})
}
