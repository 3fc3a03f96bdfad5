package strictjson

import (
	"errors"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestCanonicalizeGoldenVectors(t *testing.T) {
	ins, err := filepath.Glob("testdata/canonical/*.in.json")
	if err != nil || len(ins) < 6 {
		t.Fatalf("golden vectors missing: %v %v", ins, err)
	}
	for _, in := range ins {
		name := strings.TrimSuffix(filepath.Base(in), ".in.json")
		t.Run(name, func(t *testing.T) {
			input, err := os.ReadFile(in)
			if err != nil {
				t.Fatal(err)
			}
			want, err := os.ReadFile(strings.TrimSuffix(in, ".in.json") + ".out.json")
			if err != nil {
				t.Fatal(err)
			}
			got, err := Canonicalize(input)
			if err != nil {
				t.Fatal(err)
			}
			if string(got) != string(want) {
				t.Fatalf("Canonicalize:\n got %s\nwant %s", got, want)
			}
			// Canonical form is a fixed point.
			again, err := Canonicalize(got)
			if err != nil || string(again) != string(got) {
				t.Fatalf("not idempotent: %s, %v", again, err)
			}
		})
	}
}

func TestCanonicalizeRefusesWhatHasNoCanonicalForm(t *testing.T) {
	for _, in := range []string{`{"a":1,"a":1}`, `[{"x":{"k":1,"k":2}}]`, `1e400`, `-1e400`} {
		if _, err := Canonicalize([]byte(in)); !errors.Is(err, ErrNotCanonicalizable) {
			t.Errorf("Canonicalize(%s) err = %v, want ErrNotCanonicalizable", in, err)
		}
	}
	if _, err := Canonicalize([]byte(`{"a":`)); err == nil {
		t.Error("Canonicalize accepted malformed input")
	}
}

// TestES6NumberFormatting uses the IEEE-754 vectors of RFC 8785 appendix B; the expected strings
// were checked against Node.js String(n).
func TestES6NumberFormatting(t *testing.T) {
	cases := map[uint64]string{
		0x0000000000000000: "0", 0x8000000000000000: "0", 0x0000000000000001: "5e-324",
		0x8000000000000001: "-5e-324", 0x7fefffffffffffff: "1.7976931348623157e+308",
		0xffefffffffffffff: "-1.7976931348623157e+308", 0x4340000000000000: "9007199254740992",
		0xc340000000000000: "-9007199254740992", 0x4430000000000000: "295147905179352830000",
		0x44b52d02c7e14af5: "9.999999999999997e+22", 0x44b52d02c7e14af6: "1e+23",
		0x44b52d02c7e14af7: "1.0000000000000001e+23", 0x444b1ae4d6e2ef4e: "999999999999999700000",
		0x444b1ae4d6e2ef4f: "999999999999999900000", 0x444b1ae4d6e2ef50: "1e+21",
		0x3eb0c6f7a0b5ed8c: "9.999999999999997e-7", 0x3eb0c6f7a0b5ed8d: "0.000001",
		0x41b3de4355555553: "333333333.3333332", 0x41b3de4355555554: "333333333.33333325",
		0x41b3de4355555555: "333333333.3333333", 0x41b3de4355555556: "333333333.3333334",
		0x41b3de4355555557: "333333333.33333343", 0xbecbf647612f3696: "-0.0000033333333333333333",
		0x43143ff3c1cb0959: "1424953923781206.2",
	}
	for bits, want := range cases {
		if got := string(AppendES6Number(nil, math.Float64frombits(bits))); got != want {
			t.Errorf("%#016x: got %s, want %s", bits, got, want)
		}
	}
}
