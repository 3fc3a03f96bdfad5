package strictjson

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"testing"
)

func addGoldenInputs(f *testing.F) {
	ins, _ := filepath.Glob("testdata/canonical/*.in.json")
	for _, in := range ins {
		if b, err := os.ReadFile(in); err == nil {
			f.Add(b)
		}
	}
}

// FuzzCanonicalize checks that canonical JSON is a fixed point, is valid JSON, and means the same
// value as its input.
func FuzzCanonicalize(f *testing.F) {
	addGoldenInputs(f)
	for _, s := range []string{`{"a":1,"a":2}`, `[1e400]`, `"\ud800"`, `{"b":[],"a":{"c":-0.0}}`, `12345678901234567890`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		if Valid(in) == nil && !json.Valid(in) {
			t.Fatalf("Valid accepted what encoding/json refuses: %q", in)
		}
		out, err := Canonicalize(in)
		if err != nil {
			return
		}
		again, err := Canonicalize(out)
		if err != nil || string(again) != string(out) {
			t.Fatalf("not a fixed point: %q -> %q -> %q (%v)", in, out, again, err)
		}
		a, err := decodeValue(in)
		if err != nil {
			t.Fatalf("canonicalized what encoding/json cannot read: %q", in)
		}
		b, err := decodeValue(out)
		if err != nil {
			t.Fatalf("canonical output unreadable: %q", out)
		}
		if !reflect.DeepEqual(a, b) {
			t.Fatalf("value changed: %q -> %q", in, out)
		}
	})
}

// decodeValue decodes with encoding/json, reading every number as the nearest double, except an
// integer literal beyond the double range, which canonicalization keeps digit for digit.
func decodeValue(raw []byte) (any, error) {
	d := json.NewDecoder(bytes.NewReader(raw))
	d.UseNumber()
	var v any
	if err := d.Decode(&v); err != nil {
		return nil, err
	}
	var walk func(any) (any, error)
	walk = func(v any) (any, error) {
		switch x := v.(type) {
		case json.Number:
			f, err := strconv.ParseFloat(string(x), 64)
			if err != nil {
				return string(x), nil // an integer literal beyond the double range: compared digit for digit
			}
			return f, nil
		case []any:
			for i := range x {
				var err error
				if x[i], err = walk(x[i]); err != nil {
					return nil, err
				}
			}
		case map[string]any:
			for k := range x {
				var err error
				if x[k], err = walk(x[k]); err != nil {
					return nil, err
				}
			}
		}
		return v, nil
	}
	return walk(v)
}
