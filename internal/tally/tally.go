// Package tally counts events by name for the status page: a vocabulary fixed at construction,
// counted with atomics so that a part's Status never reads Prometheus back.
package tally

import "sync/atomic"

// Tally counts events by name; a name outside its vocabulary is not counted. Safe for concurrent
// use: the map is never written after New.
type Tally map[string]*atomic.Int64

// New returns a tally of names, each at zero.
func New(names []string) Tally {
	t := make(Tally, len(names))
	for _, n := range names {
		t[n] = new(atomic.Int64)
	}
	return t
}

// Add counts one event called name.
func (t Tally) Add(name string) {
	if c := t[name]; c != nil {
		c.Add(1)
	}
}

// Snapshot is every name's count, zeros included.
func (t Tally) Snapshot() map[string]int64 {
	out := make(map[string]int64, len(t))
	for n, c := range t {
		out[n] = c.Load()
	}
	return out
}
