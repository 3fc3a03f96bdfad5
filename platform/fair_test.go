package platform_test

import (
	"fmt"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"

	"code.foss.global/serve.zone/relay/corestore"
	"code.foss.global/serve.zone/relay/platform"
	"code.foss.global/serve.zone/relay/testenv/sim"
)

// TestStalledCorestoresKeepNoOneOut: eight Corestores each accept a closure and then send nothing,
// holding a slot each — as many as the cluster-wide count — and a healthy Corestore's backup is
// still carried whole and delivered while every stalled closure is open: a Corestore with no
// closure running is always admitted, and no stalled closure is ended to make room. The stall
// bound (the default, 30 s) runs on a fake clock that moves only when the test moves it, so every
// stalled closure is still open when the healthy one is delivered, however slow the machine; once
// it is, the clock passes the bound and each stalled closure ends by that bound alone
// (relay-closure-stalled). Each stalled closure puts one chunk on Cloudly's stream before it
// stalls.
func TestStalledCorestoresKeepNoOneOut(t *testing.T) {
	t.Parallel()
	const stalled = platform.DefaultMaxClosures
	const chunk = platform.DefaultChunkBytes
	stallClock := clocktesting.NewFakeClock(time.Now())
	h := newHarness(t, harnessOptions{more: stalled, stallClock: stallClock,
		platform: platform.Options{ListInterval: 100 * time.Millisecond}})
	h.waitFor("credentials pushed", func() bool { return h.Cloudly.Platform().CredentialsPushed() == 2+stalled })
	stalls := make([]*sim.ClosureStall, stalled)
	for i, c := range h.more {
		stalls[i] = sim.NewClosureStall(chunk)
		defer stalls[i].Release()
		c.Platform().StallNextBackup(stalls[i])
		c.Platform().AddBackup(fmt.Sprintf("bk-stall-%d", i+1), sim.PlatformClosure{ServiceID: "svc-s", Size: 4 * chunk})
	}
	for i, s := range stalls {
		h.await(s.Reached, fmt.Sprintf("node-s%d's backup reaching its stall", i+1))
	}
	if got := h.status().ClosuresInflight; got != stalled {
		t.Fatalf("closures in flight with every stalled one open: %d, want %d", got, stalled)
	}

	const size = 2*chunk + 4321
	h.a.Platform().AddBackup("bk-healthy", sim.PlatformClosure{ServiceID: "svc-1", Size: size})
	ended := func() bool { // any stalled closure ended: cut by its bound, or aborted to Cloudly
		if h.Metric("relay_platform_backups_total", "outcome", "relay-closure-stalled") > 0 {
			return true
		}
		for i := range stalls {
			if rc, _ := h.Cloudly.Platform().Received(fmt.Sprintf("bk-stall-%d", i+1)); rc.Aborted || rc.Complete {
				return true
			}
		}
		return false
	}
	h.waitFor("the healthy backup delivered, or a stalled closure ended", func() bool {
		return h.a.Platform().Delivered() == 1 || ended()
	})
	if ended() {
		t.Fatalf("a stalled closure ended before the healthy backup was delivered (delivered %d): the stalled Corestores kept it out",
			h.a.Platform().Delivered())
	}
	rc, _ := h.Cloudly.Platform().Received("bk-healthy")
	if !rc.Complete || !rc.Accepted || rc.Bytes != size || rc.Sum != sim.ClosureDigest("bk-healthy", size) {
		t.Fatalf("the healthy backup reached Cloudly as %+v", rc)
	}
	for i := range stalls {
		id := fmt.Sprintf("bk-stall-%d", i+1)
		if rc, ok := h.Cloudly.Platform().Received(id); !ok || rc.Complete || rc.Aborted || rc.Bytes == 0 {
			t.Fatalf("%s, stalled, reached Cloudly as %+v (%v)", id, rc, ok)
		}
	}
	if got := h.status().ClosuresInflight; got < stalled {
		t.Fatalf("closures in flight after the healthy delivery: %d, want the %d stalled ones still open", got, stalled)
	}

	// Each stalled closure waits on Corestore with its stall watch armed (the healthy one's was
	// disarmed at its end): the clock passes the bound, and each ends by it. (Each is offered
	// again at the next listing and goes whole then: its Corestore stalls once.)
	h.waitFor("every stalled closure's stall watch armed", func() bool { return stallClock.Waiters() == stalled })
	stallClock.Step(corestore.DefaultStallTimeout)
	h.waitFor("every stalled closure cut", func() bool {
		return h.Metric("relay_platform_backups_total", "outcome", "relay-closure-stalled") == stalled
	})
}
