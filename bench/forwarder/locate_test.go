package main

import (
	"encoding/json"
	"reflect"
	"testing"
	"unicode/utf8"
)

func TestLocate(t *testing.T) {
	cases := []struct {
		frame, id, phase string
		ok               bool
	}{
		{`{"method":"m","request":{"correlation":{"id":"x"}},"correlation":{"id":"7","phase":"request"}}`, `"7"`, "request", true},
		{` { "correlation" : { "phase" : "response" , "id" : "a\"b" } , "response" : [1, {"}": "]"}] }`, `"a\"b"`, "response", true},
		{`{"request":"{\"correlation\":{\"id\":\"no\",\"phase\":\"request\"}}","correlation":{"id":"yes","phase":"request"}}`, `"yes"`, "request", true},
		{`{"correlation":{"id":7,"phase":"request"}}`, "", "", false},
		{`{"correlation":null}`, "", "", false},
		{`{"correlation":{"id":"7"}}`, "", "", false},
		{`["correlation",{"id":"7","phase":"request"}]`, "", "", false},
		{`{"correlation":{"id":"7","phase":"request"`, "", "", false},
		{`{"correlation":{"id":"7","phase":"request"},`, `"7"`, "request", true}, // the peer judges the rest
		{`{"method":"m"`, "", "", false},
		{``, "", "", false},
	}
	for _, c := range cases {
		start, end, phase, ok := locate([]byte(c.frame))
		if ok != c.ok || ok && (c.frame[start:end] != c.id || string(phase) != c.phase) {
			t.Errorf("locate(%s) = %d:%d %q %v, want %s %q %v", c.frame, start, end, phase, ok, c.id, c.phase, c.ok)
		}
	}
}

// FuzzLocate: on any bytes locate does not panic and returns a span inside them; on any envelope
// encoding/json writes it finds the correlation exactly, and rewriting the id changes nothing else.
func FuzzLocate(f *testing.F) {
	f.Add([]byte(`{"method":"reportRuntimeAssignmentObservation","request":{"session":{"nodeId":"n1"}},"response":null,"correlation":{"id":"1","phase":"request"}}`), "m", "1", "request", `{"a":"}"}`)
	f.Add([]byte(`{"correlation":{"phase":"response","id":"\u0022"}}`), "", "\"\\", "response", `["{"]`)
	f.Fuzz(func(t *testing.T, frame []byte, method, id, phase, body string) {
		start, end, ph, ok := locate(frame)
		if ok && (start < 0 || end > len(frame) || start >= end || frame[start] != '"' || frame[end-1] != '"' || len(ph) > len(frame)) {
			t.Fatalf("locate(%q) = %d:%d %q outside the frame", frame, start, end, ph)
		}
		if ok && json.Valid(frame) {
			spliced := splice(frame, start, end, []byte(`"42"`))
			if !json.Valid(spliced) {
				t.Fatalf("rewriting the id of %q gave invalid JSON %q", frame, spliced)
			}
		}

		raw := json.RawMessage(body)
		if !json.Valid(raw) {
			raw = json.RawMessage("null")
		}
		env := map[string]any{"method": method, "request": raw, "correlation": map[string]string{"id": id, "phase": phase}}
		b, err := json.Marshal(env)
		if err != nil || !utf8.ValidString(id) || !utf8.ValidString(phase) {
			return // encoding/json would not write these strings as given
		}
		start, end, ph, ok = locate(b)
		if !ok {
			t.Fatalf("locate(%s) found no correlation", b)
		}
		var gotID string
		if err := json.Unmarshal(b[start:end], &gotID); err != nil || gotID != id || string(ph) != mustQuote(phase) {
			t.Fatalf("locate(%s) = id %q phase %q, want %q %q", b, gotID, ph, id, phase)
		}
		var before, after map[string]any
		json.Unmarshal(b, &before)
		json.Unmarshal(splice(b, start, end, []byte(`"42"`)), &after)
		before["correlation"].(map[string]any)["id"] = "42"
		if !reflect.DeepEqual(before, after) {
			t.Fatalf("rewriting the id of %s changed more than the id: %v", b, after)
		}
	})
}

// mustQuote is s as encoding/json writes it between quotes.
func mustQuote(s string) string {
	b, _ := json.Marshal(s)
	return string(b[1 : len(b)-1])
}
