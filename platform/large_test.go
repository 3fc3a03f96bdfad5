package platform_test

import (
	"runtime"
	"runtime/metrics"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"

	"code.foss.global/serve.zone/relay/contracts"
	"code.foss.global/serve.zone/relay/platform"
	"code.foss.global/serve.zone/relay/testenv/sim"
)

// largeClosure is the size of the large tests' closures, and heapBound how far the live heap may
// grow while two of them are carried at once: 200 MiB and 48 MiB; under the race detector, where
// each byte carried costs some twenty times as much, 8 MiB and 24 MiB. Either way the bound is
// the same whatever the closure's size, and under what holding one closure's frames would take
// (a chunk goes as a Node.js Buffer's JSON, up to four bytes a byte).
func largeClosure() (size, heapBound int64) {
	if raceEnabled {
		return 8 << 20, 24 << 20
	}
	return 200 << 20, 48 << 20
}

// heapWatch samples the live heap (what the last GC left) until stopped and keeps the largest.
type heapWatch struct {
	peak atomic.Int64
	stop chan struct{}
	done chan struct{}
}

func liveHeap() int64 {
	s := []metrics.Sample{{Name: "/gc/heap/live:bytes"}}
	metrics.Read(s)
	return int64(s[0].Value.Uint64())
}

func watchHeap() *heapWatch {
	w := &heapWatch{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(w.done)
		t := time.NewTicker(10 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-w.stop:
				return
			case <-t.C:
				if v := liveHeap(); v > w.peak.Load() {
					w.peak.Store(v)
				}
			}
		}
	}()
	return w
}

func (w *heapWatch) end() int64 {
	close(w.stop)
	<-w.done
	return w.peak.Load()
}

// TestLargeClosuresKeepTheHeapFlat: a 200 MiB backup and a 200 MiB restore at once (8 MiB under
// the race detector, largeClosure), each byte checked at the far end, while the live heap of the
// whole process — relay, Cloudly and Corestore stand-ins together — never grows by more than a
// bound that has nothing to do with the closure's size: bytes in flight are a chunk or two per
// closure, charged to the peer memory budget.
func TestLargeClosuresKeepTheHeapFlat(t *testing.T) {
	size, bound := largeClosure()
	h := newHarness(t, harnessOptions{platform: platform.Options{ListInterval: 100 * time.Millisecond}})
	h.waitFor("credentials pushed", func() bool { return h.Cloudly.Platform().CredentialsPushed() == 2 })
	var frames atomic.Int64 // every stream frame Cloudly reads
	h.Cloudly.TapStreams(func([]byte) { frames.Add(1) })
	defer h.Cloudly.TapStreams(nil)
	runtime.GC()
	base := liveHeap()
	w := watchHeap()
	start := time.Now()
	h.Cloudly.Platform().ServeRestore("bk-in", sim.RestoreSource{Size: size})
	h.b.Platform().WantRestore("bk-in", "svc-2")
	h.a.Platform().AddBackup("bk-out", sim.PlatformClosure{ServiceID: "svc-1", Size: size})
	h.waitFor("both closures carried", func() bool { return h.a.Platform().Delivered() == 1 && h.b.Platform().Settled() == 1 })
	elapsed := time.Since(start)
	peak := w.end()
	rc, _ := h.Cloudly.Platform().Received("bk-out")
	if rc.Bytes != size || rc.Sum != sim.ClosureDigest("bk-out", size) {
		t.Fatalf("backup arrived as %d bytes", rc.Bytes)
	}
	if r, _ := h.b.Platform().Restore("bk-in"); r.Bytes != size || r.Sum != sim.ClosureDigest("bk-in", size) {
		t.Fatalf("restore arrived as %d bytes", r.Bytes)
	}
	// Cloudly reads, per closure, a chunk or its answer per 256 KiB, and a keep-alive or its
	// answer a second: an answer answered back would bounce between the ends for ever.
	chunks := 2 * (size/platform.DefaultChunkBytes + 2)
	if limit := chunks + 4*int64(elapsed.Seconds()+1) + 64; frames.Load() > limit {
		t.Fatalf("Cloudly read %d stream frames for %d chunks in %s: frames bounce", frames.Load(), chunks, elapsed)
	}
	t.Logf("2 × %d MiB in %s; live heap %d KiB at the start, peak %d KiB", size>>20, elapsed.Round(time.Millisecond), base>>10, peak>>10)
	if peak-base > bound {
		t.Fatalf("the live heap grew by %d MiB carrying 2 × %d MiB: closures are being held", (peak-base)>>20, size>>20)
	}
	if got := h.Metric("relay_platform_closure_bytes_total", "direction", "to-cloudly"); got != float64(size) {
		t.Fatalf("bytes to Cloudly %v", got)
	}
	// Each closure gives its share back as the agent ends it, after the far end took it.
	h.waitFor("the budget empty after the closures", func() bool { return h.Metric("relay_downstream_budget_used_bytes") == 0 })
}

// TestClosureOverTheLimit: a closure past the limit is aborted and refused relay-request-invalid
// to the side that sent it — a Corestore that announces more than 256 MiB is never read, one that
// does not announce its length is cut at the limit with the stream to Cloudly aborted; a Cloudly
// that sends too much gets relay-request-invalid on the chunk that passes the limit, and Corestore
// settles nothing. The streamed cases run against the agent's limit lowered to 1 MiB (the same
// code as at 256 MiB, TestClosureLimitIsTheCorestoreLimit pins the default): 2 × 256 MiB of
// chunks would take most of a minute of two cores. 1 MiB is four whole chunks, so the limit is
// one on the bytes of the whole closure, not on a chunk's.
func TestClosureOverTheLimit(t *testing.T) {
	t.Parallel()
	const limit = 1 << 20
	h := newHarness(t, harnessOptions{platform: platform.Options{ListInterval: time.Hour, MaxClosureBytes: limit}})
	h.waitFor("credentials pushed", func() bool { return h.Cloudly.Platform().CredentialsPushed() == 2 })
	// The closures are set up while detached, so that the attach that follows lists them: set up
	// while attached, the listing that follows the credentials' arrival could take them first,
	// and the detach end them as relay-upstream-detached.
	h.Cloudly.SetAvailable(false)
	h.waitFor("detached", func() bool { return !h.Relay.Upstream().Attached() })
	h.a.Platform().AddBackup("bk-announced", sim.PlatformClosure{ServiceID: "svc-1", Size: contracts.MaxCorestoreClosureBytes + 1})
	h.a.Platform().AddBackup("bk-chunked", sim.PlatformClosure{ServiceID: "svc-1", Size: limit + 1, NoLength: true})
	h.Cloudly.Platform().ServeRestore("bk-huge", sim.RestoreSource{Size: limit + 1})
	h.b.Platform().WantRestore("bk-huge", "svc-2")
	h.Cloudly.SetAvailable(true) // a new attach lists at once

	// Each listing refuses all three again (they stay ready and wanted), and the credentials
	// pushed after the attach may start a second listing once the first has ended: every closure
	// carried is refused relay-request-invalid, however often.
	h.waitFor("three refusals", func() bool {
		return h.Metric("relay_platform_backups_total", "outcome", "relay-request-invalid") >= 2 &&
			h.Metric("relay_platform_restores_total", "outcome", "relay-request-invalid") >= 1
	})
	for _, m := range []string{"relay_platform_backups_total", "relay_platform_restores_total"} {
		if all, refused := h.MetricSum(m), h.Metric(m, "outcome", "relay-request-invalid"); all != refused {
			t.Fatalf("%s: %v closures ended, %v of them relay-request-invalid", m, all, refused)
		}
	}
	if _, ok := h.Cloudly.Platform().Received("bk-announced"); ok {
		t.Fatal("a closure announced over the limit was streamed to Cloudly")
	}
	// The relay counts the refusal as it aborts the stream; Cloudly hears the abort after.
	h.waitFor("Cloudly hearing the abort", func() bool {
		rc, _ := h.Cloudly.Platform().Received("bk-chunked")
		return rc.Aborted || rc.Complete
	})
	rc, _ := h.Cloudly.Platform().Received("bk-chunked")
	if rc.Complete || !rc.Aborted || rc.Bytes > limit || rc.Bytes == 0 {
		t.Fatalf("the unannounced closure reached Cloudly as %+v", rc)
	}
	// Likewise the restore's refusal reaches Cloudly's writer after the relay has counted it.
	h.waitFor("Cloudly hearing the restore refused", func() bool {
		served, _ := h.Cloudly.Platform().Served("bk-huge")
		return served.Refusal != "" || served.Complete
	})
	served, _ := h.Cloudly.Platform().Served("bk-huge")
	if !strings.HasPrefix(served.Refusal, string(contracts.RelayRequestInvalid)+": ") || served.Complete {
		t.Fatalf("Cloudly's restore stream ended as %+v", served)
	}
	if r, _ := h.b.Platform().Restore("bk-huge"); r.Settled {
		t.Fatal("Corestore settled a restore over the limit")
	}
	if h.a.Platform().Delivered() != 0 {
		t.Fatal("a backup over the limit was marked delivered")
	}
}

// TestCorestoreStallsMidClosure: a Corestore that stops sending a backup, and one that stops
// taking a restore, midway: the relay cuts each once the stall bound has passed while it waits on
// that Corestore (relay-closure-stalled), aborts the stream to Cloudly or answers Cloudly's writer,
// and the other work goes on meanwhile; while the relay waits on Cloudly instead (Cloudly holds the
// restore before its first byte), the bound does not run on that closure, and passing it cuts the
// stalled backup alone. The bound runs on a fake clock of its own that the test passes only once
// a stall has been reached: a healthy closure never meets it, however busy the machine.
func TestCorestoreStallsMidClosure(t *testing.T) {
	t.Parallel()
	const bound = 10 * time.Second
	stallClock := clocktesting.NewFakeClock(time.Now())
	h := newHarness(t, harnessOptions{stall: bound, stallClock: stallClock, receiveBuffer: 64 << 10,
		platform: platform.Options{ListInterval: time.Hour}})
	h.waitFor("credentials pushed", func() bool { return h.Cloudly.Platform().CredentialsPushed() == 2 })
	// The closures are set up while detached, so that the attach that follows lists them all at
	// once: set up while attached, a listing that comes late on a busy machine took the backup to
	// its stall before the detach, which then ended it as relay-upstream-detached.
	h.Cloudly.SetAvailable(false)
	h.waitFor("detached", func() bool { return !h.Relay.Upstream().Attached() })
	const stallAt = platform.DefaultChunkBytes // a chunk's worth moves before each stall
	out, in, held := sim.NewClosureStall(stallAt), sim.NewClosureStall(stallAt), sim.NewClosureStall(0)
	defer out.Release()
	defer in.Release()
	defer held.Release()
	h.a.Platform().StallNextBackup(out)
	h.a.Platform().AddBackup("bk-stall", sim.PlatformClosure{ServiceID: "svc-1", Size: 8 << 20})
	h.b.Platform().AddBackup("bk-free", sim.PlatformClosure{ServiceID: "svc-2", Size: 1<<20 + 4321})
	h.b.Platform().StallNextRestore(in)
	// The restore is far larger than the socket buffers between the relay and node-b's Corestore
	// can hold (here up to 4 MiB sent, and 64 KiB received), so Cloudly's stream cannot complete
	// before the relay sees the stall.
	h.Cloudly.Platform().ServeRestore("bk-in", sim.RestoreSource{Size: 64 << 20, Stall: held})
	h.b.Platform().WantRestore("bk-in", "svc-2")
	h.Cloudly.SetAvailable(true) // a new attach lists at once

	h.await(out.Reached, "the backup reaching the stall")
	// node-b lists its backup first, then its restore: the backup goes whole while node-a's
	// stands still. Nothing is cut before the test passes the bound.
	healthyCut := func() bool {
		rc, _ := h.Cloudly.Platform().Received("bk-free")
		return rc.Aborted || h.Metric("relay_platform_backups_total", "outcome", "relay-closure-stalled") > 0
	}
	h.waitFor("node-b's backup delivered", func() bool { return h.b.Platform().Delivered() == 1 || healthyCut() })
	if healthyCut() {
		t.Fatal("node-b's healthy backup was cut, or a closure was cut before the stall bound was passed")
	}

	// The relay has put the stalled backup's bytes on Cloudly's stream and waits on node-a's
	// Corestore for more; node-b's restore has begun (Corestore took its request) and waits on
	// Cloudly, which holds it: only the backup's stall watch is armed, and passing the bound
	// cuts the backup alone.
	h.await(held.Reached, "Cloudly holding the restore")
	h.waitFor("the relay waiting on node-a's Corestore and on Cloudly", func() bool {
		rc, _ := h.Cloudly.Platform().Received("bk-stall")
		r, _ := h.b.Platform().Restore("bk-in")
		return rc.Bytes == stallAt && r.Attempts == 1 && stallClock.Waiters() == 1
	})
	stallClock.Step(bound)
	h.waitFor("the stalled backup cut", func() bool {
		return h.Metric("relay_platform_backups_total", "outcome", "relay-closure-stalled") == 1
	})
	h.waitFor("Cloudly hearing the abort", func() bool {
		rc, _ := h.Cloudly.Platform().Received("bk-stall")
		return rc.Aborted || rc.Complete
	})
	if rc, _ := h.Cloudly.Platform().Received("bk-stall"); rc.Complete || rc.Accepted || !rc.Aborted {
		t.Fatalf("the stalled closure reached Cloudly as %+v", rc)
	}

	// Cloudly lets the restore go on, and node-b's Corestore stops taking it midway: the relay's
	// transport fills the socket buffers (node-b's side of them small here), then holds the bytes
	// Corestore does not take with the restore's stall watch armed, and a chunk of Cloudly's
	// unanswered. Once Cloudly has waited on that chunk through two keep-alives, the test passes
	// the bound, and the relay cuts the restore.
	held.Release()
	h.await(in.Reached, "the restore reaching the stall")
	restoreCut := func() bool { return h.Metric("relay_platform_restores_total", "outcome", "relay-closure-stalled") == 1 }
	h.waitFor("the relay holding the restore back, its stall watch armed", func() bool {
		s, _ := h.Cloudly.Platform().Served("bk-in")
		return s.Unanswered >= 2 && stallClock.Waiters() == 1 || restoreCut()
	})
	if restoreCut() {
		t.Fatal("the restore was cut by the bound passed while the relay waited on Cloudly")
	}
	stallClock.Step(bound)
	h.waitFor("the stalled restore cut", restoreCut)
	if r, _ := h.b.Platform().Restore("bk-in"); r.Settled {
		t.Fatal("a restore cut short settled")
	}
	h.waitFor("Cloudly's writer ended", func() bool {
		s, _ := h.Cloudly.Platform().Served("bk-in")
		return s.Complete || s.Refusal != "" || s.Bytes > 0
	})
	if s, _ := h.Cloudly.Platform().Served("bk-in"); s.Complete {
		t.Fatalf("Cloudly's writer was never told: its stream completed (%d bytes) before the relay saw the stall", s.Bytes)
	}
	h.waitFor("node-b's delivery counted", func() bool { return h.Metric("relay_platform_backups_total", "outcome", "delivered") == 1 })
	if got := h.Metric("relay_platform_backups_total", "outcome", "delivered"); got != 1 {
		t.Fatalf("backups delivered %v: only node-b's goes whole", got)
	}
	if got := h.Metric("relay_platform_backups_total", "outcome", "relay-closure-stalled"); got != 1 {
		t.Fatalf("backups cut as stalled %v: only node-a's stalled", got)
	}
}
