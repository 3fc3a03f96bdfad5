package main

// locate finds the correlation of a TypedRequest envelope (docs/protocol.md#framing-typedrequest-over-websocket) without decoding it: the byte
// span of correlation.id's string token, quotes included, and the raw bytes of correlation.phase
// between its quotes. It reads only as far as the keys it needs and checks nothing else: the
// peers at either end judge the rest. ok is false when the frame is not an object whose
// correlation object carries a string id and a string phase; keys are compared as they are
// spelled, so an escaped key is not found.
func locate(b []byte) (idStart, idEnd int, phase []byte, ok bool) {
	i := skipSpace(b, 0)
	if i >= len(b) || b[i] != '{' {
		return 0, 0, nil, false
	}
	found := false
	err := members(b, i, func(key []byte, v, end int) bool {
		if string(key) != "correlation" {
			return true
		}
		if b[v] != '{' {
			return false
		}
		members(b, v, func(key []byte, v, end int) bool {
			switch string(key) {
			case "id":
				if b[v] == '"' {
					idStart, idEnd = v, end
				}
			case "phase":
				if b[v] == '"' {
					phase = b[v+1 : end-1]
				}
			}
			return true
		})
		found = true
		return false
	})
	if err || !found || idEnd == 0 || phase == nil {
		return 0, 0, nil, false
	}
	return idStart, idEnd, phase, true
}

// members walks the object opening at b[i], calling f with each key (between its quotes) and the
// span of its value, until f returns false or the object ends. It reports true when the bytes
// stop being an object before that.
func members(b []byte, i int, f func(key []byte, v, end int) bool) (broken bool) {
	i = skipSpace(b, i+1)
	if i < len(b) && b[i] == '}' {
		return false
	}
	for {
		if i >= len(b) || b[i] != '"' {
			return true
		}
		k := i
		i = skipString(b, i)
		if i < 0 {
			return true
		}
		key := b[k+1 : i-1]
		i = skipSpace(b, i)
		if i >= len(b) || b[i] != ':' {
			return true
		}
		v := skipSpace(b, i+1)
		end := skipValue(b, v)
		if end < 0 {
			return true
		}
		if !f(key, v, end) {
			return false
		}
		i = skipSpace(b, end)
		if i >= len(b) {
			return true
		}
		switch b[i] {
		case '}':
			return false
		case ',':
			i = skipSpace(b, i+1)
		default:
			return true
		}
	}
}

func skipSpace(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}

// skipString returns the index after the string opening at b[i], or -1 when it does not end.
func skipString(b []byte, i int) int {
	for i++; i < len(b); i++ {
		switch b[i] {
		case '\\':
			i++
		case '"':
			return i + 1
		}
	}
	return -1
}

// skipValue returns the index after the value starting at b[i], or -1 when it does not end.
// Objects and arrays are skipped by counting brackets outside strings; a literal ends at the
// next delimiter.
func skipValue(b []byte, i int) int {
	if i >= len(b) {
		return -1
	}
	switch b[i] {
	case '"':
		return skipString(b, i)
	case '{', '[':
		depth := 0
		for ; i < len(b); i++ {
			switch b[i] {
			case '"':
				if i = skipString(b, i); i < 0 {
					return -1
				}
				i--
			case '{', '[':
				depth++
			case '}', ']':
				if depth--; depth == 0 {
					return i + 1
				}
			}
		}
		return -1
	case ',', ':', '}', ']':
		return -1
	}
	for ; i < len(b); i++ {
		switch b[i] {
		case ',', '}', ']', ' ', '\t', '\n', '\r':
			return i
		}
	}
	return i
}

// splice returns b with b[start:end] replaced by repl, in a new slice.
func splice(b []byte, start, end int, repl []byte) []byte {
	out := make([]byte, 0, len(b)-(end-start)+len(repl))
	out = append(out, b[:start]...)
	out = append(out, repl...)
	return append(out, b[end:]...)
}
