package restore_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"code.foss.global/serve.zone/relay/contracts"
	"code.foss.global/serve.zone/relay/contracts/strictjson"
	"code.foss.global/serve.zone/relay/internal/typedsocket"
	"code.foss.global/serve.zone/relay/restore"
	"code.foss.global/serve.zone/relay/testenv/await"
	"code.foss.global/serve.zone/relay/testenv/sim"
)

// wantRefusal checks a refusal Cloudly received by name (errors.Is) and exact text, and that it
// travelled with its name as error data.
func wantRefusal(t *testing.T, err error, name contracts.RefusalName, text string) {
	t.Helper()
	if !errors.Is(err, name) {
		t.Fatalf("error %v is not %s", err, name)
	}
	if err.Error() != text {
		t.Fatalf("error text\n%q\nwant\n%q", err.Error(), text)
	}
	var remote *typedsocket.Error
	if !errors.As(err, &remote) || string(remote.Data) != `{"code":"`+string(name)+`"}` {
		t.Fatalf("error data %v", err)
	}
}

func readProgress(t *testing.T, answer []byte) contracts.IsolatedRestoreProgress {
	t.Helper()
	var progress []byte
	if strictjson.ReadExact(answer, strictjson.Req("progress", &progress)) != nil {
		t.Fatalf("answer %s is not { progress }", answer)
	}
	p, err := contracts.NormalizeIsolatedRestoreProgress(progress)
	if err != nil {
		t.Fatalf("progress %s: %v", progress, err)
	}
	return p
}

// ops summarizes the operations Corestore received: "prepare write×5 execute …".
func ops(reqs []sim.CorestoreRequest) string {
	var out []string
	count := 0
	for i, r := range reqs {
		count++
		if i+1 < len(reqs) && reqs[i+1].Op == r.Op {
			continue
		}
		if count > 1 {
			out = append(out, fmt.Sprintf("%s×%d", r.Op, count))
		} else {
			out = append(out, r.Op)
		}
		count = 0
	}
	return strings.Join(out, " ")
}

// TestWholeRestoreThroughTheRelay drives prepare → stage every chunk of two objects → execute →
// progress until executed → cleanup from the Cloudly stand-in, through a real relay, to the sim
// Corestore over verified TLS.
func TestWholeRestoreThroughTheRelay(t *testing.T) {
	h := newHarness(t, harnessOptions{executeDelay: 60 * time.Millisecond})
	p := plan("restore-e2e")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	run, err := sim.RunIsolatedRestore(ctx, h.Cloudly.Call, authority(), p)
	if err != nil {
		t.Fatal(err)
	}
	if run.Chunks != 5 || run.Polls < 1 {
		t.Fatalf("staged %d chunks with %d progress reads; want 5 chunks and at least one read", run.Chunks, run.Polls)
	}
	e := run.Executed
	if e.NodeID != "node-a" || e.Status != "executed" || e.ExpectedObjects != 2 || e.ReceivedObjects != 2 ||
		e.TotalMappings != 2 || e.CompletedMappings != 2 || e.ExecutedAt == nil {
		t.Fatalf("executed progress %+v", e)
	}
	if f := run.Final; f.Status != "cleaned" || f.NodeID != "node-a" || f.Revision <= e.Revision || f.LastFence <= e.LastFence {
		t.Fatalf("final progress %+v after %+v", f, e)
	}
	if got := ops(h.corestore.Received()); !strings.HasPrefix(got, "prepare write×5 execute status") || !strings.HasSuffix(got, " cleanup") {
		t.Fatalf("Corestore saw %s", got)
	}
	for i, o := range p.Objects {
		if _, complete := h.corestore.StagedObject(p.RestoreID, o.Key); !complete {
			t.Errorf("object %d was not staged whole", i)
		}
	}
	if got := h.Metric("relay_corestore_sent_bytes_total", "op", "write"); got < 1310720+716800 {
		t.Errorf("write control bytes sent %v, less than the archive", got)
	}
	if got := h.Metric("relay_restore_requests_total", "op", "write", "outcome", "answered"); got != 5 {
		t.Errorf("answered stage calls %v", got)
	}
}

// TestFiveMethodsAnswerProgress calls each method once and checks the Corestore operation it
// reached and the progress it answered.
func TestFiveMethodsAnswerProgress(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	p := &sim.RestorePlan{RestoreID: "restore-five", NodeID: "node-a", NodeName: "node-a.cluster-sim",
		Objects: []sim.RestoreObject{{Key: "only", Data: []byte("hello corestore")}}, Mappings: []string{"m1"}}
	a := authority()
	steps := []struct {
		method, op string
		control    func(rev int64) json.RawMessage
		status     string
	}{
		{contracts.MethodPrepareIsolatedRestoreOnNode, "prepare", func(int64) json.RawMessage { return a.PrepareControl(p) }, "prepared"},
		{contracts.MethodStageIsolatedRestoreArchive, "write", func(rev int64) json.RawMessage { return a.WriteControl(p, 0, 0, rev) }, "prepared"},
		{contracts.MethodGetIsolatedRestoreProgressOnNode, "status", func(int64) json.RawMessage { return a.StatusControl(p) }, "prepared"},
		{contracts.MethodExecuteIsolatedRestoreOnNode, "execute", func(rev int64) json.RawMessage { return a.ExecuteControl(p, rev) }, "executed"},
		{contracts.MethodCleanupIsolatedRestoreOnNode, "cleanup", func(rev int64) json.RawMessage { return a.CleanupControl(p, rev) }, "cleaned"},
	}
	var rev int64
	for i, s := range steps {
		answer, err := h.call(s.method, sim.NodeControlRequest("node-a", s.control(rev)))
		if err != nil {
			t.Fatalf("%s: %v", s.method, err)
		}
		progress := readProgress(t, answer)
		if progress.NodeID != "node-a" || progress.RestoreID != "restore-five" || progress.Status != s.status {
			t.Fatalf("%s answered %s", s.method, answer)
		}
		if got := h.corestore.Received(); len(got) != i+1 || got[i].Op != s.op {
			t.Fatalf("%s reached %s", s.method, ops(got))
		}
		if s.op == "write" {
			if string(progress.StagedObject) != `{"complete":true,"key":"only","nextIndex":1,"nextOffset":15}` {
				t.Fatalf("stagedObject %s", progress.StagedObject)
			}
			if bytes.Contains(answer, []byte(`"stored"`)) {
				t.Fatal("Corestore's object receipt was projected")
			}
		}
		rev = progress.Revision
	}
}

func TestRefusalsByName(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	p := plan("restore-refusals")
	status := authority().StatusControl(p)
	cases := []struct {
		name string
		node string
		want contracts.RefusalName
		text string
	}{
		{"no Corestore origin for the node", "node-x", contracts.RestoreNodeNotCarried,
			"restore-node-not-carried: this relay has no Corestore origin for node node-x"},
		{"nothing listens", "node-gone", contracts.RestoreNodeUnreachable,
			"restore-node-unreachable: cannot connect to Corestore at " + h.gone},
		{"untrusted certificate", "node-tls", contracts.RestoreNodeUnreachable,
			"restore-node-unreachable: TLS with Corestore at " + h.untrusted.Origin() + " failed: certificate signed by an unknown authority"},
		{"Corestore refuses", "node-a", contracts.RestoreNodeRefused,
			"restore-node-refused: restore-unknown: no staging for that restore on this node"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := h.call(contracts.MethodGetIsolatedRestoreProgressOnNode, sim.NodeControlRequest(c.node, status))
			wantRefusal(t, err, c.want, c.text)
		})
	}
	t.Run("grant for another operation", func(t *testing.T) {
		control := []byte(`{"grant":"` + authority().Grant("execute", p) + `"}`)
		_, err := h.call(contracts.MethodGetIsolatedRestoreProgressOnNode, sim.NodeControlRequest("node-a", control))
		wantRefusal(t, err, contracts.RestoreNodeRefused, "restore-node-refused: grant-refused: the grant names operation execute, not status")
	})
	t.Run("unreadable request", func(t *testing.T) {
		_, err := h.call(contracts.MethodPrepareIsolatedRestoreOnNode, []byte(`{"nodeId":"node-a","control":"x","extra":1}`))
		wantRefusal(t, err, contracts.RelayRequestInvalid,
			"relay-request-invalid: prepareIsolatedRestoreOnNode: isolated restore request must use its exact schema { nodeId, control }")
	})
}

// TestGrantAbsentFromEveryLogLine runs answered, refused, unreachable and over-limit calls with
// every component logging at debug level into one buffer, including a Corestore that echoes the
// grant in its refusal, and finds no grant in the log (assertNoGrantLogged, run by every harness
// test when it ends) nor in the refusal Cloudly receives.
func TestGrantAbsentFromEveryLogLine(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	p := plan("restore-logs")
	p.ChunkBytes = 400 << 10
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := sim.RunIsolatedRestore(ctx, h.Cloudly.Call, authority(), p); err != nil {
		t.Fatal(err)
	}
	status := authority().StatusControl(p)
	grant := authority().Minted()[len(authority().Minted())-1]
	h.corestore.RefuseNext(401, "grant-refused: "+grant+" is not valid here")
	_, err := h.call(contracts.MethodGetIsolatedRestoreProgressOnNode, sim.NodeControlRequest("node-a", status))
	wantRefusal(t, err, contracts.RestoreNodeRefused, "restore-node-refused: grant-refused: [redacted] is not valid here")
	for _, node := range []string{"node-gone", "node-tls", "node-x"} {
		if _, err := h.call(contracts.MethodGetIsolatedRestoreProgressOnNode, sim.NodeControlRequest(node, status)); err == nil {
			t.Fatalf("%s answered", node)
		}
	}
	big := authority().WriteControl(&sim.RestorePlan{RestoreID: "restore-logs", NodeID: "node-a", NodeName: "node-a.cluster-sim",
		Objects: []sim.RestoreObject{{Key: "big", Data: make([]byte, 800<<10)}}, ChunkBytes: 800 << 10}, 0, 0, 1)
	if _, err := h.call(contracts.MethodStageIsolatedRestoreArchive, sim.NodeControlRequest("node-a", big)); !errors.Is(err, contracts.RelayRequestInvalid) {
		t.Fatalf("a control above 1 MiB: %v", err)
	}
	logs := h.Logs.String()
	for _, want := range []string{`"level":"debug"`, `"method":"stageIsolatedRestoreArchive"`, `"component":"corestore"`, `"outcome":"restore-node-unreachable"`,
		`"outcome":"relay-request-invalid"`, `"outcome":"restore-node-refused"`} {
		if !strings.Contains(logs, want) {
			t.Errorf("the log has no line with %s", want)
		}
	}
}

func TestCorestoreTooSlowIsUnreachable(t *testing.T) {
	h := newHarness(t, harnessOptions{timeout: 300 * time.Millisecond})
	h.corestore.SetDelay(5 * time.Second)
	_, err := h.call(contracts.MethodGetIsolatedRestoreProgressOnNode, sim.NodeControlRequest("node-a", authority().StatusControl(plan("r"))))
	wantRefusal(t, err, contracts.RestoreNodeUnreachable,
		"restore-node-unreachable: Corestore at "+h.corestore.Origin()+" did not answer within 300ms")
}

// TestAnswerNamingAnotherNodeKeepsTheCarriedNode: whatever node Corestore's answer names, the
// progress states the node the relay carried the control to.
func TestAnswerNamingAnotherNodeKeepsTheCarriedNode(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	h.corestore.SetTamper(func(_ string, body []byte) []byte {
		return append([]byte(`{"nodeId":"node-b",`), body[1:]...)
	})
	answer, err := h.call(contracts.MethodPrepareIsolatedRestoreOnNode, sim.NodeControlRequest("node-a", authority().PrepareControl(plan("restore-other-node"))))
	if err != nil {
		t.Fatal(err)
	}
	if p := readProgress(t, answer); p.NodeID != "node-a" {
		t.Fatalf("progress names %s", p.NodeID)
	}
	if bytes.Contains(answer, []byte("node-b")) || !bytes.HasPrefix(answer, []byte(`{"progress":{"nodeId":"node-a","restoreId":"restore-other-node",`)) {
		t.Fatalf("answer %s", answer)
	}
}

// setMembers rewrites members of a JSON object (adding absent ones at the end).
func setMembers(body []byte, repl map[string]string) []byte {
	members, _ := strictjson.ReadObject(body)
	out := []byte{'{'}
	seen := map[string]bool{}
	for _, m := range members {
		v := string(m.Value)
		if r, ok := repl[m.Key]; ok {
			v = r
		}
		seen[m.Key] = true
		if len(out) > 1 {
			out = append(out, ',')
		}
		out = append(out, `"`+m.Key+`":`+v...)
	}
	for _, k := range []string{"executedAt", "stagedObject", "sourceBackup"} {
		if v, ok := repl[k]; ok && !seen[k] {
			out = append(out, `,"`+k+`":`+v...)
		}
	}
	return append(out, '}')
}

// TestNormalizationRulesRefused breaks each normalizeIsolatedRestoreProgress rule once in
// Corestore's answer; each is refused restore-node-refused naming the rule.
func TestNormalizationRulesRefused(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	p := plan("restore-rules")
	if _, err := h.call(contracts.MethodPrepareIsolatedRestoreOnNode, sim.NodeControlRequest("node-a", authority().PrepareControl(p))); err != nil {
		t.Fatal(err)
	}
	const prefix = "restore-node-refused: Corestore's staging summary is not a valid progress: isolated restore progress "
	cases := []struct {
		rule string
		repl map[string]string
		want string
	}{
		{"unknown status", map[string]string{"status": `"paused"`}, "status must be one of prepared, executing, failed, executed, cleaned"},
		{"objects above the plan", map[string]string{"receivedObjects": "3"}, "receivedObjects must not exceed expectedObjects, the plan it belongs to"},
		{"mappings above the plan", map[string]string{"completedMappings": "5"}, "completedMappings must not exceed totalMappings, the plan it belongs to"},
		{"revision below 1", map[string]string{"revision": "0"}, "revision must be a safe integer of at least 1: a committed state carries it"},
		{"lastFence below 1", map[string]string{"lastFence": "0"}, "lastFence must be a safe integer of at least 1: a committed state carries it"},
		{"executing without the whole archive", map[string]string{"status": `"executing"`, "receivedObjects": "1"}, "that is executing must hold the whole archive"},
		{"executed without the whole archive", map[string]string{"status": `"executed"`, "completedMappings": "2", "executedAt": "1"}, "that is executed must hold the whole archive"},
		{"executed leaving a mapping", map[string]string{"status": `"executed"`, "receivedObjects": "2", "completedMappings": "1", "executedAt": "1"}, "that is executed must leave no mapping behind"},
		{"executed without executedAt", map[string]string{"status": `"executed"`, "receivedObjects": "2", "completedMappings": "2"}, "that is executed must state executedAt"},
		{"stagedObject not an object", map[string]string{"stagedObject": `"chunk 3"`}, "stagedObject must be an object"},
	}
	status := sim.NodeControlRequest("node-a", authority().StatusControl(p))
	for _, c := range cases {
		t.Run(c.rule, func(t *testing.T) {
			h.corestore.SetTamper(func(_ string, body []byte) []byte { return setMembers(body, c.repl) })
			_, err := h.call(contracts.MethodGetIsolatedRestoreProgressOnNode, status)
			wantRefusal(t, err, contracts.RestoreNodeRefused, prefix+c.want)
		})
	}
	// The summary is this project's guess at Corestore's answer: a member the relay does not know
	// is left out of the progress (which is seed-spelled and exact), not a reason to refuse.
	t.Run("a member outside the summary is left out", func(t *testing.T) {
		h.corestore.SetTamper(func(_ string, body []byte) []byte { return setMembers(body, map[string]string{"sourceBackup": `"b1"`}) })
		answer, err := h.call(contracts.MethodGetIsolatedRestoreProgressOnNode, status)
		if err != nil {
			t.Fatal(err)
		}
		if readProgress(t, answer); bytes.Contains(answer, []byte("sourceBackup")) {
			t.Fatalf("an unknown summary member was projected: %s", answer)
		}
	})
	t.Run("untampered", func(t *testing.T) {
		h.corestore.SetTamper(nil)
		if _, err := h.call(contracts.MethodGetIsolatedRestoreProgressOnNode, status); err != nil {
			t.Fatal(err)
		}
	})
}

// TestControlArrivesByteIdentical: the control reaches Corestore exactly as Cloudly sent it —
// whitespace, key order and a 20-digit integer included.
func TestControlArrivesByteIdentical(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	p := plan("restore-bytes")
	grant := authority().Grant("prepare", p)
	controls := []struct {
		control string
		refusal string // "" when Corestore accepts it
	}{
		{"{\n  \"expectedRevision\" : 12345678901234567890,\t\"grant\":\"" + grant + "\" }",
			"restore-node-refused: control-invalid: expectedRevision must be a non-negative safe integer"},
		{"{ \"expectedRevision\":0e0 ,\n\"grant\" : \"" + grant + "\"\n}", ""},
	}
	for i, c := range controls {
		_, err := h.call(contracts.MethodPrepareIsolatedRestoreOnNode, []byte(`{"nodeId":"node-a","control":`+c.control+`}`))
		if c.refusal == "" && err != nil {
			t.Fatal(err)
		}
		if c.refusal != "" {
			wantRefusal(t, err, contracts.RestoreNodeRefused, c.refusal)
		}
		got := h.corestore.Received()
		if len(got) != i+1 || got[i].Op != "prepare" || string(got[i].Body) != c.control {
			t.Fatalf("Corestore received %q\nwant %q", got[i].Body, c.control)
		}
	}
}

// TestControlIsBoundedBySizeAlone: the relay does not parse a control (docs/protocol.md#isolated-restore-and-corestore). A write control
// that breaks isolatedRestoreContractLimits, or has a shape the relay does not know, reaches
// Corestore, which judges it; only a control above 1 MiB is refused by the relay, and never sent.
func TestControlIsBoundedBySizeAlone(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	p := plan("restore-limits")
	if _, err := h.call(contracts.MethodPrepareIsolatedRestoreOnNode, sim.NodeControlRequest("node-a", authority().PrepareControl(p))); err != nil {
		t.Fatal(err)
	}
	grant := authority().Grant("write-object", p)
	write := func(size, index, offset int64, data []byte) []byte {
		sum := sha256.Sum256(data)
		return []byte(fmt.Sprintf(`{"grant":%q,"expectedRevision":1,"object":{"key":"db/base.tar","size":%d,"sha256":"%s"},`+
			`"chunk":{"index":%d,"offset":%d,"chunkSha256":"%s","data":"%s"}}`, grant, size,
			strings.Repeat("0", 64), index, offset, hex.EncodeToString(sum[:]), base64.StdEncoding.EncodeToString(data)))
	}
	for _, c := range []struct {
		name    string
		control []byte
	}{
		{"chunk over 512 KiB decoded", write(64<<20, 0, 0, make([]byte, 512<<10+1))},
		{"chunk index 4096", write(64<<20, 4096, 0, []byte("x"))},
		{"object over 64 MiB", write(64<<20+1, 0, 0, []byte("x"))},
		{"no chunk at all", []byte(fmt.Sprintf(`{"grant":%q,"expectedRevision":1,"object":{"key":"db/base.tar"}}`, grant))},
	} {
		t.Run(c.name, func(t *testing.T) {
			before := len(h.corestore.Received())
			_, err := h.call(contracts.MethodStageIsolatedRestoreArchive, sim.NodeControlRequest("node-a", c.control))
			if !errors.Is(err, contracts.RestoreNodeRefused) {
				t.Fatalf("%v, want Corestore's own refusal", err)
			}
			got := h.corestore.Received()
			if len(got) != before+1 || !bytes.Equal(got[before].Body, c.control) {
				t.Fatal("the control did not reach Corestore byte for byte")
			}
		})
	}
	t.Run("a control above 1 MiB is refused and not sent", func(t *testing.T) {
		before := len(h.corestore.Received())
		big := write(64<<20, 0, 0, make([]byte, 800<<10)) // 800 KiB decoded: about 1.07 MB of base64
		_, err := h.call(contracts.MethodStageIsolatedRestoreArchive, sim.NodeControlRequest("node-a", big))
		wantRefusal(t, err, contracts.RelayRequestInvalid, fmt.Sprintf("relay-request-invalid: stageIsolatedRestoreArchive: isolated restore request "+
			"control is %d bytes, over the relay's limit of 1048576", len(big)))
		if len(h.corestore.Received()) != before {
			t.Fatal("a control above the bound reached Corestore")
		}
	})
}

// TestBurstIsBounded: calls beyond the per-node bound are refused at once, not queued.
func TestBurstIsBounded(t *testing.T) {
	h := newHarness(t, harnessOptions{maxInflightPerNode: 2})
	release := h.corestore.Block()
	defer release()
	status := sim.NodeControlRequest("node-a", authority().StatusControl(plan("restore-burst")))
	answers := make(chan error, 2)
	for range 2 {
		if err := h.Cloudly.CallAsync(contracts.MethodGetIsolatedRestoreProgressOnNode, status, func(r typedsocket.Reply) { answers <- r.Err }); err != nil {
			t.Fatal(err)
		}
	}
	await.Until(t, "the two calls to reach Corestore", 10*time.Second, func() bool { return len(h.corestore.Received()) >= 2 })
	start := time.Now()
	_, err := h.call(contracts.MethodGetIsolatedRestoreProgressOnNode, status)
	wantRefusal(t, err, contracts.RelayNodeBusy, "relay-node-busy: node node-a already has 2 isolated-restore calls in flight")
	if time.Since(start) > 2*time.Second {
		t.Fatal("the refusal waited")
	}
	release()
	for range 2 {
		if err := <-answers; !errors.Is(err, contracts.RestoreNodeRefused) {
			t.Fatalf("held call: %v", err)
		}
	}
	if _, err := h.call(contracts.MethodGetIsolatedRestoreProgressOnNode, status); !errors.Is(err, contracts.RestoreNodeRefused) {
		t.Fatalf("after the burst: %v", err)
	}
}

// TestPlaintextCorestore: with --insecure-plaintext an http:// Corestore origin is carried too.
func TestPlaintextCorestore(t *testing.T) {
	h := newHarness(t, harnessOptions{plaintext: true})
	if !strings.HasPrefix(h.corestore.Origin(), "http://") {
		t.Fatalf("origin %s", h.corestore.Origin())
	}
	p := plan("restore-plaintext")
	p.ChunkBytes = 256 << 10
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	run, err := sim.RunIsolatedRestore(ctx, h.Cloudly.Call, authority(), p)
	if err != nil {
		t.Fatal(err)
	}
	if run.Chunks != 8 || run.Final.Status != "cleaned" {
		t.Fatalf("run %+v", run)
	}
}

// assertNoGrantLogged checks that no log line of the test — relay, restore, corestore, sim peers,
// at debug level — holds any grant minted so far, or any of its parts.
func (h *harness) assertNoGrantLogged() {
	h.T.Helper()
	logs := h.Logs.String()
	if !strings.Contains(logs, `"component":"restore"`) {
		h.T.Fatal("the captured log holds no restore line: the capture is not working")
	}
	minted := authority().Minted()
	if len(minted) == 0 {
		h.T.Fatal("no grant was minted")
	}
	for _, g := range minted {
		for _, part := range append([]string{g}, strings.Split(g, ".")[1:]...) {
			if strings.Contains(logs, part) || strings.Contains(logs, part[:32]) {
				h.T.Fatalf("a log line holds a grant (or part of one)")
			}
		}
	}
}

// TestStatusCountsAnsweredAndRefusedCallsAndShowsNoGrant: calls through the relay to the sim
// Corestore are counted as the status page shows them, and no grant or origin appears there.
func TestStatusCountsAnsweredAndRefusedCallsAndShowsNoGrant(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	p := plan("restore-status")
	if _, err := h.call(contracts.MethodPrepareIsolatedRestoreOnNode, sim.NodeControlRequest("node-a", authority().PrepareControl(p))); err != nil {
		t.Fatal(err)
	}
	if _, err := h.call(contracts.MethodGetIsolatedRestoreProgressOnNode, sim.NodeControlRequest("node-x", authority().StatusControl(p))); err == nil {
		t.Fatal("node-x answered")
	}
	st, ok := h.restore.Status().(restore.Status)
	if !ok {
		t.Fatalf("Status() is a %T", h.restore.Status())
	}
	if st.Inflight != 0 || st.Corestores != 3 || h.outcomes("answered") != 1 || h.outcomes(string(contracts.RestoreNodeNotCarried)) != 1 {
		t.Fatalf("status %+v", st)
	}
	out, err := json.Marshal(st)
	if err != nil {
		t.Fatal(err)
	}
	for _, g := range authority().Minted() {
		for _, part := range append([]string{g}, strings.Split(g, ".")[1:]...) {
			if bytes.Contains(out, []byte(part[:32])) {
				t.Fatalf("the status holds a grant (or part of one): %s", out)
			}
		}
	}
	if bytes.Contains(out, []byte(h.corestore.Origin())) || bytes.Contains(out, []byte("restore-status")) {
		t.Fatalf("the status names an origin or the restore: %s", out)
	}
}

// outcomes is relay_restore_requests_total{outcome} summed over the operations, from the relay's
// registry: the count the status page lists beside the restore's Status.
func (h *harness) outcomes(outcome string) float64 {
	h.T.Helper()
	families, err := h.Registry.Gather()
	if err != nil {
		h.T.Fatal(err)
	}
	var n float64
	for _, f := range families {
		if f.GetName() != "relay_restore_requests_total" {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "outcome" && l.GetValue() == outcome {
					n += m.GetCounter().GetValue()
				}
			}
		}
	}
	return n
}
