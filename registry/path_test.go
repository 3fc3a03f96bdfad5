package registry

import (
	"regexp"
	"strings"
	"testing"

	"code.foss.global/serve.zone/relay/contracts"
)

// The slow reference: the distribution specification's grammar as regular expressions.
var (
	refName   = regexp.MustCompile(`^[a-z0-9]+((\.|_|__|-+)[a-z0-9]+)*(/[a-z0-9]+((\.|_|__|-+)[a-z0-9]+)*)*$`)
	refTag    = regexp.MustCompile(`^[a-zA-Z0-9_][a-zA-Z0-9._-]{0,127}$`)
	refDigest = regexp.MustCompile(`^[a-z0-9]+([+._-][a-z0-9]+)*:[a-zA-Z0-9=_-]+$`)
	refSHA256 = regexp.MustCompile(`^sha256:[a-f0-9]{64}$`)
	refPath   = regexp.MustCompile(`^/v2/(.+)/(blobs|manifests)/([^/]*)$`)
)

// referenceParse is parsePath written the slow way.
func referenceParse(p string) (target, bool) {
	m := refPath.FindStringSubmatch(p)
	if m == nil {
		return target{}, false
	}
	name, kw, ref := m[1], m[2], m[3]
	if !refName.MatchString(name) || len(name) > maxNameLen {
		return target{}, false
	}
	t := target{Name: name, Reference: ref, Kind: kindBlob}
	if kw == "manifests" {
		t.Kind = kindManifest
	}
	if refDigest.MatchString(ref) {
		if strings.HasPrefix(ref, "sha256:") && !refSHA256.MatchString(ref) {
			return target{}, false
		}
		alg, enc, _ := strings.Cut(ref, ":")
		t.Digest = digest{alg, enc}
		return t, true
	}
	if t.Kind == kindManifest && refTag.MatchString(ref) {
		return t, true
	}
	return target{}, false
}

const hex64 = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"

func TestParsePath(t *testing.T) {
	cases := []struct {
		path string
		ok   bool
		kind kind
		name string
		dig  bool
	}{
		{"/v2/team/app/blobs/sha256:" + hex64, true, kindBlob, "team/app", true},
		{"/v2/team/app/manifests/sha256:" + hex64, true, kindManifest, "team/app", true},
		{"/v2/team/app/manifests/v1.2.3", true, kindManifest, "team/app", false},
		{"/v2/a/manifests/latest", true, kindManifest, "a", false},
		{"/v2/a.b_c__d---e/f/manifests/_x", true, kindManifest, "a.b_c__d---e/f", false},
		{"/v2/a/blobs/sha512:" + hex64 + hex64, true, kindBlob, "a", true},
		{"/v2/a/blobs/multihash+base58:QmRZxt2b1FVZPNqd8hsiykDL3TdBDeTSPX9Kv46HmX4Gx8", true, kindBlob, "a", true},
		{"/v2/blobs/blobs/sha256:" + hex64, true, kindBlob, "blobs", true},
		{"/v2/a/manifests/blobs/sha256:" + hex64, true, kindBlob, "a/manifests", true},
		{"/v2/a/blobs/latest", false, 0, "", false},                           // a blob is named by digest
		{"/v2/a/blobs/sha256:" + strings.ToUpper(hex64), false, 0, "", false}, // sha256 is lowercase hex
		{"/v2/a/blobs/sha256:" + hex64[:63], false, 0, "", false},
		{"/v2/a/blobs/uploads/", false, 0, "", false},
		{"/v2/a/blobs/uploads/0b4e6d2f", false, 0, "", false},
		{"/v2/A/manifests/latest", false, 0, "", false},
		{"/v2/a//b/manifests/latest", false, 0, "", false},
		{"/v2/a/../b/manifests/latest", false, 0, "", false},
		{"/v2/-a/manifests/latest", false, 0, "", false},
		{"/v2/a-/manifests/latest", false, 0, "", false},
		{"/v2/a___b/manifests/latest", false, 0, "", false},
		{"/v2/a/manifests/.hidden", false, 0, "", false},
		{"/v2/a/manifests/" + strings.Repeat("t", 129), false, 0, "", false},
		{"/v2/" + strings.Repeat("a", 256) + "/manifests/latest", false, 0, "", false},
		{"/v2/a/tags/list", false, 0, "", false},
		{"/v2/", false, 0, "", false},
		{"/v2/manifests/latest", false, 0, "", false},
		{"/v3/a/manifests/latest", false, 0, "", false},
	}
	for _, c := range cases {
		got, ok := parsePath(c.path)
		if ok != c.ok || ok && (got.Kind != c.kind || got.Name != c.name || got.byDigest() != c.dig) {
			t.Errorf("parsePath(%q) = %+v, %v", c.path, got, ok)
		}
		if ref, rok := referenceParse(c.path); rok != ok || ref != got {
			t.Errorf("reference disagrees on %q: %+v %v", c.path, ref, rok)
		}
	}
}

func TestCleanPath(t *testing.T) {
	for p, want := range map[string]bool{
		"/v2": true, "/v2/": true, "/v2/a/blobs/uploads/": true, "/v2/a/manifests/latest": true,
		"/v2//a": false, "/v2/a/../b": false, "/v2/./a": false, "/v2/a/..": false, "/v2/a/.": false,
		"/v2a": false, "/admin": false, "/v2/a//": false,
	} {
		if got := cleanPath(p, p); got != want {
			t.Errorf("cleanPath(%q) = %v, want %v", p, got, want)
		}
	}
	if cleanPath("/v2/a/b", "/v2/a%2Fb") {
		t.Error("an escaped path is clean")
	}
}

// FuzzParsePath compares the parser with the regular-expression reference and checks that what
// it accepts spells the path back exactly.
func FuzzParsePath(f *testing.F) {
	for _, s := range []string{
		"/v2/team/app/blobs/sha256:" + hex64, "/v2/team/app/manifests/v1", "/v2/a.b/c-d/manifests/sha512:abc",
		"/v2/a/blobs/uploads/", "/v2/a__b/manifests/_", "/v2/a//b/blobs/x:y",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, p string) {
		got, ok := parsePath(p)
		ref, rok := referenceParse(p)
		if ok != rok || got != ref {
			t.Fatalf("parsePath(%q) = %+v %v; reference %+v %v", p, got, ok, ref, rok)
		}
		if !ok {
			return
		}
		kw := "blobs"
		if got.Kind == kindManifest {
			kw = "manifests"
		}
		if back := "/v2/" + got.Name + "/" + kw + "/" + got.Reference; back != p {
			t.Fatalf("parsePath(%q) spells back %q", p, back)
		}
		if got.byDigest() && got.Digest.String() != got.Reference {
			t.Fatalf("digest %q does not spell the reference %q", got.Digest, got.Reference)
		}
		if got.byDigest() && got.Digest.isSHA256() && !contracts.IsLowerHex(got.Digest.Encoded, sha256Hex) {
			t.Fatalf("sha256 digest with encoding %q accepted", got.Digest.Encoded)
		}
		if !cleanPath(p, p) {
			t.Fatalf("parsePath accepted %q, which cleanPath refuses", p)
		}
	})
}
