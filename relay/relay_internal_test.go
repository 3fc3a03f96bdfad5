package relay

import (
	"io"
	"strings"
	"testing"
	"testing/iotest"
)

func TestRedactURLDropsWhatMayBeSecret(t *testing.T) {
	got := redactURL("wss://user:pa55@cloudly.example:443/typedsocket?token=s3cret#frag")
	if got != "wss://cloudly.example:443/typedsocket" || strings.Contains(got, "s3cret") || strings.Contains(got, "pa55") {
		t.Fatalf("redactURL = %q", got)
	}
}

// A refusal at accept is written once the request's head is read, wherever its blank line falls
// between reads; a peer that ends first is not answered.
func TestSkipRequestHead(t *testing.T) {
	head := "GET / HTTP/1.1\r\nHost: relay\r\nUpgrade: websocket\r\n\r\n"
	for _, chunk := range []int{1, 2, 3, 5, 512} {
		r := iotest.OneByteReader(strings.NewReader(head + "more"))
		if chunk > 1 {
			r = &chunked{s: head + "more", n: chunk}
		}
		if !skipRequestHead(r) {
			t.Fatalf("chunks of %d: the head's end was not seen", chunk)
		}
	}
	if skipRequestHead(strings.NewReader("GET / HTTP/1.1\r\nHost: relay\r\n")) {
		t.Fatal("a peer that ended inside its head was answered")
	}
	if !skipRequestHead(strings.NewReader(strings.Repeat("x", maxHeaderBytes+1))) {
		t.Fatal("a head past maxHeaderBytes was not answered")
	}
}

type chunked struct {
	s string
	n int
}

func (c *chunked) Read(p []byte) (int, error) {
	if c.s == "" {
		return 0, io.EOF
	}
	k := copy(p[:min(len(p), c.n)], c.s)
	c.s = c.s[k:]
	return k, nil
}
