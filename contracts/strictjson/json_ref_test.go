package strictjson

import (
	"bytes"
	"unicode/utf16"
	"unicode/utf8"
)

// The slow reference: the strict JSON scanner as it was before it was made fast (json.go at
// 45fa1cf), line for line but for the ref prefix. TestScannerMatchesReference and
// FuzzScannerMatchesReference hold the scanner in json.go to it: the same inputs accepted, the
// same errors at the same offsets, the same value boundaries. Never optimise this file.

func refValid(raw []byte) error {
	end, err := refScanValue(raw, refSkipSpace(raw, 0), 0)
	if err != nil {
		return err
	}
	if end = refSkipSpace(raw, end); end != len(raw) {
		return &SyntaxError{end, "data after the value"}
	}
	return nil
}

func refForEachMember(raw []byte, fn func(key, value []byte) error) error {
	i := refSkipSpace(raw, 0)
	if i >= len(raw) || raw[i] != '{' {
		return &SyntaxError{i, "not an object"}
	}
	i = refSkipSpace(raw, i+1)
	if i < len(raw) && raw[i] == '}' {
		return refTrailing(raw, i+1)
	}
	for {
		keyEnd, err := refScanString(raw, i)
		if err != nil {
			return err
		}
		key := refDecodeStringBytes(raw[i:keyEnd])
		i = refSkipSpace(raw, keyEnd)
		if i >= len(raw) || raw[i] != ':' {
			return &SyntaxError{i, "expected : after object key"}
		}
		start := refSkipSpace(raw, i+1)
		end, err := refScanValue(raw, start, 1)
		if err != nil {
			return err
		}
		if err := fn(key, raw[start:end]); err != nil {
			return err
		}
		i = refSkipSpace(raw, end)
		if i >= len(raw) {
			return &SyntaxError{i, "unterminated object"}
		}
		if raw[i] == '}' {
			return refTrailing(raw, i+1)
		}
		if raw[i] != ',' {
			return &SyntaxError{i, "expected , or } in object"}
		}
		i = refSkipSpace(raw, i+1)
	}
}

func refTrailing(raw []byte, i int) error {
	if i = refSkipSpace(raw, i); i != len(raw) {
		return &SyntaxError{i, "data after the value"}
	}
	return nil
}

func refIsSpace(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\r' }

func refSkipSpace(b []byte, i int) int {
	for i < len(b) && refIsSpace(b[i]) {
		i++
	}
	return i
}

func refScanValue(b []byte, i, depth int) (int, error) {
	if i >= len(b) {
		return i, &SyntaxError{i, "unexpected end of input"}
	}
	switch c := b[i]; {
	case c == '{':
		return refScanComposite(b, i, depth, '}')
	case c == '[':
		return refScanComposite(b, i, depth, ']')
	case c == '"':
		return refScanString(b, i)
	case c == '-' || (c >= '0' && c <= '9'):
		return refScanNumber(b, i)
	case c == 't':
		return refScanLiteral(b, i, "true")
	case c == 'f':
		return refScanLiteral(b, i, "false")
	case c == 'n':
		return refScanLiteral(b, i, "null")
	}
	return i, &SyntaxError{i, "invalid character"}
}

func refScanComposite(b []byte, i, depth int, closer byte) (int, error) {
	if depth >= MaxJSONDepth {
		return i, &SyntaxError{i, "nesting too deep"}
	}
	i = refSkipSpace(b, i+1)
	if i < len(b) && b[i] == closer {
		return i + 1, nil
	}
	for {
		if closer == '}' {
			end, err := refScanString(b, i)
			if err != nil {
				return end, err
			}
			i = refSkipSpace(b, end)
			if i >= len(b) || b[i] != ':' {
				return i, &SyntaxError{i, "expected : after object key"}
			}
			i = refSkipSpace(b, i+1)
		}
		end, err := refScanValue(b, i, depth+1)
		if err != nil {
			return end, err
		}
		i = refSkipSpace(b, end)
		if i >= len(b) {
			return i, &SyntaxError{i, "unterminated object or array"}
		}
		if b[i] == closer {
			return i + 1, nil
		}
		if b[i] != ',' {
			return i, &SyntaxError{i, "expected , or " + string(closer)}
		}
		i = refSkipSpace(b, i+1)
	}
}

func refScanLiteral(b []byte, i int, lit string) (int, error) {
	if len(b)-i < len(lit) || string(b[i:i+len(lit)]) != lit {
		return i, &SyntaxError{i, "invalid literal"}
	}
	return i + len(lit), nil
}

func refScanNumber(b []byte, i int) (int, error) {
	start := i
	if i < len(b) && b[i] == '-' {
		i++
	}
	switch {
	case i < len(b) && b[i] == '0':
		i++
	case i < len(b) && b[i] >= '1' && b[i] <= '9':
		i = refDigits(b, i)
	default:
		return i, &SyntaxError{start, "invalid number"}
	}
	if i < len(b) && b[i] == '.' {
		if j := refDigits(b, i+1); j > i+1 {
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
		if j := refDigits(b, i); j > i {
			i = j
		} else {
			return i, &SyntaxError{start, "invalid number"}
		}
	}
	return i, nil
}

func refDigits(b []byte, i int) int {
	for i < len(b) && b[i] >= '0' && b[i] <= '9' {
		i++
	}
	return i
}

func refScanString(b []byte, i int) (int, error) {
	if i >= len(b) || b[i] != '"' {
		return i, &SyntaxError{i, "expected string"}
	}
	i++
	for i < len(b) {
		c := b[i]
		switch {
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
				r, ok := refHex4(b, i+2)
				if !ok {
					return i, &SyntaxError{i, "invalid \\u escape"}
				}
				i += 6
				if utf16.IsSurrogate(r) {
					// Only a high surrogate followed by an escaped low surrogate is a character.
					if r >= 0xDC00 || i+1 >= len(b) || b[i] != '\\' || b[i+1] != 'u' {
						return i, &SyntaxError{i, "lone surrogate escape"}
					}
					r2, ok := refHex4(b, i+2)
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
		case c < utf8.RuneSelf:
			i++
		default:
			r, size := utf8.DecodeRune(b[i:])
			if r == utf8.RuneError && size == 1 {
				return i, &SyntaxError{i, "invalid UTF-8 in string"}
			}
			i += size
		}
	}
	return i, &SyntaxError{i, "unterminated string"}
}

func refHex4(b []byte, i int) (rune, bool) {
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

func refDecodeStringBytes(q []byte) []byte {
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
			r, _ := refHex4(s, i+2)
			if utf16.IsSurrogate(r) {
				r2, _ := refHex4(s, i+8)
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
