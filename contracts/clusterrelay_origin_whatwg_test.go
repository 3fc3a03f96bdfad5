package contracts

import "testing"

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
