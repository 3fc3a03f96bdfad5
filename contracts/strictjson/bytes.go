package strictjson

import (
	"encoding/base64"
	"errors"
	"slices"
	"strconv"
	"strings"
)

// Bytes in JSON, in the forms JavaScript writes them: JSON.stringify writes a Node.js Buffer as
// {"type":"Buffer","data":[104,…]} and a Uint8Array as {"0":104,"1":…}; the smartjson library
// writes {"type":"EncodedBuffer","data":"base64:…"}. DecodeBytes reads all three; AppendNodeBuffer
// writes the first, as Node.js peers do.

// ErrBytes is JSON that holds bytes in none of the forms DecodeBytes reads.
var ErrBytes = errors.New("json: not bytes in a form JavaScript writes")

// DecodeBytes appends the bytes raw holds, in any of the forms above, to dst. On an error dst is
// returned as it was.
func DecodeBytes(dst, raw []byte) ([]byte, error) {
	raw = TrimSpace(raw)
	switch KindOf(raw) {
	case KindArray:
		return appendByteArray(dst, raw)
	case KindObject:
	default:
		return dst, ErrBytes
	}
	var typ, data []byte
	if ReadTolerant(raw, Opt("type", &typ), Opt("data", &data)) != nil {
		return dst, ErrBytes
	}
	switch t, _ := ReadString(typ); {
	case typ != nil && t == "Buffer" && data != nil:
		return appendByteArray(dst, TrimSpace(data))
	case typ != nil && t == "EncodedBuffer" && data != nil:
		s, err := ReadString(data)
		b64, ok := strings.CutPrefix(s, "base64:")
		if err != nil || !ok {
			return dst, ErrBytes
		}
		n := base64.StdEncoding.DecodedLen(len(b64))
		out := append(dst, make([]byte, n)...)
		m, err := base64.StdEncoding.Decode(out[len(dst):], []byte(b64))
		if err != nil {
			return dst, ErrBytes
		}
		return out[:len(dst)+m], nil
	}
	return appendIndexedBytes(dst, raw)
}

// appendByteArray reads [104,101,…]: each element an integer 0 to 255 written plainly (no sign,
// fraction, exponent or leading zero), whitespace allowed around the commas. It is the decoder of
// every chunk a Node.js writer sends: one pass, no allocation beyond dst's growth.
func appendByteArray(dst, b []byte) ([]byte, error) {
	if len(b) < 2 || b[0] != '[' || b[len(b)-1] != ']' {
		return dst, ErrBytes
	}
	start, end := len(dst), len(b)-1
	out := slices.Grow(dst, end/2)
	out = out[:cap(out)]
	w := start
	i := SkipSpace(b, 1)
	if i == end {
		return dst, nil
	}
	for {
		if i >= end || b[i] < '0' || b[i] > '9' {
			return dst[:start], ErrBytes
		}
		v := uint(b[i] - '0')
		i++
		if v != 0 {
			for k := 0; k < 2 && i < end && b[i] >= '0' && b[i] <= '9'; k++ {
				v = v*10 + uint(b[i]-'0')
				i++
			}
		}
		if v > 255 || i < end && b[i] >= '0' && b[i] <= '9' {
			return dst[:start], ErrBytes
		}
		if w == len(out) {
			out = append(out, 0)
			out = out[:cap(out)]
		}
		out[w] = byte(v)
		w++
		if i < end && b[i] != ',' {
			i = SkipSpace(b, i)
		}
		switch {
		case i == end:
			return out[:w], nil
		case b[i] != ',':
			return dst[:start], ErrBytes
		}
		if i++; i < end && (b[i] < '0' || b[i] > '9') {
			i = SkipSpace(b, i)
		}
	}
}

// readByteValue reads one decimal 0 to 255 at b[i] (no sign, fraction, exponent or leading zero).
func readByteValue(b []byte, i int) (byte, int, bool) {
	v, j := 0, i
	for j < len(b) && j-i < 4 && b[j] >= '0' && b[j] <= '9' {
		v = v*10 + int(b[j]-'0')
		j++
	}
	n := j - i
	if n == 0 || n > 3 || v > 255 || n > 1 && b[i] == '0' {
		return 0, i, false
	}
	return byte(v), j, true
}

// appendIndexedBytes reads a Uint8Array's JSON form {"0":104,"1":101,…}: keys 0 to n-1, in order.
func appendIndexedBytes(dst, raw []byte) ([]byte, error) {
	start := len(dst)
	next := 0
	err := ForEachMember(raw, func(key, value []byte) error {
		if string(key) != strconv.Itoa(next) {
			return ErrBytes
		}
		v, j, ok := readByteValue(value, 0)
		if !ok || j != len(value) {
			return ErrBytes
		}
		dst = append(dst, v)
		next++
		return nil
	})
	if err != nil {
		return dst[:start], ErrBytes
	}
	return dst, nil
}

// byteText is each byte's decimal text, padded to 4 bytes, and byteLen its length.
var byteText, byteLen = func() (t [256][4]byte, n [256]uint8) {
	for i := range t {
		s := strconv.Itoa(i)
		copy(t[i][:], s)
		n[i] = uint8(len(s))
	}
	return t, n
}()

// AppendNodeBuffer appends data as JSON.stringify writes a Node.js Buffer:
// {"type":"Buffer","data":[…]}.
func AppendNodeBuffer(b, data []byte) []byte {
	b = append(b, `{"type":"Buffer","data":[`...)
	out := slices.Grow(b, 4*len(data)+2)
	out = out[:cap(out)]
	w := len(b)
	for i, c := range data {
		if i > 0 {
			out[w] = ','
			w++
		}
		t := &byteText[c]
		out[w], out[w+1], out[w+2] = t[0], t[1], t[2]
		w += int(byteLen[c])
	}
	out[w], out[w+1] = ']', '}'
	return out[:w+2]
}

// MaxNodeBufferLen is the longest AppendNodeBuffer text of n bytes.
func MaxNodeBufferLen(n int) int { return 28 + 4*n }
