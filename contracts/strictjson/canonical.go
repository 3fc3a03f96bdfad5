package strictjson

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"unicode/utf16"
)

// Canonical JSON: one byte sequence for every JSON value, so that a digest of it (contracts
// decides the digest rules) is the same wherever the value was written.
//
// ASSUMPTION (project-defined, recorded in docs/decisions.md): canonical JSON is RFC 8785 (JCS)
// with one deliberate difference: a number written as a plain integer literal (digits, optional
// leading minus, no fraction or exponent) keeps its exact digits even beyond 2^53, where JCS would
// round it through an IEEE double. No valid serve.zone body holds such an integer in digested
// content (counters are safe integers), so the difference can only keep the relay from silently
// changing a value. "-0" canonicalizes to "0". Every other number is written as ECMAScript's
// Number.prototype.toString writes the nearest double. The golden vectors are under
// testdata/canonical.

// ErrNotCanonicalizable is wrapped by Canonicalize's error for input that is valid JSON but has
// no canonical form (a repeated key or a number outside the double range).
var ErrNotCanonicalizable = errors.New("json: no canonical form")

// Canonicalize returns the canonical JSON form of the single JSON value raw.
func Canonicalize(raw []byte) ([]byte, error) {
	if err := Valid(raw); err != nil {
		return nil, err
	}
	return appendCanonical(make([]byte, 0, len(raw)), TrimSpace(raw))
}

func appendCanonical(dst, v []byte) ([]byte, error) {
	switch KindOf(v) {
	case KindObject:
		members, err := ReadObject(v)
		if err != nil {
			if errors.Is(err, ErrDuplicateKey) {
				return nil, fmt.Errorf("%w: %w", ErrNotCanonicalizable, err)
			}
			return nil, err
		}
		slices.SortFunc(members, func(a, b Member) int { return compareUTF16(a.Key, b.Key) })
		dst = append(dst, '{')
		for i, m := range members {
			if i > 0 {
				dst = append(dst, ',')
			}
			dst = AppendString(dst, m.Key)
			dst = append(dst, ':')
			if dst, err = appendCanonical(dst, m.Value); err != nil {
				return nil, err
			}
		}
		return append(dst, '}'), nil
	case KindArray:
		elems, err := ReadArray(v)
		if err != nil {
			return nil, err
		}
		dst = append(dst, '[')
		for i, e := range elems {
			if i > 0 {
				dst = append(dst, ',')
			}
			if dst, err = appendCanonical(dst, e); err != nil {
				return nil, err
			}
		}
		return append(dst, ']'), nil
	case KindString:
		s, err := ReadString(v)
		if err != nil {
			return nil, err
		}
		return AppendString(dst, s), nil
	case KindNumber:
		return appendCanonicalNumber(dst, v)
	default: // true, false, null: already canonical
		return append(dst, v...), nil
	}
}

// compareUTF16 orders strings by their UTF-16 code units, as RFC 8785 §3.2.3 requires.
func compareUTF16(a, b string) int {
	ra, rb := []rune(a), []rune(b)
	for i := 0; i < len(ra) && i < len(rb); i++ {
		if ra[i] == rb[i] {
			continue
		}
		ua, ub := firstUnit(ra[i]), firstUnit(rb[i])
		if ua != ub {
			return int(ua) - int(ub)
		}
		// Same high surrogate: the low surrogates decide.
		_, la := utf16.EncodeRune(ra[i])
		_, lb := utf16.EncodeRune(rb[i])
		return int(la) - int(lb)
	}
	return len(ra) - len(rb)
}

func firstUnit(r rune) rune {
	if r >= 0x10000 {
		hi, _ := utf16.EncodeRune(r)
		return hi
	}
	return r
}

func appendCanonicalNumber(dst, lit []byte) ([]byte, error) {
	if isIntegerLiteral(lit) {
		if string(lit) == "-0" {
			return append(dst, '0'), nil
		}
		return append(dst, lit...), nil
	}
	f, err := strconv.ParseFloat(string(lit), 64)
	if err != nil || math.IsInf(f, 0) {
		return nil, fmt.Errorf("%w: number out of range", ErrNotCanonicalizable)
	}
	return AppendES6Number(dst, f), nil
}

func isIntegerLiteral(lit []byte) bool {
	for i, c := range lit {
		if c == '-' && i == 0 {
			continue
		}
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}

// AppendES6Number appends f as ECMAScript's Number.prototype.toString does (RFC 8785 §3.2.2.3).
func AppendES6Number(dst []byte, f float64) []byte {
	if f == 0 {
		return append(dst, '0')
	}
	if f < 0 {
		dst = append(dst, '-')
		f = -f
	}
	// Shortest round-trip digits d1…dk and exponent: f = 0.d1…dk × 10^n.
	e := strconv.FormatFloat(f, 'e', -1, 64) // "d.ddde±XX"
	mant, exp, _ := strings.Cut(e, "e")
	digits := strings.Replace(mant, ".", "", 1)
	x, _ := strconv.Atoi(exp)
	k, n := len(digits), x+1
	switch {
	case k <= n && n <= 21:
		dst = append(dst, digits...)
		for range n - k {
			dst = append(dst, '0')
		}
	case 0 < n && n <= 21:
		dst = append(dst, digits[:n]...)
		dst = append(dst, '.')
		dst = append(dst, digits[n:]...)
	case -6 < n && n <= 0:
		dst = append(dst, '0', '.')
		for range -n {
			dst = append(dst, '0')
		}
		dst = append(dst, digits...)
	default:
		dst = append(dst, digits[0])
		if k > 1 {
			dst = append(dst, '.')
			dst = append(dst, digits[1:]...)
		}
		dst = append(dst, 'e')
		if n-1 >= 0 {
			dst = append(dst, '+')
		}
		dst = strconv.AppendInt(dst, int64(n-1), 10)
	}
	return dst
}

// CanonicalWithout is the canonical JSON of the object raw without its member named field: what
// a digest over "every field except digest" hashes.
func CanonicalWithout(raw []byte, field string) ([]byte, error) {
	members, err := ReadObject(raw)
	if err != nil {
		return nil, err
	}
	obj := make([]byte, 0, len(raw))
	obj = append(obj, '{')
	for _, m := range members {
		if m.Key == field {
			continue
		}
		if len(obj) > 1 {
			obj = append(obj, ',')
		}
		obj = AppendString(obj, m.Key)
		obj = append(obj, ':')
		obj = append(obj, m.Value...)
	}
	obj = append(obj, '}')
	return Canonicalize(obj)
}
