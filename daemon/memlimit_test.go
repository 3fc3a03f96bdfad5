package daemon

import "testing"

func TestParseMemoryLimit(t *testing.T) {
	for in, want := range map[string]int64{
		"max\n":                 0,
		"1073741824\n":          1 << 30,
		"9223372036854771712\n": 0, // cgroup v1's "no limit"
		"":                      0,
		"-1":                    0,
	} {
		if got := parseMemoryLimit(in); got != want {
			t.Errorf("parseMemoryLimit(%q) = %d, want %d", in, got, want)
		}
	}
}
