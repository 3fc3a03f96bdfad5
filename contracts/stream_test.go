package contracts

import (
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"testing"

	"code.foss.global/serve.zone/relay/contracts/strictjson"
)

func markers(t *testing.T, body string) []string {
	t.Helper()
	var ids []string
	if err := FindStreamMarkers([]byte(body), func(id string) error { ids = append(ids, id); return nil }); err != nil {
		t.Fatalf("FindStreamMarkers(%s): %v", body, err)
	}
	return ids
}

func TestFindStreamMarkers(t *testing.T) {
	cases := []struct {
		body string
		want []string
	}{
		{`{"a":1}`, nil},
		{`{"_isVirtualStream":true,"streamId":"s1"}`, []string{"s1"}},
		// At any depth, in arrays too, with unknown members beside it, in document order.
		{`{"x":{"y":[{"streamId":"s2","_isVirtualStream":true,"extra":{"n":1}}]},"z":{"_isVirtualStream":true,"streamId":"s3"}}`, []string{"s2", "s3"}},
		// Not a marker: false, missing or non-string id, empty id, the library's omitted placeholder.
		{`{"_isVirtualStream":false,"streamId":"no"}`, nil},
		{`{"_isVirtualStream":true}`, nil},
		{`{"_isVirtualStream":true,"streamId":7}`, nil},
		{`{"_isVirtualStream":true,"streamId":""}`, nil},
		{`{"s":{"_OBMITTED_VIRTUAL_STREAM":true,"reason":"x"},"_isVirtualStream":"true","streamId":"no"}`, nil},
		// A nested marker inside a marker's member is a marker of its own.
		{`{"_isVirtualStream":true,"streamId":"outer","inner":{"_isVirtualStream":true,"streamId":"in"}}`, []string{"in", "outer"}},
		// The marker key appears only as a string value: no marker.
		{`{"note":"\"_isVirtualStream\""}`, nil},
		// A repeated streamId: the last one counts, as JavaScript reads it.
		{`{"_isVirtualStream":true,"streamId":"a","streamId":"b"}`, []string{"b"}},
		// An escaped key reads as its decoded name.
		{`{"_isVirtualStream":true,"stream\u0049d":"esc"}`, []string{"esc"}},
	}
	for _, c := range cases {
		if got := markers(t, c.body); !slices.Equal(got, c.want) {
			t.Errorf("FindStreamMarkers(%s) = %q, want %q", c.body, got, c.want)
		}
	}
	long := `{"_isVirtualStream":true,"streamId":"` + strings.Repeat("x", MaxStreamIDLen+1) + `"}`
	if got := markers(t, long); got != nil {
		t.Errorf("an over-long streamId was reported: %d ids", len(got))
	}
	stop := errors.New("stop")
	err := FindStreamMarkers([]byte(`[{"_isVirtualStream":true,"streamId":"a"},{"_isVirtualStream":true,"streamId":"b"}]`),
		func(string) error { return stop })
	if !errors.Is(err, stop) {
		t.Errorf("an error from fn is not returned: %v", err)
	}
	var se *strictjson.SyntaxError
	if err := FindStreamMarkers([]byte(`{"_isVirtualStream":true,"streamId":"a"`), func(string) error { return nil }); !errors.As(err, &se) {
		t.Errorf("truncated body: %v, want a syntax error", err)
	}
	deep := strings.Repeat(`[`, strictjson.MaxJSONDepth+1) + `{"_isVirtualStream":true,"streamId":"d"}` + strings.Repeat(`]`, strictjson.MaxJSONDepth+1)
	if err := FindStreamMarkers([]byte(deep), func(string) error { return nil }); !errors.As(err, &se) {
		t.Errorf("nesting beyond MaxJSONDepth: %v, want a syntax error", err)
	}
}

func TestReadStreamFrameID(t *testing.T) {
	for _, c := range []struct {
		request, response string
		want              string
	}{
		{`{"streamId":"s","cycleId":"c","cycle":"request","mainPurpose":"chunk"}`, `null`, "s"},
		{`null`, `{"streamId":"r","cycle":"response","mainPurpose":"feedback"}`, "r"}, // a chunk's answer
		{`{"cycleId":"c"}`, `{"streamId":"r"}`, "r"},
		{`{"streamId":5}`, `null`, ""},
		{``, ``, ""},
	} {
		got, ok := ReadStreamFrameID([]byte(c.request), []byte(c.response))
		if got != c.want || ok != (c.want != "") {
			t.Errorf("ReadStreamFrameID(%s, %s) = %q %v, want %q", c.request, c.response, got, ok, c.want)
		}
	}
}

func TestIsStreamClosing(t *testing.T) {
	closing := `{"method":"##VirtualStream##","request":{"streamId":"s","mainPurpose":"chunk","chunkData":"#############CLOSING BIT#############"}}`
	if !IsStreamClosing([]byte(closing)) {
		t.Error("the closing chunk is not recognised")
	}
	if IsStreamClosing([]byte(`{"method":"##VirtualStream##","request":{"streamId":"s","mainPurpose":"chunk","chunkData":{"0":104}}}`)) {
		t.Error("a data chunk reads as closing")
	}
}

// referenceMarkers is the slow reference: decode the whole body as a receiver does and walk it.
func referenceMarkers(body []byte) ([]string, bool) {
	if !HasStreamMarker(body) {
		return nil, true
	}
	var v any
	if err := json.Unmarshal(body, &v); err != nil {
		return nil, false
	}
	var ids []string
	var walk func(v any)
	walk = func(v any) {
		switch x := v.(type) {
		case map[string]any:
			// encoding/json visits map keys in no order; markers are reported after their members,
			// so walk the members first and sort the whole list at the end.
			for _, m := range x {
				walk(m)
			}
			if x["_isVirtualStream"] == true {
				if id, ok := x["streamId"].(string); ok && id != "" && len(id) <= MaxStreamIDLen {
					ids = append(ids, id)
				}
			}
		case []any:
			for _, m := range x {
				walk(m)
			}
		}
	}
	walk(v)
	return ids, true
}

func FuzzFindStreamMarkers(f *testing.F) {
	for _, s := range []string{
		`{"_isVirtualStream":true,"streamId":"s1"}`,
		`{"a":[{"_isVirtualStream":true,"streamId":"s2"}],"b":{"_isVirtualStream":true,"streamId":"s3","c":{"_isVirtualStream":true,"streamId":"s4"}}}`,
		`{"_isVirtualStream":true,"streamId":"a","streamId":"b"}`,
		`{"_isVirtualStream":true,"stream\u0049d":"esc"}`,
		`[1,"x",null,{"_isVirtualStream":false}]`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		var got []string
		err := FindStreamMarkers(body, func(id string) error { got = append(got, id); return nil })
		want, valid := referenceMarkers(body)
		if err != nil {
			if valid && strictjson.Valid(body) == nil {
				t.Fatalf("a valid body was refused: %v", err)
			}
			return
		}
		if !valid || strictjson.Valid(body) != nil {
			return // the strict reader and encoding/json disagree on validity: nothing to compare
		}
		// Every marker the receiver's JSON.parse sees must be bound: the relay reports a superset,
		// the same set but where a repeated key hides a value from the receiver (the last wins).
		for _, id := range want {
			i := slices.Index(got, id)
			if i < 0 {
				t.Fatalf("markers %q miss %q of the reference %q, body %q", got, id, want, body)
			}
			got = slices.Delete(got, i, i+1)
		}
	})
}
