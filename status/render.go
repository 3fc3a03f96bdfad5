package status

import (
	"bytes"
	"encoding/json"
	"fmt"
	"html/template"
	"slices"
	"strings"
	"time"
)

// renderJSON renders a part's facts — any JSON value — as nested HTML for people: an object as a
// two-column table in its own key order, an array of objects as a table with a column per key,
// any other array as a list, a scalar as text. Keys read as words (Label); a timestamp reads as
// how long ago or until it is (At), a number under a key ending in Bytes as a size, one ending in
// Seconds or Ms as a duration, a boolean as yes or no. Everything is escaped.
func renderJSON(now time.Time, b []byte) template.HTML {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	v, err := decodeOrdered(dec)
	if err != nil {
		return ""
	}
	var out strings.Builder
	renderer{now: now, out: &out}.value("", v)
	return template.HTML(out.String())
}

// member is one member of a JSON object, in its order.
type member struct {
	key   string
	value any
}

// decodeOrdered decodes one JSON value, keeping objects' member order ([]member).
func decodeOrdered(dec *json.Decoder) (any, error) {
	tok, err := dec.Token()
	if err != nil {
		return nil, err
	}
	switch t := tok.(type) {
	case json.Delim:
		switch t {
		case '{':
			var obj []member
			for dec.More() {
				k, err := dec.Token()
				if err != nil {
					return nil, err
				}
				v, err := decodeOrdered(dec)
				if err != nil {
					return nil, err
				}
				obj = append(obj, member{key: fmt.Sprint(k), value: v})
			}
			_, err := dec.Token()
			return obj, err
		case '[':
			var arr []any
			for dec.More() {
				v, err := decodeOrdered(dec)
				if err != nil {
					return nil, err
				}
				arr = append(arr, v)
			}
			_, err := dec.Token()
			return arr, err
		}
	}
	return tok, nil
}

type renderer struct {
	now time.Time
	out *strings.Builder
}

func (r renderer) write(s string) { r.out.WriteString(s) }

// value renders v, the value of key ("" for none).
func (r renderer) value(key string, v any) {
	esc := template.HTMLEscapeString
	switch x := v.(type) {
	case []member:
		r.write("<table>")
		for _, m := range x {
			r.write("<tr><th>" + esc(Label(m.key)) + "</th><td>")
			r.value(m.key, m.value)
			r.write("</td></tr>")
		}
		r.write("</table>")
	case []any:
		if len(x) == 0 {
			r.write("none")
			return
		}
		if cols := columns(x); cols != nil {
			r.write("<table><tr>")
			for _, c := range cols {
				r.write("<th>" + esc(Label(c)) + "</th>")
			}
			r.write("</tr>")
			for _, row := range x {
				r.write("<tr>")
				for _, c := range cols {
					r.write("<td>")
					for _, m := range row.([]member) {
						if m.key == c {
							r.value(m.key, m.value)
						}
					}
					r.write("</td>")
				}
				r.write("</tr>")
			}
			r.write("</table>")
			return
		}
		for i, e := range x {
			if i > 0 {
				r.write(", ")
			}
			r.value(key, e)
		}
	default:
		r.write(esc(r.scalar(key, x)))
	}
}

// scalar is a JSON scalar as text, read by its key.
func (r renderer) scalar(key string, v any) string {
	switch x := v.(type) {
	case nil:
		return "—"
	case bool:
		if x {
			return "yes"
		}
		return "no"
	case json.Number:
		n, err := x.Int64()
		switch {
		case err != nil:
		case strings.HasSuffix(key, "Bytes") || key == "bytes":
			return Bytes(n)
		case strings.HasSuffix(key, "Seconds") || key == "seconds":
			return Duration(time.Duration(n) * time.Second)
		case strings.HasSuffix(key, "Ms") || strings.HasSuffix(key, "Millis"):
			return Duration(time.Duration(n) * time.Millisecond)
		}
		return x.String()
	case string:
		// A timestamp (encoding/json writes a time.Time in RFC 3339 with nanoseconds).
		if len(x) >= len("2006-01-02T15:04:05Z") && x[4] == '-' && x[10] == 'T' {
			if t, err := time.Parse(time.RFC3339Nano, x); err == nil {
				return At(r.now, t)
			}
		}
		return x
	}
	return fmt.Sprint(v)
}

// columns is the union of the keys of rows, in first-seen order, when every row is an object.
func columns(rows []any) []string {
	var cols []string
	for _, r := range rows {
		obj, ok := r.([]member)
		if !ok {
			return nil
		}
		for _, m := range obj {
			if !slices.Contains(cols, m.key) {
				cols = append(cols, m.key)
			}
		}
	}
	return cols
}
