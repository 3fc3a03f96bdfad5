package registry

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/rs/zerolog"
)

func unregisteredMetrics(t *testing.T) *metrics {
	t.Helper()
	m, err := newMetrics(nil)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func hexOf(i int) string { return fmt.Sprintf("%064x", i) }

// put publishes size bytes under hex as a fill would: reserve, temporary file, publish.
func put(t *testing.T, c *cache, hex string, size int64) {
	t.Helper()
	if !c.reserve(size) {
		t.Fatalf("reserve %d for %s refused", size, hex[:8])
	}
	tmp, err := c.createTemp()
	if err != nil {
		t.Fatal(err)
	}
	tmp.Write(make([]byte, size))
	tmp.Close()
	f := newFill(c, hex)
	f.path = tmp.Name()
	if err := c.publish(f, size); err != nil {
		t.Fatal(err)
	}
}

func present(c *cache, hex string) bool {
	_, err := os.Stat(c.path(hex))
	return err == nil
}

func TestCacheEvictsLeastRecentlyUsed(t *testing.T) {
	m := unregisteredMetrics(t)
	c, err := openCache(t.TempDir(), 3000, m, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	a, b, cc, d := hexOf(1), hexOf(2), hexOf(3), hexOf(4)
	put(t, c, a, 1000)
	put(t, c, b, 1000)
	put(t, c, cc, 1000)
	// b is held open by a reader; then a and c are used, so b is the least recently used.
	heldB, _, ok := c.open(b)
	if !ok {
		t.Fatal("open b")
	}
	file, size, f, _ := c.acquire(a)
	if file == nil || size != 1000 || f != nil {
		t.Fatalf("acquire a: %v %d %v", file, size, f)
	}
	fc, _, _ := c.open(cc)
	fc.Close()
	put(t, c, d, 1000)
	if present(c, b) || !present(c, a) || !present(c, cc) || !present(c, d) {
		t.Fatalf("after d: a %v b %v c %v d %v; want b evicted", present(c, a), present(c, b), present(c, cc), present(c, d))
	}
	// An evicted object stays readable by whoever holds it open.
	if n, err := heldB.Read(make([]byte, 2000)); n != 1000 || err != nil {
		t.Fatalf("reading an evicted object held open: %d %v", n, err)
	}
	heldB.Close()
	file.Close()
	if got := testutil.ToFloat64(m.evictions); got != 1 {
		t.Fatalf("evictions = %v, want 1", got)
	}
	if used, n := c.stats(); used != 3000 || n != 3 {
		t.Fatalf("stats %d bytes %d objects, want 3000 and 3", used, n)
	}
	if testutil.ToFloat64(m.cacheBytes) != 3000 || testutil.ToFloat64(m.cacheObjects) != 3 {
		t.Fatal("gauges disagree with the index")
	}

	// Larger than the bound: never reserved. Room held by fills in progress is not evicted into.
	if c.reserve(3001) {
		t.Fatal("reserved more than the bound")
	}
	if !c.reserve(2000) || c.reserve(1001) {
		t.Fatal("reservations must count against the bound")
	}
	c.release(2000)
	if !c.reserve(3000) {
		t.Fatal("a released reservation must free its room")
	}
	if _, n := c.stats(); n != 0 {
		t.Fatalf("%d objects left after reserving the whole bound", n)
	}
}

func TestCacheRestartKeepsObjectsInLRUOrder(t *testing.T) {
	dir := t.TempDir()
	m := unregisteredMetrics(t)
	c, err := openCache(dir, 10_000, m, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	old, mid, recent := hexOf(10), hexOf(11), hexOf(12)
	for _, h := range []string{old, mid, recent} {
		put(t, c, h, 1000)
	}
	base := time.Now().Add(-time.Hour)
	for i, h := range []string{recent, old, mid} { // on disk, recent was used first, then old, then mid
		os.Chtimes(c.path(h), base.Add(time.Duration(i)*time.Minute), base.Add(time.Duration(i)*time.Minute))
	}
	c.touch(recent) // a hit: now the most recent
	leftover := filepath.Join(dir, "tmp", "fill-123")
	os.WriteFile(leftover, []byte("half a blob"), 0o600)
	foreign := filepath.Join(dir, "sha256", "zz", "not-a-digest")
	os.MkdirAll(filepath.Dir(foreign), 0o755)
	os.WriteFile(foreign, []byte("x"), 0o600)

	c2, err := openCache(dir, 2500, unregisteredMetrics(t), zerolog.Nop()) // a smaller bound: evicts at start
	if err != nil {
		t.Fatal(err)
	}
	if used, n := c2.stats(); used != 2000 || n != 2 {
		t.Fatalf("after restart: %d bytes, %d objects; want 2000, 2", used, n)
	}
	if present(c2, old) || !present(c2, mid) || !present(c2, recent) {
		t.Fatalf("restart evicted the wrong object: old %v mid %v recent %v", present(c2, old), present(c2, mid), present(c2, recent))
	}
	if _, err := os.Stat(leftover); !os.IsNotExist(err) {
		t.Fatal("an unfinished fill survived the restart")
	}
	if _, err := os.Stat(foreign); err != nil {
		t.Fatal("a file the cache does not own was removed")
	}
	if file, size, _, _ := c2.acquire(mid); file == nil || size != 1000 {
		t.Fatal("restarted cache does not serve what it indexed")
	} else {
		file.Close()
	}
}

func TestCacheUnusableDirectory(t *testing.T) {
	notDir := filepath.Join(t.TempDir(), "file")
	os.WriteFile(notDir, nil, 0o600)
	if _, err := openCache(notDir, 1000, unregisteredMetrics(t), zerolog.Nop()); err == nil {
		t.Fatal("a regular file opened as a cache directory")
	}
}
