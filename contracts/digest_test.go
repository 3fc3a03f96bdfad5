package contracts

import (
	"encoding/json"
	"os"
	"strings"
	"testing"

	"code.foss.global/serve.zone/relay/contracts/strictjson"
)

func TestDigestGoldenVectors(t *testing.T) {
	raw, err := os.ReadFile("testdata/digest/vectors.json")
	if err != nil {
		t.Fatal(err)
	}
	var vectors []struct {
		Domain    string          `json:"domain"`
		Value     json.RawMessage `json:"value"`
		Canonical string          `json:"canonical"`
		Digest    string          `json:"digest"`
	}
	if err := json.Unmarshal(raw, &vectors); err != nil || len(vectors) == 0 {
		t.Fatalf("vectors: %v", err)
	}
	for _, v := range vectors {
		c, err := strictjson.Canonicalize(v.Value)
		if err != nil || string(c) != v.Canonical {
			t.Errorf("%s: canonical %s, %v; want %s", v.Domain, c, err, v.Canonical)
		}
		d, err := DigestOf(v.Domain, v.Value)
		if err != nil || d != v.Digest {
			t.Errorf("%s: digest %s, %v; want %s", v.Domain, d, err, v.Digest)
		}
		if !IsSha256Digest(d) {
			t.Errorf("%s is not a sha256 digest", d)
		}
	}
}

func TestDigestWithoutExcludesTheField(t *testing.T) {
	withDigest := []byte(`{"b":2,"digest":"sha256:00","a":1}`)
	without := []byte(`{"a":1,"b":2}`)
	d1, err := DigestWithout("d", withDigest, "digest")
	if err != nil {
		t.Fatal(err)
	}
	d2, _ := DigestOf("d", without)
	if d1 != d2 {
		t.Fatalf("DigestWithout = %s, want %s", d1, d2)
	}
	if d3, _ := DigestOf("other", without); d3 == d2 {
		t.Fatal("the domain does not separate digests")
	}
}

func TestIsSha256Digest(t *testing.T) {
	z := strings.Repeat("0", 64)
	for s, want := range map[string]bool{
		"sha256:" + z: true, "sha256:" + strings.Repeat("A", 64): false, "sha256:" + z[1:]: false,
		"sha512:" + z: false, z: false, "sha256:" + z + "0": false,
	} {
		if IsSha256Digest(s) != want {
			t.Errorf("IsSha256Digest(%q) = %v", s, !want)
		}
	}
}
