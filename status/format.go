package status

import (
	"fmt"
	"strconv"
	"strings"
	"time"
	"unicode"
)

// Formatting for people: the page never shows a nanosecond, a raw byte count or a camelCase key.

// Duration is d in words and units, to the precision a person reads: "250ms", "45s", "3m12s",
// "2h05m", "3d04h". A negative d reads as its length.
func Duration(d time.Duration) string {
	if d < 0 {
		d = -d
	}
	switch {
	case d < time.Second:
		return d.Round(time.Millisecond).String()
	case d < time.Minute:
		return strconv.Itoa(int(d/time.Second)) + "s"
	case d < time.Hour:
		d = d.Round(time.Second)
		return fmt.Sprintf("%dm%02ds", d/time.Minute, d%time.Minute/time.Second)
	case d < 48*time.Hour:
		d = d.Round(time.Minute)
		return fmt.Sprintf("%dh%02dm", d/time.Hour, d%time.Hour/time.Minute)
	}
	d = d.Round(time.Hour)
	return fmt.Sprintf("%dd%02dh", d/(24*time.Hour), d%(24*time.Hour)/time.Hour)
}

// Relative is how far t is from now: "3m12s ago", "in 4s", "in 870ms"; "now" within 10 ms.
func Relative(now, t time.Time) string {
	d := now.Sub(t)
	switch {
	case d > -10*time.Millisecond && d < 10*time.Millisecond:
		return "now"
	case d > 0:
		return Duration(d) + " ago"
	}
	return "in " + Duration(d)
}

// clock is t in UTC to the second: "2026-12-01 10:00:00 UTC".
func clock(t time.Time) string { return t.UTC().Format("2006-01-02 15:04:05 UTC") }

// At is a time for people: how far from now, then when: "3m12s ago (2026-12-01 10:00:00 UTC)";
// "—" for the zero time.
func At(now, t time.Time) string {
	if t.IsZero() {
		return "—"
	}
	return Relative(now, t) + " (" + clock(t) + ")"
}

// Bytes is n with a binary unit: "512 B", "16.0 KiB", "1.5 MiB", "10.0 GiB".
func Bytes(n int64) string {
	const unit = 1024
	if n < unit && n > -unit {
		return strconv.FormatInt(n, 10) + " B"
	}
	f, i := float64(n), -1
	for (f >= unit || f <= -unit) && i < 4 {
		f /= unit
		i++
	}
	return strconv.FormatFloat(f, 'f', 1, 64) + " " + string("KMGTP"[i]) + "iB"
}

// Label is a JSON key in words: "releasesWhileDetached" → "releases while detached", "nodeId" →
// "node id", "quicPort" → "quic port"; a run of capitals stays one word ("lastURL" → "last
// URL"). A key without capitals is itself.
func Label(key string) string {
	rs := []rune(key)
	var words []string
	start := 0
	for i := 1; i < len(rs); i++ {
		lowerToUpper := unicode.IsLower(rs[i-1]) || unicode.IsDigit(rs[i-1])
		lowerToUpper = lowerToUpper && unicode.IsUpper(rs[i])
		// "URLPath": the last capital of a run begins the next word.
		endOfRun := unicode.IsUpper(rs[i-1]) && unicode.IsUpper(rs[i]) && i+1 < len(rs) && unicode.IsLower(rs[i+1])
		if lowerToUpper || endOfRun {
			words = append(words, string(rs[start:i]))
			start = i
		}
	}
	words = append(words, string(rs[start:]))
	for i, w := range words {
		if len(w) > 1 && strings.ToUpper(w) == w {
			continue // an acronym
		}
		words[i] = strings.ToLower(w)
	}
	return strings.Join(words, " ")
}
