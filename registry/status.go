package registry

import "time"

// The registry's facts for the operator's status page (relay.Reporter): the cache's size. How
// requests met it (hits, misses, coalesced, evictions, bypassed) is counted once, in the
// Prometheus counters, which the status page lists itself. Never a path, digest, repository,
// credential or the upstream's address.

// Status is what the registry reports on the status page.
type Status struct {
	// Cache is "on"; "off" when no cache directory is configured; "unusable" while the directory
	// cannot be used (requests are served uncached and counted as bypassed).
	Cache         string     `json:"cache"`
	UsedBytes     int64      `json:"usedBytes"`     // bytes of stored objects
	ReservedBytes int64      `json:"reservedBytes"` // bytes reserved by fills in progress
	LimitBytes    int64      `json:"limitBytes"`    // the cache bound on used plus reserved bytes
	Objects       int        `json:"objects"`       // stored objects
	Fills         int        `json:"fills"`         // fetches into the cache in progress
	PausedUntil   *time.Time `json:"pausedUntil"`   // after a disk error no fill starts before this; null: none
}

// Status reports the cache's bytes and objects. It never touches the
// disk: a cache directory that could not be opened reads as unusable until a request reopens it.
func (r *Registry) Status() any {
	st := Status{Cache: "off", LimitBytes: r.cacheMax}
	if r.cacheDir == "" {
		st.LimitBytes = 0
		return st
	}
	c := r.cache.Load()
	if c == nil {
		st.Cache = "unusable"
		return st
	}
	st.Cache = "on"
	c.mu.Lock()
	st.UsedBytes, st.ReservedBytes, st.Objects, st.Fills = c.used, c.reserved, len(c.entries), len(c.fills)
	pause := c.pauseTil
	c.mu.Unlock()
	if c.now().Before(pause) {
		p := pause.UTC()
		st.PausedUntil = &p
	}
	return st
}
