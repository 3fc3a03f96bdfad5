package strictjson

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"code.foss.global/serve.zone/relay/testenv/frames"
)

// The scanner in json.go must read exactly the language the slow reference (json_ref_test.go)
// reads: the same inputs accepted, the same errors (message and offset) for the rest, the same
// value boundaries and member keys.

type scannedMember struct{ key, value string }

// matchReference fails t when the scanner and the reference read in differently. depth is the
// nesting the value is read at (0 at the top), so that short inputs reach MaxJSONDepth.
func matchReference(t *testing.T, in []byte, depth int) {
	t.Helper()
	sameError := func(what string, got, want error) {
		t.Helper()
		var g, w *SyntaxError
		if (got == nil) != (want == nil) || got != nil && (!errors.As(got, &g) || !errors.As(want, &w) || *g != *w) {
			t.Fatalf("%s(%q): %v, the reference: %v", what, in, got, want)
		}
	}
	sameError("Valid", Valid(in), refValid(in))

	i := SkipSpace(in, 0)
	if ri := refSkipSpace(in, 0); i != ri {
		t.Fatalf("SkipSpace(%q) = %d, the reference %d", in, i, ri)
	}
	end, err := ScanValue(in, i, depth)
	refEnd, refErr := refScanValue(in, i, depth)
	sameError("ScanValue", err, refErr)
	if err == nil && end != refEnd {
		t.Fatalf("ScanValue(%q) ends at %d, the reference at %d", in, end, refEnd)
	}

	// The scalar scanners on their own, wherever the input starts.
	end, err = ScanString(in, 0)
	refEnd, refErr = refScanString(in, 0)
	sameError("ScanString", err, refErr)
	if err == nil && end != refEnd {
		t.Fatalf("ScanString(%q) ends at %d, the reference at %d", in, end, refEnd)
	}
	if len(in) > 0 && (in[0] == '-' || in[0] >= '0' && in[0] <= '9') {
		end, err = scanNumber(in, 0)
		refEnd, refErr = refScanNumber(in, 0)
		sameError("scanNumber", err, refErr)
		if err == nil && end != refEnd {
			t.Fatalf("scanNumber(%q) ends at %d, the reference at %d", in, end, refEnd)
		}
	}

	var got, want []scannedMember
	err = ForEachMember(in, func(key, value []byte) error {
		got = append(got, scannedMember{string(key), string(value)})
		return nil
	})
	refErr = refForEachMember(in, func(key, value []byte) error {
		want = append(want, scannedMember{string(key), string(value)})
		return nil
	})
	sameError("ForEachMember", err, refErr)
	if len(got) != len(want) {
		t.Fatalf("ForEachMember(%q) reads %d members, the reference %d", in, len(got), len(want))
	}
	for k := range got {
		if got[k] != want[k] {
			t.Fatalf("ForEachMember(%q) member %d = %q, the reference %q", in, k, got[k], want[k])
		}
	}

	// ForEachMemberWithin, reading the members of every object member, reads what the reference
	// reads in two passes: the object's members, then each object member's own.
	var within []string
	for _, m := range want {
		within = append(within, m.key)
	}
	got = got[:0]
	err = ForEachMemberWithin(in, within, func(outer, key, value []byte) error {
		got = append(got, scannedMember{string(outer) + "." + string(key), string(value)})
		return nil
	}, func(key, value []byte) error {
		got = append(got, scannedMember{string(key), string(value)})
		return nil
	})
	if refErr == nil {
		var nested []scannedMember
		for _, m := range want {
			if m.value[0] == '{' {
				if err := refForEachMember([]byte(m.value), func(key, value []byte) error {
					nested = append(nested, scannedMember{m.key + "." + string(key), string(value)})
					return nil
				}); err != nil {
					t.Fatalf("the reference refuses %q, a member of %q it accepted", m.value, in)
				}
			}
			nested = append(nested, m)
		}
		want = nested
	}
	sameError("ForEachMemberWithin", err, refErr)
	if err == nil && !slices.Equal(got, want) {
		t.Fatalf("ForEachMemberWithin(%q) reads %q, the reference %q", in, got, want)
	}
}

// scannerEdgeCases are inputs near every branch of the scanner.
var scannerEdgeCases = []string{
	``, ` `, `{}`, `[]`, `{ }`, `[ ]`, ` {"a" : [1, {"b": null}] } `, `{"a":1}x`, `{} {}`,
	`0`, `-0`, `01`, `-01`, `1.`, `.5`, `1e`, `1e+`, `1E-7`, `1.5e-7`, `-`, `+1`, `-a`, `0x1`, `00`,
	`12345678901234567890`, `1.0e400`, `123456789012345678901234567890.5`, `9,`, `[01]`, `[1.]`, `[-]`,
	`[1,2,3]`, `[1,]`, `[,1]`, `[1 2]`, `{"a":1,}`, `{"a"}`, `{"a":}`, `{a:1}`, `{"a":1 "b":2}`, `{"a" 1}`,
	`{"a":1,"a":2}`, `{"0":104,"1":101,"2":108}`, `{"type":"Buffer","data":[104,101,108]}`,
	`"x"`, `"`, `"\"`, `"\\"`, `"\/"`, `"\b\f\n\r\t"`, `"\x"`, `"\u12"`, `"\u12g4"`, `"\u0041"`, `"\uD83D\uDE00"`,
	`"\ud83d"`, `"\ude00"`, `"\ud83d\u0041"`, `"\ud83d\ud83d"`, `"\ud83d\\"`, `"\ud83d\u"`, `"\ud83dx"`,
	"\"\x01\"", "\"\x1f\"", "\"\x7f\"", "\"\xff\"", "\"\xc3\xa9\"", "\"\xc3\"", "\"\xe2\x80\xa8\"", "\"\xed\xa0\x80\"",
	"\"\xf0\x9f\x98\x80\"", "\"\xf4\x90\x80\x80\"", "\"\xc0\xaf\"", "\"\xe0\x80\xaf\"", "\"abcdefgh\xffabcdefgh\"",
	`"abcdefghijklmnopqrstuvwxyz"`, `"abcdefghijklmnop\"qrstuvwxyz"`, `"abcdefghijklmnopqrstuvwxyz`,
	`true`, `false`, `null`, `tru`, `nul`, `fals`, `truex`, `[true,false,null]`, `NaN`, `Infinity`, `'a'`,
	" \t\r\n{ \t\r\n\"a\" \t\r\n: \t\r\n1 \t\r\n} \t\r\n", "{\"a\":1}\v", "\f{}",
	`{"method":"##VirtualStream##","request":{"streamId":"s","chunkData":"#############CLOSING BIT#############"},"response":null}`,
	`{"a":{"b":{"c":{"d":[[[[{}]]]]}}}}`, `[[[[[[[[[[`, `]]]]`, `{"a":[}`, `[{]`,
}

func TestScannerMatchesReference(t *testing.T) {
	inputs := scannerEdgeCases
	inputs = append(inputs, string(frames.ChunkFrame(300, false)), string(frames.ChunkFrame(300, true)),
		frames.SessionRequest, string(frames.RouteTable(2)))
	deep := strings.Repeat(`[`, MaxJSONDepth) + strings.Repeat(`]`, MaxJSONDepth)
	inputs = append(inputs, deep, "["+deep+"]", strings.Repeat(`{"a":`, MaxJSONDepth)+"1"+strings.Repeat(`}`, MaxJSONDepth))
	for _, in := range inputs {
		for _, depth := range []int{0, 1, MaxJSONDepth - 2, MaxJSONDepth - 1, MaxJSONDepth} {
			matchReference(t, []byte(in), depth)
		}
	}
	// Runs of integers (integerRun) and short keys (shortKey) with something unusual at every
	// offset of an eight-byte word, and at the end of the input.
	for _, odd := range []string{"05", "0", "00", ",", " ", "-1", "1.5", "1e2", "]", "x", "1]", "10", "[1]", `"a"`, "\x00"} {
		for shift := range 17 {
			pre := strings.Repeat("7,", shift/2) + strings.Repeat("8", shift%2+1) + ","
			inputs := []string{
				"[" + pre + odd + ",1,22,333,4,5,6,7,8,9]", "[" + pre + odd + "]", "[" + pre + odd, "[" + pre[:len(pre)-1] + odd,
				`{"` + strings.Repeat("k", shift) + odd + `":1,"a":2}`, `{"` + strings.Repeat("k", shift) + `":` + odd + `,"a":2}`,
			}
			for _, in := range inputs {
				matchReference(t, []byte(in), 0)
			}
		}
	}
	// The benchmarks' inputs, whole.
	for _, in := range frames.Inputs() {
		matchReference(t, in.Raw, 0)
	}
	// Every prefix of a small frame (each one a different unexpected end), and the frame with each
	// byte in turn replaced by each byte that means something to a JSON reader.
	for _, frame := range []string{string(frames.ChunkFrame(12, false)), string(frames.ChunkFrame(12, true)), frames.SessionRequest} {
		for n := range len(frame) {
			matchReference(t, []byte(frame[:n]), 0)
		}
		for k := range len(frame) {
			for _, c := range []byte("\"\\{}[],:0-.eE+ \t\x00\x1f\x80\xffatfn") {
				in := []byte(frame)
				in[k] = c
				matchReference(t, in, 0)
			}
		}
	}
}

func FuzzScannerMatchesReference(f *testing.F) {
	for _, in := range scannerEdgeCases {
		f.Add([]byte(in), uint16(0))
	}
	f.Add(frames.ChunkFrame(40, false), uint16(1))
	f.Add(frames.ChunkFrame(40, true), uint16(0))
	f.Add([]byte(frames.SessionRequest), uint16(0))
	f.Add([]byte(`[[[[{"a":[1]}]]]]`), uint16(MaxJSONDepth-5))
	f.Fuzz(func(t *testing.T, in []byte, depth uint16) {
		matchReference(t, in, int(depth)%(MaxJSONDepth+1))
	})
}
