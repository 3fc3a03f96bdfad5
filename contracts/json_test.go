package contracts

import (
	"encoding/json"
	"errors"
	"testing"
)

func TestValidAcceptsAndRefuses(t *testing.T) {
	good := []string{
		`{}`, `[]`, `"x"`, `0`, `-0`, `1.5e-7`, `true`, `null`, ` {"a" : [1, {"b": null}] } `,
		`"\ud83d\ude00"`, `"\u2028<&>"`, `12345678901234567890`,
	}
	for _, s := range good {
		if err := Valid([]byte(s)); err != nil {
			t.Errorf("Valid(%q) = %v, want nil", s, err)
		}
	}
	bad := []string{
		``, ` `, `{`, `{"a"}`, `{"a":1,}`, `[1,]`, `01`, `1.`, `.5`, `1e`, `+1`, `"\x"`, `"\u12"`,
		`"\ud83d"`, `"\ude00"`, `"\ud83d\u0041"`, "\"\x01\"", "\"\xff\"", `tru`, `nul`, `{} {}`, `{"a":1}x`,
		`NaN`, `Infinity`, `'a'`,
	}
	for _, s := range bad {
		if err := Valid([]byte(s)); err == nil {
			t.Errorf("Valid(%q) = nil, want an error", s)
		}
	}
}

func TestValidBoundsDepth(t *testing.T) {
	deep := make([]byte, 0, 2*MaxJSONDepth+2)
	for range MaxJSONDepth + 1 {
		deep = append(deep, '[')
	}
	for range MaxJSONDepth + 1 {
		deep = append(deep, ']')
	}
	if err := Valid(deep); err == nil {
		t.Fatal("Valid accepted nesting beyond MaxJSONDepth")
	}
	if err := Valid(deep[1 : len(deep)-1]); err != nil {
		t.Fatalf("Valid refused nesting of exactly MaxJSONDepth: %v", err)
	}
}

func TestReadObjectKeepsBytesAndRefusesDuplicates(t *testing.T) {
	raw := []byte(`{"b": 12345678901234567890 , "a":{"x":"<&>\u2028"}}`)
	members, err := ReadObject(raw)
	if err != nil {
		t.Fatal(err)
	}
	if len(members) != 2 || members[0].Key != "b" || string(members[0].Value) != "12345678901234567890" ||
		members[1].Key != "a" || string(members[1].Value) != `{"x":"<&>\u2028"}` {
		t.Fatalf("members = %q", members)
	}
	_, err = ReadObject([]byte(`{"protocol":1,"x":2,"protocol":3}`))
	if !errors.Is(err, ErrDuplicateKey) {
		t.Fatalf("duplicate key: err = %v, want ErrDuplicateKey", err)
	}
	// Escaped and plain spellings of one key are the same key.
	_, err = ReadObject([]byte(`{"a":1,"\u0061":2}`))
	if !errors.Is(err, ErrDuplicateKey) {
		t.Fatalf("escaped duplicate key: err = %v, want ErrDuplicateKey", err)
	}
}

func TestLookup(t *testing.T) {
	raw := []byte(`{"session":{"nodeId":"n-1"},"nodeId":"other"}`)
	v, ok, err := Lookup(raw, "session")
	if err != nil || !ok || string(v) != `{"nodeId":"n-1"}` {
		t.Fatalf("Lookup = %s %v %v", v, ok, err)
	}
	if _, ok, err := Lookup(raw, "missing"); ok || err != nil {
		t.Fatalf("Lookup missing = %v %v", ok, err)
	}
	if _, _, err := Lookup([]byte(`{"a":1,"a":2}`), "a"); !errors.Is(err, ErrDuplicateKey) {
		t.Fatalf("Lookup duplicate: %v", err)
	}
	if _, _, err := Lookup([]byte(`[1]`), "a"); err == nil {
		t.Fatal("Lookup on an array succeeded")
	}
}

func TestReadStringDecodes(t *testing.T) {
	cases := map[string]string{
		`"plain"`:               "plain",
		`"\"\\\/\b\f\n\r\t"`:    "\"\\/\b\f\n\r\t",
		`"\u00e9\u20ac"`:        "é€",
		`"\ud83d\ude00"`:        "😀",
		`"<&>` + "\u2028" + `"`: "<&>\u2028",
		`"\u003c\u0026\u003e"`:  "<&>",
	}
	for in, want := range cases {
		got, err := ReadString([]byte(in))
		if err != nil || got != want {
			t.Errorf("ReadString(%s) = %q, %v; want %q", in, got, err, want)
		}
	}
}

func TestReadSafeIntegerMatchesJavaScript(t *testing.T) {
	cases := []struct {
		in   string
		want int64
		ok   bool
	}{
		{"0", 0, true}, {"-0", 0, true}, {"1.0", 1, true}, {"1e3", 1000, true}, {"9007199254740991", MaxSafeInteger, true},
		{"-9007199254740991", -MaxSafeInteger, true}, {"9007199254740992", 0, false}, {"9007199254740993", 0, false},
		{"1.5", 0, false}, {`"1"`, 0, false}, {"null", 0, false}, {"12345678901234567890", 0, false}, {"1e400", 0, false},
	}
	for _, c := range cases {
		got, ok := ReadSafeInteger([]byte(c.in))
		if ok != c.ok || (ok && got != c.want) {
			t.Errorf("ReadSafeInteger(%s) = %d, %v; want %d, %v", c.in, got, ok, c.want, c.ok)
		}
	}
	if _, ok := ReadCounter([]byte("-1")); ok {
		t.Error("ReadCounter(-1) accepted a negative counter")
	}
}

func TestAppendStringEscapesOnlyWhatJCSEscapes(t *testing.T) {
	got := string(AppendString(nil, "<&>\u2028\"\\\x00\x1f\x7f\t"))
	want := `"<&>` + "\u2028" + `\"\\\u0000\u001f` + "\x7f" + `\t"`
	if got != want {
		t.Fatalf("AppendString = %q, want %q", got, want)
	}
	// Round trip through encoding/json proves the output is a valid JSON string of the input.
	var back string
	if err := json.Unmarshal([]byte(got), &back); err != nil || back != "<&>\u2028\"\\\x00\x1f\x7f\t" {
		t.Fatalf("round trip = %q, %v", back, err)
	}
}

func TestErrorsNeverQuoteInput(t *testing.T) {
	secret := `{"bearer":"s3cr3t-bearer-value",`
	err := Valid([]byte(secret))
	if err == nil {
		t.Fatal("expected an error")
	}
	if containsSubstring(err.Error(), "s3cr3t") {
		t.Fatalf("error quotes the input: %v", err)
	}
}

func containsSubstring(s, sub string) bool {
	for i := 0; i+len(sub) <= len(s); i++ {
		if s[i:i+len(sub)] == sub {
			return true
		}
	}
	return false
}
