package sim

// What the simulated peers remember. A peer keeps counters for everything and, of what a test may
// want to read back, only a little: a small ring of the newest entries (newest), the first few of
// something that should never happen (firstFew), or everything only when a test asked for it
// (CorestoreOptions.RecordControls, RestoreAuthority.RecordGrants, RecordRenewals). `relay-dev`
// and the benchmarks run the same peers for as long as anyone likes, so nothing here grows with
// the traffic unless a test opted in.

// Bounds of the small records.
const (
	newestKept   = 64 // entries a ring keeps
	firstFewKept = 64 // violations a peer keeps; the first ones are the telling ones
)

// newest is a ring of the newest entries. The zero value is empty; the owner guards it.
type newest[T any] struct {
	buf  []T
	next int // where the next entry goes once buf is full
}

func (r *newest[T]) add(v T) {
	if len(r.buf) < newestKept {
		r.buf = append(r.buf, v)
		return
	}
	r.buf[r.next] = v
	r.next = (r.next + 1) % newestKept
}

// all returns a copy of the entries, oldest first.
func (r *newest[T]) all() []T {
	out := make([]T, 0, len(r.buf))
	out = append(out, r.buf[r.next:]...)
	return append(out, r.buf[:r.next]...)
}

// firstFew appends v to s unless s already holds firstFewKept entries.
func firstFew[T any](s []T, v T) []T {
	if len(s) >= firstFewKept {
		return s
	}
	return append(s, v)
}
