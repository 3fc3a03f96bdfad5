package platform_test

import (
	"bytes"
	"encoding/base64"
	"testing"
	"time"

	"code.foss.global/serve.zone/relay/contracts"
	"code.foss.global/serve.zone/relay/platform"
	"code.foss.global/serve.zone/relay/testenv/sim"
)

// TestEndToEnd: after an attach the relay enrols (a real HPKE challenge), Cloudly pushes each
// node's credential sealed to the relay's key, each Corestore gets its own slice of the desired
// state byte for byte, a ready backup reaches Cloudly whole as a VirtualStream and is marked
// delivered on { accepted: true }, and a wanted restore's closure reaches Corestore whole with
// its descriptor; each Corestore saw only its own credential.
func TestEndToEnd(t *testing.T) {
	t.Parallel()
	h := newHarness(t, harnessOptions{platform: platform.Options{ListInterval: 200 * time.Millisecond}})
	// Each closure is a few whole chunks and a part of one.
	const backupSize, restoreSize = 4*platform.DefaultChunkBytes + 12345, 2*platform.DefaultChunkBytes + 7
	h.a.Platform().AddBackup("bk-1", sim.PlatformClosure{ServiceID: "svc-1", Size: backupSize})
	h.b.Platform().WantRestore("bk-9", "svc-2")
	h.Cloudly.Platform().ServeRestore("bk-9", sim.RestoreSource{Size: restoreSize})

	h.waitFor("both credentials pushed", func() bool { return h.Cloudly.Platform().CredentialsPushed() == 2 })
	if h.Cloudly.Platform().Enrollments() != 1 {
		t.Fatalf("enrollments: %d", h.Cloudly.Platform().Enrollments())
	}
	h.waitFor("desired states handed", func() bool {
		na, _ := h.a.Platform().DesiredStates()
		nb, _ := h.b.Platform().DesiredStates()
		return na > 0 && nb > 0
	})
	_, gotA := h.a.Platform().DesiredStates()
	_, gotB := h.b.Platform().DesiredStates()
	const head = `{"capabilities":{"corestore-inventory":true,"big":123456789012345678901234567890},"providerConfigs":[{"provider":"s3","secretRef":"sr-1","ratio":1.50}],"bindings":[`
	if want := head + `{"serviceId":"svc-1","dbname":"app-db-marker","x":1e2},"second"]}`; string(gotA) != want {
		t.Fatalf("node-a's desired state:\n%s\nwant\n%s", gotA, want)
	}
	if want := head + `{"serviceId":"svc-2","dbname":"other"}]}`; string(gotB) != want {
		t.Fatalf("node-b's desired state:\n%s\nwant\n%s", gotB, want)
	}

	h.waitFor("the backup delivered", func() bool { return h.a.Platform().Delivered() == 1 })
	rc, ok := h.Cloudly.Platform().Received("bk-1")
	if !ok || !rc.Complete || rc.Aborted || !rc.Accepted || rc.Bytes != backupSize || rc.Sum != sim.ClosureDigest("bk-1", backupSize) ||
		rc.NodeID != "node-a" || rc.ServiceID != "svc-1" {
		t.Fatalf("Cloudly received %+v", rc)
	}
	b, _ := h.a.Platform().Backup("bk-1")
	if !bytes.Equal(rc.Descriptor, b.Descriptor) {
		t.Fatalf("descriptor %s, Corestore listed %s", rc.Descriptor, b.Descriptor)
	}

	h.waitFor("the restore settled", func() bool { return h.b.Platform().Settled() == 1 })
	r, _ := h.b.Platform().Restore("bk-9")
	served, _ := h.Cloudly.Platform().Served("bk-9")
	if r.Bytes != restoreSize || r.Sum != sim.ClosureDigest("bk-9", restoreSize) || !served.Complete || served.Refusal != "" {
		t.Fatalf("restore: Corestore %+v, Cloudly %+v", r, served)
	}
	want := `{"format":"` + contracts.CorestoreDatabaseBackupFormat + `","backupId":"bk-9"}`
	if string(r.Descriptor) != want {
		t.Fatalf("descriptor header %s (base64url %s)", r.Descriptor, base64.RawURLEncoding.EncodeToString(r.Descriptor))
	}
	for _, cs := range []*sim.Corestore{h.a, h.b} {
		if v := cs.Platform().Violations(); len(v) > 0 {
			t.Fatalf("Corestore saw: %v", v)
		}
	}
	if v := h.Cloudly.Platform().Violations(); len(v) > 0 {
		t.Fatalf("Cloudly saw: %v", v)
	}
	// Corestore took each closure before the agent counts it: the status and metrics follow.
	h.waitFor("the status counting both closures", func() bool {
		a, b := h.node("node-a"), h.node("node-b")
		return a.Delivered == 1 && b.Settled == 1 && a.Handed != 0 && b.Handed == b.Desired &&
			h.Metric("relay_platform_backups_total", "outcome", "delivered") == 1 &&
			h.Metric("relay_platform_restores_total", "outcome", "settled") == 1
	})
	na, nb := h.node("node-a"), h.node("node-b")
	if !na.Credential || na.Delivered != 1 || na.Handed == 0 || nb.Settled != 1 || nb.Handed != nb.Desired {
		t.Fatalf("status: %+v %+v", na, nb)
	}
	if got := h.Metric("relay_platform_backups_total", "outcome", "delivered"); got != 1 {
		t.Fatalf("backups delivered metric %v", got)
	}
	if got := h.Metric("relay_platform_restores_total", "outcome", "settled"); got != 1 {
		t.Fatalf("restores settled metric %v", got)
	}
}
