package platform_test

import (
	"fmt"
	"testing"
	"time"

	"code.foss.global/serve.zone/relay/platform"
	"code.foss.global/serve.zone/relay/testenv/sim"
)

// TestStalledCorestoresKeepNoOneOut: eight Corestores each accept a closure and then send nothing,
// holding a slot each — as many as the cluster-wide count — and a healthy Corestore's backup is
// still carried whole and delivered while every stalled closure is open: a Corestore with no
// closure running is always admitted, and no stalled closure is ended to make room. The stall
// bound is the real one (30 s), so the order of the two events is what is asserted: the healthy
// delivery comes first, before any stalled closure is ended.
func TestStalledCorestoresKeepNoOneOut(t *testing.T) {
	t.Parallel()
	const stalled = platform.DefaultMaxClosures
	h := newHarness(t, harnessOptions{more: stalled, platform: platform.Options{ListInterval: 100 * time.Millisecond}})
	h.waitFor("credentials pushed", func() bool { return h.Cloudly.Platform().CredentialsPushed() == 2+stalled })
	stalls := make([]*sim.ClosureStall, stalled)
	for i, c := range h.more {
		stalls[i] = sim.NewClosureStall(1 << 20)
		defer stalls[i].Release()
		c.Platform().StallNextBackup(stalls[i])
		c.Platform().AddBackup(fmt.Sprintf("bk-stall-%d", i+1), sim.PlatformClosure{ServiceID: "svc-s", Size: 8 << 20})
	}
	for i, s := range stalls {
		h.await(s.Reached, fmt.Sprintf("node-s%d's backup reaching its stall", i+1))
	}
	if got := h.status().ClosuresInflight; got != stalled {
		t.Fatalf("closures in flight with every stalled one open: %d, want %d", got, stalled)
	}

	const size = 2<<20 + 4321
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
}
