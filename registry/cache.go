package registry

import (
	"container/list"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"time"

	"github.com/rs/zerolog"

	"code.foss.global/serve.zone/relay/contracts"
)

// cache is the on-disk digest cache:
//
//	<dir>/sha256/<first two hex digits>/<64 hex digits>   a published object: exactly its bytes
//	<dir>/tmp/fill-*                                      a fill being written (removed at start)
//
// An object is published by renaming its verified, synced temporary file into place, so a file
// under sha256/ is always complete and always hashes to its name. The index (sizes, LRU order,
// fills in progress) lives in memory and is rebuilt from the directory at start, in the order of
// the files' modification times, which a hit refreshes.
type cache struct {
	dir string         // set at construction
	max int64          // set at construction: the bound on published plus reserved bytes
	m   *metrics       // set at construction
	log zerolog.Logger // set at construction

	mu       sync.Mutex
	entries  map[string]*list.Element // guarded by mu: hex → element holding *entry
	lru      list.List                // guarded by mu: front is the most recently used
	used     int64                    // guarded by mu: bytes of published objects
	reserved int64                    // guarded by mu: bytes reserved by fills in progress
	fills    map[string]*fill         // guarded by mu: fills in progress by hex
	pauseTil time.Time                // guarded by mu: after a disk error, no new fills before this
	now      func() time.Time         // set before the cache is shared: the clock of pauseTil
}

// diskPause is how long the cache takes no new fills after a disk error (full, read-only,
// removed): callers are served uncached meanwhile, so a broken disk costs one failed fill a
// minute rather than every pull.
const diskPause = time.Minute

type entry struct {
	hex  string
	size int64
}

// openCache prepares dir and indexes what it holds. An unusable directory is an error; the
// caller then serves without a cache.
func openCache(dir string, max int64, m *metrics, log zerolog.Logger) (*cache, error) {
	c := &cache{dir: dir, max: max, m: m, log: log, entries: make(map[string]*list.Element), fills: make(map[string]*fill), now: time.Now}
	if err := os.MkdirAll(filepath.Join(dir, "sha256"), 0o755); err != nil {
		return nil, err
	}
	tmp := filepath.Join(dir, "tmp")
	if err := os.RemoveAll(tmp); err != nil { // fills of an earlier process never finished
		return nil, err
	}
	if err := os.MkdirAll(tmp, 0o700); err != nil {
		return nil, err
	}
	probe, err := os.CreateTemp(tmp, "probe-*")
	if err != nil {
		return nil, err
	}
	probe.Close()
	os.Remove(probe.Name())
	c.scan()
	return c, nil
}

// scan indexes the published objects, oldest first, and evicts down to the bound.
func (c *cache) scan() {
	type found struct {
		hex  string
		size int64
		mod  time.Time
	}
	var all []found
	root := filepath.Join(c.dir, "sha256")
	filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !d.Type().IsRegular() {
			return nil
		}
		hex := d.Name()
		if !contracts.IsLowerHex(hex, sha256Hex) || path != c.path(hex) {
			return nil // not ours
		}
		info, err := d.Info()
		if err != nil {
			return nil
		}
		all = append(all, found{hex, info.Size(), info.ModTime()})
		return nil
	})
	sort.Slice(all, func(i, j int) bool { return all[i].mod.Before(all[j].mod) })
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, f := range all {
		c.entries[f.hex] = c.lru.PushFront(&entry{hex: f.hex, size: f.size})
		c.used += f.size
	}
	c.evictLocked(0)
	c.gaugesLocked()
}

func (c *cache) path(hex string) string {
	return filepath.Join(c.dir, "sha256", hex[:2], hex)
}

// acquire is the one decision point per GET by digest: a published object (opened, so eviction
// cannot pull it away), or the fill in progress to join, or a new fill the caller leads, or
// nothing at all while the cache pauses after a disk error.
func (c *cache) acquire(hex string) (obj *os.File, size int64, f *fill, leader bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if el := c.entries[hex]; el != nil {
		e := el.Value.(*entry)
		file, err := os.Open(c.path(hex))
		if err == nil {
			c.lru.MoveToFront(el)
			return file, e.size, nil, false
		}
		c.log.Warn().Str("digest", "sha256:"+hex).Err(err).Msg("stored object vanished; dropping it from the index")
		c.removeLocked(el)
	}
	if f := c.fills[hex]; f != nil {
		return nil, 0, f, false
	}
	if c.now().Before(c.pauseTil) {
		return nil, 0, nil, false
	}
	f = newFill(c, hex)
	c.fills[hex] = f
	c.m.fillsInFlight.Inc()
	return nil, 0, f, true
}

// open opens a published object, for a request that may not start a fill (a Range request).
func (c *cache) open(hex string) (*os.File, int64, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	el := c.entries[hex]
	if el == nil {
		return nil, 0, false
	}
	file, err := os.Open(c.path(hex))
	if err != nil {
		c.removeLocked(el)
		return nil, 0, false
	}
	c.lru.MoveToFront(el)
	return file, el.Value.(*entry).size, true
}

// suspend pauses new fills after a disk error.
func (c *cache) suspend(err error) {
	c.mu.Lock()
	c.pauseTil = c.now().Add(diskPause)
	c.mu.Unlock()
	c.log.Warn().Err(err).Str("outcome", "cache-paused").Dur("wait", diskPause).Msg("cache disk error; serving uncached")
}

// touch records a hit on disk, so that LRU order survives a restart.
func (c *cache) touch(hex string) {
	now := time.Now()
	_ = os.Chtimes(c.path(hex), now, now)
}

// reserve makes room for a fill of size bytes, evicting least recently used objects. It fails
// when the object is larger than the bound or fills in progress hold the room; then it evicts
// nothing, since no eviction could make the room.
func (c *cache) reserve(size int64) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if size > c.max || c.reserved+size > c.max || !c.evictLocked(size) {
		return false
	}
	c.reserved += size
	return true
}

// evictLocked removes least recently used objects until need more bytes fit in the bound.
// Objects being read stay readable: their callers hold them open.
func (c *cache) evictLocked(need int64) bool {
	for c.used+c.reserved+need > c.max {
		back := c.lru.Back()
		if back == nil {
			return false
		}
		e := back.Value.(*entry)
		if err := os.Remove(c.path(e.hex)); err != nil && !errors.Is(err, fs.ErrNotExist) {
			c.log.Warn().Str("digest", "sha256:"+e.hex).Err(err).Msg("evict")
		}
		c.removeLocked(back)
		c.m.evicted()
	}
	return true
}

func (c *cache) removeLocked(el *list.Element) {
	e := el.Value.(*entry)
	c.lru.Remove(el)
	delete(c.entries, e.hex)
	c.used -= e.size
	c.gaugesLocked()
}

func (c *cache) gaugesLocked() {
	c.m.cacheBytes.Set(float64(c.used))
	c.m.cacheObjects.Set(float64(len(c.entries)))
}

// createTemp opens a new temporary file for a fill. A temporary directory removed under the
// running relay (the cache directory emptied to free disk) is made again, so that the cache
// comes back after its pause rather than never.
func (c *cache) createTemp() (*os.File, error) {
	dir := filepath.Join(c.dir, "tmp")
	f, err := os.CreateTemp(dir, "fill-*")
	if errors.Is(err, fs.ErrNotExist) {
		if err = os.MkdirAll(dir, 0o700); err == nil {
			f, err = os.CreateTemp(dir, "fill-*")
		}
	}
	return f, err
}

// publish moves a verified, synced temporary file into place and indexes it. The rename happens
// under the fill's lock, so a caller joining the fill opens either name, never neither.
func (c *cache) publish(f *fill, size int64) error {
	final := c.path(f.hex)
	if err := os.MkdirAll(filepath.Dir(final), 0o755); err != nil {
		return err
	}
	if err := f.rename(final); err != nil {
		return err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.reserved -= size
	if el := c.entries[f.hex]; el != nil {
		c.removeLocked(el) // cannot happen while fills are exclusive; keep the index exact anyway
	}
	c.entries[f.hex] = c.lru.PushFront(&entry{hex: f.hex, size: size})
	c.used += size
	c.gaugesLocked()
	return nil
}

// release gives back a reservation a fill did not use.
func (c *cache) release(size int64) {
	c.mu.Lock()
	c.reserved -= size
	c.mu.Unlock()
}

// done ends a fill's time in the table: later callers find the published object or lead a new
// fill.
func (c *cache) done(f *fill) {
	c.mu.Lock()
	if c.fills[f.hex] == f {
		delete(c.fills, f.hex)
		c.m.fillsInFlight.Dec()
	}
	c.mu.Unlock()
}

// stats reports published bytes and objects (tests and the benchmark read them).
func (c *cache) stats() (used int64, objects int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.used, len(c.entries)
}
