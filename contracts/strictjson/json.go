package strictjson

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"math/bits"
	"strconv"
	"strings"
	"unicode/utf16"
	"unicode/utf8"
)

// This file is the one strict JSON reader of the relay. Everything a peer sends is read through it,
// so that the relay and the peer behind it can never read one body two ways:
//
//   - syntax is RFC 8259 exactly; strings are valid UTF-8 with valid escapes (a lone surrogate
//     escape is refused); nesting is bounded by MaxJSONDepth;
//   - an object may not repeat a key the relay reads — JavaScript keeps the last duplicate and a
//     naive Go reader the first, so a duplicate would let the relay judge one value while Cloudly
//     reads another;
//   - an object shape is read one way: ReadExact for a seed-spelled shape (every member named,
//     nothing else), ReadTolerant for a project-defined one (the members the relay uses, every
//     other member ignored), each with its fields (Req, Opt) in one pass;
//   - values come back as sub-slices of the input, never re-encoded, so what the relay forwards is
//     byte-identical to what it read.

// MaxJSONDepth bounds the nesting of any JSON value the relay reads or forwards.
const MaxJSONDepth = 512

// Kind is the type of a JSON value.
type Kind uint8

// The JSON value kinds.
const (
	KindInvalid Kind = iota
	KindObject
	KindArray
	KindString
	KindNumber
	KindBool
	KindNull
)

var kindNames = [...]string{"invalid", "object", "array", "string", "number", "boolean", "null"}

func (k Kind) String() string { return kindNames[k] }

// KindOf reports the kind of raw by its first non-space byte. It does not validate raw.
func KindOf(raw []byte) Kind {
	i := SkipSpace(raw, 0)
	if i >= len(raw) {
		return KindInvalid
	}
	switch c := raw[i]; {
	case c == '{':
		return KindObject
	case c == '[':
		return KindArray
	case c == '"':
		return KindString
	case c == '-' || (c >= '0' && c <= '9'):
		return KindNumber
	case c == 't' || c == 'f':
		return KindBool
	case c == 'n':
		return KindNull
	}
	return KindInvalid
}

// SyntaxError is a JSON value that is not well-formed. It names the byte offset and never quotes
// the input, which may be secret.
type SyntaxError struct {
	Offset int
	Msg    string
}

func (e *SyntaxError) Error() string { return fmt.Sprintf("json: %s at offset %d", e.Msg, e.Offset) }

// ErrDuplicateKey is wrapped by ReadObject's error when an object repeats a key.
var ErrDuplicateKey = errors.New("json: duplicate object key")

// Member is one member of a JSON object. Value is a sub-slice of the object's bytes.
type Member struct {
	Key   string
	Value json.RawMessage
}

// Valid reports whether raw is exactly one well-formed JSON value, surrounded by nothing but
// whitespace.
func Valid(raw []byte) error {
	end, err := ScanValue(raw, SkipSpace(raw, 0), 0)
	if err != nil {
		return err
	}
	if end = SkipSpace(raw, end); end != len(raw) {
		return &SyntaxError{end, "data after the value"}
	}
	return nil
}

// ReadObject reads raw as one JSON object and returns its members in order. Member values are
// validated and trimmed of surrounding whitespace. A repeated key is an error wrapping
// ErrDuplicateKey.
func ReadObject(raw []byte) ([]Member, error) {
	// Small objects (every seed shape) are checked by a scan; past smallObject members a set takes
	// over, so a peer's object of a million keys costs a million lookups, not 10^12 comparisons.
	const smallObject = 16
	var members []Member
	var seen map[string]struct{}
	err := ForEachMember(raw, func(key, value []byte) error {
		dup := false
		if seen == nil {
			for _, m := range members {
				if m.Key == string(key) {
					dup = true
					break
				}
			}
		} else {
			_, dup = seen[string(key)]
		}
		if dup {
			return fmt.Errorf("%w %q", ErrDuplicateKey, truncateKey(string(key)))
		}
		k := string(key)
		members = append(members, Member{k, value})
		if seen != nil {
			seen[k] = struct{}{}
		} else if len(members) > smallObject {
			seen = make(map[string]struct{}, 2*len(members))
			for _, m := range members {
				seen[m.Key] = struct{}{}
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return members, nil
}

// Lookup returns the raw value under key in the JSON object raw, or ok == false when the object
// has no such key. It validates the whole object and refuses repeated keys, like ReadObject, but
// allocates nothing for the members it skips.
func Lookup(raw []byte, key string) (value json.RawMessage, ok bool, err error) {
	err = ForEachMember(raw, func(k, v []byte) error {
		if string(k) != key {
			return nil
		}
		if ok {
			return fmt.Errorf("%w %q", ErrDuplicateKey, truncateKey(key))
		}
		value, ok = v, true
		return nil
	})
	if err != nil {
		return nil, false, err
	}
	return value, ok, nil
}

func truncateKey(k string) string {
	if len(k) > 64 {
		return k[:64] + "…"
	}
	return k
}

// Field is one member an object reader takes: its key, where its value goes, and whether the
// object may lack it. Build fields with Req and Opt and read them with ReadExact or ReadTolerant.
type Field struct {
	key      string
	dst      *[]byte
	optional bool
}

// Req is a member the object must have. Its value, a sub-slice of the object, goes to *dst.
func Req(key string, dst *[]byte) Field { return Field{key: key, dst: dst} }

// Opt is a member the object may lack; *dst is nil when it does.
func Opt(key string, dst *[]byte) Field { return Field{key: key, dst: dst, optional: true} }

// ErrShape is wrapped by ReadExact's and ReadTolerant's error for an object that lacks a required
// member or, read exactly, has a member its fields do not name.
var ErrShape = errors.New("json: object does not have the members of its shape")

// ReadExact reads raw as one JSON object whose members are exactly fields: each required one,
// any optional one, no other and none twice. It is how a seed-spelled shape is read (docs/protocol.md#sources-and-conventions: exact
// where the seeds are exact). Values are sub-slices of raw, trimmed of surrounding whitespace;
// nothing is allocated but an error.
func ReadExact(raw []byte, fields ...Field) error { return readFields(raw, fields, true) }

// ReadTolerant reads the members fields name from the JSON object raw and ignores every other
// member, which is checked as JSON and nothing else. It is how a project-defined shape is read
// (docs/protocol.md#sources-and-conventions: tolerant where this project guessed). A member it reads may not appear twice; a member it
// ignores may.
func ReadTolerant(raw []byte, fields ...Field) error { return readFields(raw, fields, false) }

func readFields(raw []byte, fields []Field, exact bool) error {
	for _, f := range fields {
		*f.dst = nil
	}
	err := ForEachMember(raw, func(key, value []byte) error {
		for _, f := range fields {
			if string(key) != f.key {
				continue
			}
			if *f.dst != nil {
				return fmt.Errorf("%w %q", ErrDuplicateKey, truncateKey(string(key)))
			}
			*f.dst = value
			return nil
		}
		if exact {
			return fmt.Errorf("%w: a member it does not name", ErrShape)
		}
		return nil
	})
	if err != nil {
		return err
	}
	for _, f := range fields {
		if !f.optional && *f.dst == nil {
			// A copy of the key: an error must not keep the caller's fields alive (they stay on
			// its stack).
			return fmt.Errorf("%w: %q is missing", ErrShape, strings.Clone(truncateKey(f.key)))
		}
	}
	return nil
}

// ReadArray reads raw as one JSON array and returns its elements, each a sub-slice of raw.
func ReadArray(raw []byte) ([]json.RawMessage, error) {
	i := SkipSpace(raw, 0)
	if i >= len(raw) || raw[i] != '[' {
		return nil, &SyntaxError{i, "not an array"}
	}
	var elems []json.RawMessage
	i = SkipSpace(raw, i+1)
	if i < len(raw) && raw[i] == ']' {
		return []json.RawMessage{}, Trailing(raw, i+1)
	}
	for {
		start := i
		end, err := ScanValue(raw, i, 1)
		if err != nil {
			return nil, err
		}
		elems = append(elems, raw[start:end])
		i = SkipSpace(raw, end)
		if i >= len(raw) {
			return nil, &SyntaxError{i, "unterminated array"}
		}
		if raw[i] == ']' {
			return elems, Trailing(raw, i+1)
		}
		if raw[i] != ',' {
			return nil, &SyntaxError{i, "expected , or ] in array"}
		}
		i = SkipSpace(raw, i+1)
	}
}

// ReadString reads raw as one JSON string and returns its decoded value.
func ReadString(raw []byte) (string, error) {
	i := SkipSpace(raw, 0)
	end, err := ScanString(raw, i)
	if err != nil {
		return "", err
	}
	if err := Trailing(raw, end); err != nil {
		return "", err
	}
	return decodeString(raw[i:end]), nil
}

// ReadBool reads raw as one JSON boolean.
func ReadBool(raw []byte) (value, ok bool) {
	switch string(TrimSpace(raw)) {
	case "true":
		return true, true
	case "false":
		return false, true
	}
	return false, false
}

// IsNull reports whether raw is the JSON literal null.
func IsNull(raw []byte) bool { return string(TrimSpace(raw)) == "null" }

// MaxSafeInteger is JavaScript's Number.MAX_SAFE_INTEGER, the largest counter the seeds admit.
const MaxSafeInteger = 1<<53 - 1

// ReadSafeInteger reads raw as a JSON number whose value is an integer within ±MaxSafeInteger, the
// way JavaScript's Number.isSafeInteger judges a value after JSON.parse: 1.0 and 1e3 are integers,
// 9007199254740993 is not safe.
func ReadSafeInteger(raw []byte) (int64, bool) {
	raw = TrimSpace(raw)
	if KindOf(raw) != KindNumber {
		return 0, false
	}
	if end, err := scanNumber(raw, 0); err != nil || end != len(raw) {
		return 0, false
	}
	if n, err := strconv.ParseInt(string(raw), 10, 64); err == nil {
		return n, n >= -MaxSafeInteger && n <= MaxSafeInteger
	}
	f, err := strconv.ParseFloat(string(raw), 64)
	if err != nil || f != float64(int64(f)) || f > MaxSafeInteger || f < -MaxSafeInteger {
		return 0, false
	}
	return int64(f), true
}

// ReadCounter reads raw as a non-negative safe integer, the seeds' counter and revision type.
func ReadCounter(raw []byte) (int64, bool) {
	n, ok := ReadSafeInteger(raw)
	return n, ok && n >= 0
}

// ForEachMember validates the JSON object raw and calls fn for each member in order. key is the
// decoded key: a sub-slice of raw when the key has no escapes, so it allocates nothing; fn must
// not keep it. ForEachMember does not refuse repeated keys: a caller that reads a key must, as
// ReadObject and Lookup do.
func ForEachMember(raw []byte, fn func(key, value []byte) error) error {
	return ForEachMemberWithin(raw, nil, nil, fn)
}

// ForEachMemberWithin is ForEachMember that also reads, in the same pass, the members of the
// members that within names, when their values are objects: inner is called with each of them
// (outer is the key within names), as ForEachMember(value, …) would call it, before fn is called
// with the member itself. An error from either stops the walk and is returned. It spares a reader
// of a member's members (a stream frame's request.streamId) a second scan of the member's bytes.
func ForEachMemberWithin(raw []byte, within []string, inner func(outer, key, value []byte) error, fn func(key, value []byte) error) error {
	i := SkipSpace(raw, 0)
	if i >= len(raw) || raw[i] != '{' {
		return &SyntaxError{i, "not an object"}
	}
	i = SkipSpace(raw, i+1)
	if i < len(raw) && raw[i] == '}' {
		return Trailing(raw, i+1)
	}
	for {
		keyEnd, err := ScanString(raw, i)
		if err != nil {
			return err
		}
		key := DecodeScannedString(raw[i:keyEnd])
		i = SkipSpace(raw, keyEnd)
		if i >= len(raw) || raw[i] != ':' {
			return &SyntaxError{i, "expected : after object key"}
		}
		start := SkipSpace(raw, i+1)
		var end int
		if start < len(raw) && raw[start] == '{' && names(within, key) {
			end, err = scanComposite(raw, start, 1, '}', func(k, v []byte) error { return inner(key, k, v) })
		} else {
			end, err = ScanValue(raw, start, 1)
		}
		if err != nil {
			return err
		}
		if err := fn(key, raw[start:end]); err != nil {
			return err
		}
		i = SkipSpace(raw, end)
		if i >= len(raw) {
			return &SyntaxError{i, "unterminated object"}
		}
		if raw[i] == '}' {
			return Trailing(raw, i+1)
		}
		if raw[i] != ',' {
			return &SyntaxError{i, "expected , or } in object"}
		}
		i = SkipSpace(raw, i+1)
	}
}

// names reports whether keys holds key.
func names(keys []string, key []byte) bool {
	for _, k := range keys {
		if string(key) == k {
			return true
		}
	}
	return false
}

// Trailing checks that nothing but whitespace follows the value ending at raw[i].
func Trailing(raw []byte, i int) error {
	if i = SkipSpace(raw, i); i != len(raw) {
		return &SyntaxError{i, "data after the value"}
	}
	return nil
}

// The scanner below is on the path of every frame the relay reads, and the library's binary stream
// chunks make it read a great deal: a Uint8Array of 64 KiB arrives as ~600 KB of {"0":104,"1":…},
// a Node.js Buffer of 512 KiB as ~1.9 MB of [104,101,…]. So its inner loops avoid a call and an
// unpredictable branch per byte: runs of digits and of plain string bytes are found eight bytes at
// a time (SWAR, below); a short key (shortKey) and a plain integer are read in the composite's own
// loop; and a run of plain integers in an array is validated eight bytes at a time (integerRun).
// Each fast path takes only what it can prove well-formed and leaves everything else, errors
// included, to the general code from a point where that code would have been. So the language it
// accepts, its errors and their offsets are exactly those of the straightforward scanner it
// replaced, which its tests keep as the reference (json_ref_test.go, FuzzScannerMatchesReference).

// isSpace reports JSON whitespace. Machine-written JSON has little of it, so a byte above ' ' (the
// usual case) costs one comparison.
func isSpace(c byte) bool { return c <= ' ' && (c == ' ' || c == '\t' || c == '\n' || c == '\r') }

// SkipSpace is the offset of the first byte at or after b[i] that is not JSON whitespace.
func SkipSpace(b []byte, i int) int {
	for i < len(b) && isSpace(b[i]) {
		i++
	}
	return i
}

// TrimSpace is b without JSON whitespace at either end.
func TrimSpace(b []byte) []byte {
	i, j := 0, len(b)
	for i < j && isSpace(b[i]) {
		i++
	}
	for j > i && isSpace(b[j-1]) {
		j--
	}
	return b[i:j]
}

// ScanValue validates the value starting at b[i], nested depth deep in what contains it, and
// returns the offset just after it. With SkipSpace, ScanString, DecodeScannedString and Trailing
// it is what a reader of one shape in one pass builds on (contracts' stream markers).
func ScanValue(b []byte, i, depth int) (int, error) {
	if i >= len(b) {
		return i, &SyntaxError{i, "unexpected end of input"}
	}
	switch c := b[i]; {
	case c == '"':
		return ScanString(b, i)
	case c == '-' || (c >= '0' && c <= '9'):
		return scanNumber(b, i)
	case c == '{':
		return scanComposite(b, i, depth, '}', nil)
	case c == '[':
		return scanComposite(b, i, depth, ']', nil)
	case c == 't':
		return scanLiteral(b, i, "true")
	case c == 'f':
		return scanLiteral(b, i, "false")
	case c == 'n':
		return scanLiteral(b, i, "null")
	}
	return i, &SyntaxError{i, "invalid character"}
}

// scanComposite validates the object or array at b[i] and returns the offset just after it. For an
// object, a non-nil fn is called with each member, as ForEachMember calls it; its error stops the
// scan and is returned.
func scanComposite(b []byte, i, depth int, closer byte, fn func(key, value []byte) error) (int, error) {
	if depth >= MaxJSONDepth {
		return i, &SyntaxError{i, "nesting too deep"}
	}
	i = SkipSpace(b, i+1)
	if i < len(b) && b[i] == closer {
		return i + 1, nil
	}
	runs := closer == ']' // whether to try integerRun: until it first finds nothing to take
	for {
		var key []byte
		if runs && i < len(b) && b[i]-'0' < 10 {
			j := integerRun(b, i)
			runs = j > i
			i = SkipSpace(b, j)
		}
		if closer == '}' {
			end := shortKey(b, i)
			if end < 0 {
				var err error
				if end, err = ScanString(b, i); err != nil {
					return end, err
				}
			}
			if fn != nil {
				key = DecodeScannedString(b[i:end])
			}
			i = SkipSpace(b, end)
			if i >= len(b) || b[i] != ':' {
				return i, &SyntaxError{i, "expected : after object key"}
			}
			i = SkipSpace(b, i+1)
		}
		var end int
		var err error
		if i < len(b) && b[i]-'1' < 9 {
			// A number that starts with 1 to 9 (the library's chunk bytes, one per member or
			// element) is scanned here without a call, unless it has a fraction or an exponent.
			end = digits(b, i+1)
			if end < len(b) && (b[end] == '.' || b[end]|0x20 == 'e') {
				end, err = scanNumber(b, i)
			}
		} else {
			end, err = ScanValue(b, i, depth+1)
		}
		if err != nil {
			return end, err
		}
		if fn != nil {
			if err := fn(key, b[i:end]); err != nil {
				return end, err
			}
		}
		i = SkipSpace(b, end)
		if i >= len(b) {
			return i, &SyntaxError{i, "unterminated object or array"}
		}
		if b[i] == closer {
			return i + 1, nil
		}
		if b[i] != ',' {
			return i, &SyntaxError{i, "expected , or " + string(closer)}
		}
		i = SkipSpace(b, i+1)
	}
}

func scanLiteral(b []byte, i int, lit string) (int, error) {
	if len(b)-i < len(lit) || string(b[i:i+len(lit)]) != lit {
		return i, &SyntaxError{i, "invalid literal"}
	}
	return i + len(lit), nil
}

// scanNumber validates -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)? at b[i].
func scanNumber(b []byte, i int) (int, error) {
	start := i
	if i < len(b) && b[i] == '-' {
		i++
	}
	switch {
	case i < len(b) && b[i] == '0':
		i++
	case i < len(b) && b[i] >= '1' && b[i] <= '9':
		i = digits(b, i+1)
	default:
		return i, &SyntaxError{start, "invalid number"}
	}
	if i < len(b) && b[i] == '.' {
		if j := digits(b, i+1); j > i+1 {
			i = j
		} else {
			return i, &SyntaxError{start, "invalid number"}
		}
	}
	if i < len(b) && (b[i] == 'e' || b[i] == 'E') {
		i++
		if i < len(b) && (b[i] == '+' || b[i] == '-') {
			i++
		}
		if j := digits(b, i); j > i {
			i = j
		} else {
			return i, &SyntaxError{start, "invalid number"}
		}
	}
	return i, nil
}

// SWAR ("SIMD within a register"): eight bytes of the input loaded as one uint64 and tested at
// once by arithmetic that keeps each byte's result in its own high bit. Every test below is exact
// for each byte on its own (no carry crosses into the next byte), so the lowest high bit set marks
// the first byte that matched, and bits.TrailingZeros64(m)/8 is its index in the word.
const (
	swarOnes  = 0x0101010101010101
	swarLow7  = 0x7f * swarOnes
	swarHighs = 0x80 * swarOnes
)

// swarZero sets the high bit of each byte of y that is zero. ((y & 0x7f) + 0x7f has its high bit
// set when the low seven bits are not all zero; y's own high bit covers the rest.)
func swarZero(y uint64) uint64 { return ^(((y & swarLow7) + swarLow7) | y) & swarHighs }

// swarNonDigits sets the high bit of each byte of x that is not an ASCII digit: x ^ '0' maps the
// digits to 0…9, and (t & 0x7f) + (0x80 - 10) reaches the high bit from 10 up.
func swarNonDigits(x uint64) uint64 {
	t := x ^ ('0' * swarOnes)
	return (((t & swarLow7) + (0x80-10)*swarOnes) | t) & swarHighs
}

// swarStringSpecials sets the high bit of each byte of x that a string scanner must look at: '"',
// '\\', a control character (below 0x20: (x & 0x7f) + 0x60 stays below the high bit) or a byte of
// a multi-byte UTF-8 sequence (its own high bit).
func swarStringSpecials(x uint64) uint64 {
	controlOrHigh := (x | ^((x & swarLow7) + 0x60*swarOnes)) & swarHighs
	return controlOrHigh | swarZero(x^('"'*swarOnes)) | swarZero(x^('\\'*swarOnes))
}

// digits returns the end of the run of ASCII digits at b[i]: eight bytes a step, and a byte a step
// for the last few.
func digits(b []byte, i int) int {
	for i+8 <= len(b) {
		if m := swarNonDigits(binary.LittleEndian.Uint64(b[i:])); m != 0 {
			return i + bits.TrailingZeros64(m)>>3
		}
		i += 8
	}
	for i < len(b) && b[i]-'0' < 10 {
		i++
	}
	return i
}

// shortKey returns the end of a string at b[i] that closes within the eight bytes after its opening
// quote and has no byte that needs attention before it (a Uint8Array's keys, an envelope's), or -1
// for any other string or anything else, which ScanString reads. It is ScanString's common case
// in one word, without looking at the byte it stopped on a second time.
func shortKey(b []byte, i int) int {
	if i+9 > len(b) || b[i] != '"' {
		return -1
	}
	x := binary.LittleEndian.Uint64(b[i+1:])
	first := swarStringSpecials(x)
	first &= -first // the first byte that needs attention, or none
	if first&swarZero(x^('"'*swarOnes)) == 0 {
		return -1
	}
	return i + 2 + bits.TrailingZeros64(first)>>3
}

// integerRun validates, eight bytes at a time, array elements from b[i] on (the start of one) that
// are plain non-negative integers separated by bare commas, as a Node.js Buffer's JSON is
// ([104,101,…]), and returns the start of the first element it did not validate: the element at
// the end of the run, or one with anything unusual in it (a sign, a fraction, a space, an error),
// which the element-by-element scan reads from there. A word is a run of such elements when its
// bytes are digits and commas only, no comma follows a comma (or the start), and no digit follows
// a number's leading zero; a comma ends a validated element when nothing before it was unusual.
func integerRun(b []byte, i int) int {
	resume := i
	var lastComma, lastZeroStart uint64 = 0x80, 0 // of the byte before b[i], in byte 0's place
	for ; i+8 <= len(b); i += 8 {
		x := binary.LittleEndian.Uint64(b[i:])
		digit := ^swarNonDigits(x) & swarHighs
		comma := swarZero(x ^ (',' * swarOnes))
		afterComma := comma<<8 | lastComma
		zeroStart := digit & afterComma & swarZero(x^('0'*swarOnes))
		unusual := ^(digit | comma) & swarHighs
		unusual |= comma & afterComma
		unusual |= digit & (zeroStart<<8 | lastZeroStart)
		if unusual != 0 {
			comma &= 1<<bits.TrailingZeros64(unusual) - 1 // the commas before it
		}
		if comma != 0 {
			resume = i + (63-bits.LeadingZeros64(comma))>>3 + 1
		}
		if unusual != 0 {
			break
		}
		lastComma, lastZeroStart = comma>>56, zeroStart>>56
	}
	return resume
}

// plainStringByte is true for the bytes a string scanner passes over: printable ASCII but '"' and
// '\\' (DEL included, as RFC 8259 allows it unescaped).
var plainStringByte = func() (t [256]bool) {
	for c := 0x20; c < utf8.RuneSelf; c++ {
		t[c] = c != '"' && c != '\\'
	}
	return t
}()

// ScanString validates the string starting at b[i] (which must be '"') and returns the offset just
// after its closing quote.
func ScanString(b []byte, i int) (int, error) {
	if i >= len(b) || b[i] != '"' {
		return i, &SyntaxError{i, "expected string"}
	}
	i++
	for {
		// Pass over the bytes that need no attention: eight at a time, then one at a time.
		for {
			if i+8 > len(b) {
				for i < len(b) && plainStringByte[b[i]] {
					i++
				}
				break
			}
			if m := swarStringSpecials(binary.LittleEndian.Uint64(b[i:])); m != 0 {
				i += bits.TrailingZeros64(m) >> 3
				break
			}
			i += 8
		}
		if i >= len(b) {
			return i, &SyntaxError{i, "unterminated string"}
		}
		switch c := b[i]; {
		case c == '"':
			return i + 1, nil
		case c == '\\':
			if i+1 >= len(b) {
				return i, &SyntaxError{i, "unterminated string"}
			}
			switch b[i+1] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				i += 2
			case 'u':
				r, ok := hex4(b, i+2)
				if !ok {
					return i, &SyntaxError{i, "invalid \\u escape"}
				}
				i += 6
				if utf16.IsSurrogate(r) {
					// Only a high surrogate followed by an escaped low surrogate is a character.
					if r >= 0xDC00 || i+1 >= len(b) || b[i] != '\\' || b[i+1] != 'u' {
						return i, &SyntaxError{i, "lone surrogate escape"}
					}
					r2, ok := hex4(b, i+2)
					if !ok || r2 < 0xDC00 || r2 > 0xDFFF {
						return i, &SyntaxError{i, "lone surrogate escape"}
					}
					i += 6
				}
			default:
				return i, &SyntaxError{i, "invalid escape"}
			}
		case c < 0x20:
			return i, &SyntaxError{i, "control character in string"}
		default: // the first byte of a multi-byte sequence, or not UTF-8
			r, size := utf8.DecodeRune(b[i:])
			if r == utf8.RuneError && size == 1 {
				return i, &SyntaxError{i, "invalid UTF-8 in string"}
			}
			i += size
		}
	}
}

func hex4(b []byte, i int) (rune, bool) {
	if i+4 > len(b) {
		return 0, false
	}
	var r rune
	for _, c := range b[i : i+4] {
		r <<= 4
		switch {
		case c >= '0' && c <= '9':
			r |= rune(c - '0')
		case c >= 'a' && c <= 'f':
			r |= rune(c - 'a' + 10)
		case c >= 'A' && c <= 'F':
			r |= rune(c - 'A' + 10)
		default:
			return 0, false
		}
	}
	return r, true
}

// decodeString decodes a string ScanString already validated, quotes included.
func decodeString(q []byte) string { return string(DecodeScannedString(q)) }

// DecodeScannedString is the content of a string ScanString validated, quotes included: a
// sub-slice of q when it has no escapes, else a decoded copy.
func DecodeScannedString(q []byte) []byte {
	s := q[1 : len(q)-1]
	if bytes.IndexByte(s, '\\') < 0 {
		return s
	}
	out := make([]byte, 0, len(s))
	for i := 0; i < len(s); {
		if s[i] != '\\' {
			out = append(out, s[i])
			i++
			continue
		}
		switch s[i+1] {
		case 'b':
			out = append(out, '\b')
		case 'f':
			out = append(out, '\f')
		case 'n':
			out = append(out, '\n')
		case 'r':
			out = append(out, '\r')
		case 't':
			out = append(out, '\t')
		case 'u':
			r, _ := hex4(s, i+2)
			if utf16.IsSurrogate(r) {
				r2, _ := hex4(s, i+8)
				r = utf16.DecodeRune(r, r2)
				i += 6
			}
			out = utf8.AppendRune(out, r)
			i += 6
			continue
		default: // '"', '\\', '/'
			out = append(out, s[i+1])
		}
		i += 2
	}
	return out
}

// AppendString appends s as a JSON string in the canonical form of RFC 8785: only '"', '\\' and
// control characters are escaped (the short escapes where JSON has one, else \u00xx), everything
// else, "<", "&" and U+2028 included, is written as UTF-8. s must be valid UTF-8.
func AppendString(dst []byte, s string) []byte {
	const hexDigits = "0123456789abcdef"
	dst = append(dst, '"')
	start := 0
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c >= 0x20 && c != '"' && c != '\\' {
			continue
		}
		dst = append(dst, s[start:i]...)
		switch c {
		case '"':
			dst = append(dst, '\\', '"')
		case '\\':
			dst = append(dst, '\\', '\\')
		case '\b':
			dst = append(dst, '\\', 'b')
		case '\f':
			dst = append(dst, '\\', 'f')
		case '\n':
			dst = append(dst, '\\', 'n')
		case '\r':
			dst = append(dst, '\\', 'r')
		case '\t':
			dst = append(dst, '\\', 't')
		default:
			dst = append(dst, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xF])
		}
		start = i + 1
	}
	dst = append(dst, s[start:]...)
	return append(dst, '"')
}
