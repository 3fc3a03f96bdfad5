package strictjson

import (
	"encoding/json"
	"errors"
	"strconv"
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

// TestReadExactAndReadTolerant pins the one way an object shape is read.
func TestReadExactAndReadTolerant(t *testing.T) {
	// Sized to its key list: the escrow's old reader kept values in a [7] array and panicked on
	// an eighth key; IIsolatedRestoreProgress alone has fourteen.
	t.Run("as many keys as the shape has", func(t *testing.T) {
		obj := manyKeysObject(20, "")
		vals := make([][]byte, 20)
		fields := make([]Field, 20)
		for i := range fields {
			fields[i] = Req(strconv.FormatInt(int64(i), 36), &vals[i])
		}
		if err := ReadExact(obj, fields...); err != nil {
			t.Fatal(err)
		}
		for i, v := range vals {
			if string(v) != "0" {
				t.Fatalf("value %d = %q", i, v)
			}
		}
	})
	var a, b, c []byte
	if err := ReadExact([]byte(` { "b" : [1, 2] , "a":"x" } `), Req("a", &a), Req("b", &b), Opt("c", &c)); err != nil ||
		string(a) != `"x"` || string(b) != `[1, 2]` || c != nil {
		t.Fatalf("a=%s b=%s c=%s: %v", a, b, c, err)
	}
	for body, want := range map[string]error{
		`{"a":1}`:               ErrShape,        // b missing
		`{"a":1,"b":2,"d":3}`:   ErrShape,        // d unknown
		`{"a":1,"b":2,"a":3}`:   ErrDuplicateKey, // a twice
		`{"a":1,"b":2,"c":3}`:   nil,
		`{"a":1,"b":2,"c":3,}`:  (*SyntaxError)(nil),
		`["a","b"]`:             (*SyntaxError)(nil),
		`{"a":1,"b":2,"c":3} x`: (*SyntaxError)(nil),
	} {
		err := ReadExact([]byte(body), Req("a", &a), Req("b", &b), Opt("c", &c))
		var syntax *SyntaxError
		switch want {
		case nil:
			if err != nil {
				t.Errorf("%s: %v", body, err)
			}
		case error((*SyntaxError)(nil)):
			if !errors.As(err, &syntax) {
				t.Errorf("%s: %v, want a syntax error", body, err)
			}
		default:
			if !errors.Is(err, want) {
				t.Errorf("%s: %v, want %v", body, err, want)
			}
		}
	}
	// Tolerant: members it does not name are ignored, even repeated; those it names are not.
	if err := ReadTolerant([]byte(`{"x":{"y":[1]},"a":1,"x":2,"b":{}}`), Req("a", &a), Opt("c", &c)); err != nil || string(a) != "1" || c != nil {
		t.Fatalf("tolerant: a=%s c=%s: %v", a, c, err)
	}
	if err := ReadTolerant([]byte(`{"a":1,"a":2}`), Req("a", &a)); !errors.Is(err, ErrDuplicateKey) {
		t.Fatalf("tolerant repeat of a read key: %v", err)
	}
	if err := ReadTolerant([]byte(`{"b":1}`), Req("a", &a)); !errors.Is(err, ErrShape) {
		t.Fatalf("tolerant without a required key: %v", err)
	}
	if err := ReadTolerant([]byte(`{"b":"\ud800"}`), Req("a", &a)); err == nil {
		t.Fatal("an ignored member is still checked as JSON")
	}
	// Reading twice with the same destinations starts from nothing.
	c = []byte("stale")
	if err := ReadExact([]byte(`{"a":1,"b":2}`), Req("a", &a), Req("b", &b), Opt("c", &c)); err != nil || c != nil {
		t.Fatalf("an absent optional member kept a stale value: %q %v", c, err)
	}
}

func TestReadExactAllocatesNothing(t *testing.T) {
	raw := []byte(`{"status":"accepted","renewal":{"projection":{"id":"p","generation":1,"digest":"d"},"sequence":1,"digest":"d"}}`)
	allocs := testing.AllocsPerRun(100, func() {
		var status, renewal []byte
		if ReadExact(raw, Req("status", &status), Req("renewal", &renewal)) != nil {
			t.Fatal("not read")
		}
	})
	if allocs != 0 {
		t.Fatalf("%v allocations per read", allocs)
	}
}
