package registry

import "time"

// The registry's facts for the operator's status page (relay.Reporter): the cache's size and how
// requests met it. Never a path, digest, repository, credential or the upstream's address.

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
	Hits          int64      `json:"hits"`          // GETs by digest served from a stored object
	Misses        int64      `json:"misses"`        // GETs by digest that fetched from the upstream
	Coalesced     int64      `json:"coalesced"`     // GETs by digest that joined another caller's fetch
	Evictions     int64      `json:"evictions"`     // stored objects removed to stay within the bound
	Bypassed      int64      `json:"bypassed"`      // GETs by digest served without the cache
}

// Status reports the cache's bytes and the hit, miss and eviction counts. It never touches the
// disk: a cache directory that could not be opened reads as unusable until a request reopens it.
func (r *Registry) Status() any {
	st := Status{Cache: "off", LimitBytes: r.cacheMax,
		Hits: r.m.nHits.Load(), Misses: r.m.nMisses.Load(), Coalesced: r.m.nCoalesced.Load(),
		Evictions: r.m.nEvictions.Load(), Bypassed: r.m.nBypass.Load()}
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
