package contracts

import (
	"bytes"
	"testing"

	"code.foss.global/serve.zone/relay/testenv/frames"
)

// FuzzStreamSearches holds HasStreamMarker and IsStreamClosing to what they were (stream.go at
// 45fa1cf): plain substring searches for the quoted marker key and closing bit.
func FuzzStreamSearches(f *testing.F) {
	for _, s := range []string{
		`{"method":"##VirtualStream##","request":{"streamId":"s","chunkData":"#############CLOSING BIT#############"}}`,
		`"#############CLOSING BIT#############"`, `#############CLOSING BIT#############"`, `"#############CLOSING BIT#############`,
		`x#############CLOSING BIT#############""#############CLOSING BIT#############"`,
		`"##############CLOSING BIT#############"`, `""#############CLOSING BIT#############"`,
		`{"a":{"_isVirtualStream":true,"streamId":"s"}}`, `_isVirtualStream"`, `"_isVirtualStream`, `x_isVirtualStream""_isVirtualStream"`,
	} {
		f.Add([]byte(s))
	}
	f.Add(frames.ChunkFrame(50, false))
	f.Fuzz(func(t *testing.T, b []byte) {
		if got, want := IsStreamClosing(b), bytes.Contains(b, streamClosingBit); got != want {
			t.Fatalf("IsStreamClosing(%q) = %v, bytes.Contains %v", b, got, want)
		}
		if got, want := HasStreamMarker(b), bytes.Contains(b, streamMarkerKey); got != want {
			t.Fatalf("HasStreamMarker(%q) = %v, bytes.Contains %v", b, got, want)
		}
	})
}

// BenchmarkStreamSearches: the relay asks IsStreamClosing of every stream frame, whole, and
// HasStreamMarker of every body it forwards; "contains" is the substring search they replaced,
// measured in the same run.
func BenchmarkStreamSearches(b *testing.B) {
	for _, in := range frames.Inputs() {
		for _, s := range []struct {
			name   string
			needle []byte
			search func([]byte) bool
		}{
			{"closing", streamClosingBit, IsStreamClosing},
			{"marker", streamMarkerKey, HasStreamMarker},
		} {
			b.Run(in.Name+"/"+s.name+"/contains", func(b *testing.B) {
				b.SetBytes(int64(len(in.Raw)))
				for b.Loop() {
					if bytes.Contains(in.Raw, s.needle) {
						b.Fatal("found")
					}
				}
			})
			b.Run(in.Name+"/"+s.name+"/current", func(b *testing.B) {
				b.SetBytes(int64(len(in.Raw)))
				for b.Loop() {
					if s.search(in.Raw) {
						b.Fatal("found")
					}
				}
			})
		}
	}
}
