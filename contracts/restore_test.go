package contracts

import (
	"errors"
	"reflect"
	"strings"
	"testing"

	"code.foss.global/serve.zone/relay/contracts/strictjson"
)

const validProgress = `{"nodeId":"node-a","restoreId":"restore-1","stagingArchiveId":"staging-1","status":"prepared",` +
	`"revision":1,"lastFence":1,"expectedObjects":2,"receivedObjects":0,"completedMappings":0,"totalMappings":3,` +
	`"preparedAt":1700000000000,"updatedAt":1700000000000}`

func reasonsOf(t *testing.T, err error) []string {
	t.Helper()
	var inv *InvalidError
	if !errors.As(err, &inv) {
		t.Fatalf("error %v is not an *InvalidError", err)
	}
	return inv.Reasons
}

func TestIsolatedRestoreVocabularies(t *testing.T) {
	if got := IsolatedRestoreProgressStatuses(); got != [5]string{"prepared", "executing", "failed", "executed", "cleaned"} {
		t.Errorf("statuses = %v", got)
	}
	if got := IsolatedRestoreContractLimits(); got != (IsolatedRestoreLimits{524288, 4096, 67108864}) {
		t.Errorf("limits = %+v", got)
	}
	want := map[string]string{
		"prepareIsolatedRestoreOnNode": "prepare", "stageIsolatedRestoreArchive": "write",
		"getIsolatedRestoreProgressOnNode": "status", "executeIsolatedRestoreOnNode": "execute",
		"cleanupIsolatedRestoreOnNode": "cleanup",
	}
	for _, m := range IsolatedRestoreMethods() {
		if op, ok := IsolatedRestoreCorestoreOp(m); !ok || op != want[m] {
			t.Errorf("%s -> %q %v", m, op, ok)
		}
	}
	if _, ok := IsolatedRestoreCorestoreOp("pushClusterRouteTable"); ok {
		t.Error("a foreign method maps to an operation")
	}
}

func TestReadIsolatedRestoreNodeControl(t *testing.T) {
	body := []byte(`{ "nodeId" : "-node_a", "control" : {"grant":"g.h.s", "expectedRevision": 12345678901234567890 } }`)
	req, err := ReadIsolatedRestoreNodeControl(body)
	if err != nil {
		t.Fatal(err)
	}
	if req.NodeID != "-node_a" || string(req.Control) != `{"grant":"g.h.s", "expectedRevision": 12345678901234567890 }` {
		t.Fatalf("read %q %q", req.NodeID, req.Control)
	}
	for body, want := range map[string]string{
		`{"nodeId":"n","control":{},"extra":1}`:    "isolated restore request must use its exact schema { nodeId, control }",
		`{"nodeId":"n"}`:                           "isolated restore request must use its exact schema { nodeId, control }",
		`{"nodeId":"n","nodeId":"m","control":{}}`: "isolated restore request must use its exact schema { nodeId, control }",
		`[]`:                            "isolated restore request must use its exact schema { nodeId, control }",
		`{"nodeId":"n.1","control":{}}`: "isolated restore request nodeId must be a cluster node id",
		`{"nodeId":"n","control":{"a":"\ud800"}}`:                                                "isolated restore request must use its exact schema { nodeId, control }",
		`{"nodeId":7,"control":[{"grant":"hidden"}]}`:                                            "isolated restore request nodeId must be a cluster node id",
		`{"nodeId":"n","control":"` + strings.Repeat("x", MaxIsolatedRestoreControlBytes) + `"}`: "isolated restore request control is 1048578 bytes, over the relay's limit of 1048576",
	} {
		_, err := ReadIsolatedRestoreNodeControl([]byte(body))
		if err == nil || err.Error() != want {
			t.Errorf("%s: %v, want %q", body, err, want)
		}
		if err != nil && (strings.Contains(err.Error(), "secret-grant") || strings.Contains(err.Error(), "hidden")) {
			t.Errorf("%s: the reason quotes the control", body)
		}
	}
}

// The control is Corestore's to read: the relay does not parse it, whatever it holds, and bounds
// it by size alone (docs/protocol.md#isolated-restore-and-corestore).
func TestReadIsolatedRestoreNodeControlLeavesTheControlUnparsed(t *testing.T) {
	for _, control := range []string{
		`{"grant":"g.h.s","expectedRevision":3,"object":{"size":99999999999},"chunk":{"index":99999,"data":"not base64!"}}`,
		`{"grant":"g.h.s","chunk":{"index":1,"index":2}}`, // a repeated key inside: Corestore's to judge
		`"secret-grant"`, `[1,2]`, `null`,
		`"` + strings.Repeat("x", MaxIsolatedRestoreControlBytes-2) + `"`, // exactly the limit
	} {
		req, err := ReadIsolatedRestoreNodeControl([]byte(`{"nodeId":"n","control":` + control + `}`))
		if err != nil || string(req.Control) != control {
			t.Errorf("%.80s: %v", control, err)
		}
	}
}

func TestNormalizeIsolatedRestoreProgressAcceptsAndReads(t *testing.T) {
	p, err := NormalizeIsolatedRestoreProgress([]byte(validProgress))
	if err != nil {
		t.Fatal(err)
	}
	want := IsolatedRestoreProgress{NodeID: "node-a", RestoreID: "restore-1", StagingArchiveID: "staging-1", Status: "prepared",
		Revision: 1, LastFence: 1, ExpectedObjects: 2, TotalMappings: 3, PreparedAt: 1700000000000, UpdatedAt: 1700000000000}
	if !reflect.DeepEqual(p, want) {
		t.Fatalf("read %+v", p)
	}
	if got := string(p.AppendJSON(nil)); got != validProgress {
		t.Fatalf("AppendJSON = %s", got)
	}
	executed := `{"nodeId":"node-a","restoreId":"r","stagingArchiveId":"s","status":"executed","revision":9,"lastFence":4,` +
		`"expectedObjects":2,"receivedObjects":2,"completedMappings":3,"totalMappings":3,"preparedAt":1,"updatedAt":2,` +
		`"executedAt":3,"stagedObject":{"key":"k","next":{"index":1e0}}}`
	p, err = NormalizeIsolatedRestoreProgress([]byte(executed))
	if err != nil {
		t.Fatal(err)
	}
	if p.ExecutedAt == nil || *p.ExecutedAt != 3 || string(p.StagedObject) != `{"key":"k","next":{"index":1e0}}` {
		t.Fatalf("optional members: %+v", p)
	}
	if got := string(p.AppendJSON(nil)); got != executed {
		t.Fatalf("AppendJSON = %s", got)
	}
}

// progressWith replaces one member of validProgress (or adds one) by its raw JSON.
func progressWith(key, raw string) string {
	if key == "executedAt" || key == "stagedObject" {
		return progressWithAll(map[string]string{key: raw})
	}
	members, _ := strictjson.ReadObject([]byte(validProgress))
	out := "{"
	found := false
	for i, m := range members {
		if i > 0 {
			out += ","
		}
		v := string(m.Value)
		if m.Key == key {
			v, found = raw, true
		}
		out += `"` + m.Key + `":` + v
	}
	if !found {
		out += `,"` + key + `":` + raw
	}
	return out + "}"
}

func TestNormalizeIsolatedRestoreProgressRefusesEachRule(t *testing.T) {
	const p = "isolated restore progress "
	cases := []struct {
		name, body string
		want       []string
	}{
		{"unknown status", progressWith("status", `"paused"`), []string{p + "status must be one of prepared, executing, failed, executed, cleaned"}},
		{"received above the plan", progressWith("receivedObjects", `3`), []string{p + "receivedObjects must not exceed expectedObjects, the plan it belongs to"}},
		{"mappings above the plan", progressWith("completedMappings", `4`), []string{p + "completedMappings must not exceed totalMappings, the plan it belongs to"}},
		{"revision below 1", progressWith("revision", `0`), []string{p + "revision must be a safe integer of at least 1: a committed state carries it"}},
		{"lastFence below 1", progressWith("lastFence", `0`), []string{p + "lastFence must be a safe integer of at least 1: a committed state carries it"}},
		{"executing without the whole archive", progressWith("status", `"executing"`), []string{p + "that is executing must hold the whole archive"}},
		{"executed without the whole archive", progressWithAll(map[string]string{"status": `"executed"`, "completedMappings": "3", "executedAt": "5"}),
			[]string{p + "that is executed must hold the whole archive"}},
		{"executed leaving a mapping", progressWithAll(map[string]string{"status": `"executed"`, "receivedObjects": "2", "completedMappings": "2", "executedAt": "5"}),
			[]string{p + "that is executed must leave no mapping behind"}},
		{"executed without executedAt", progressWithAll(map[string]string{"status": `"executed"`, "receivedObjects": "2", "completedMappings": "3"}),
			[]string{p + "that is executed must state executedAt"}},
		{"unknown key", progressWith("sourceBackup", `"b"`), []string{p + "must use its exact schema"}},
		{"missing key", strings.Replace(validProgress, `,"updatedAt":1700000000000`, "", 1), []string{p + "must use its exact schema"}},
		{"repeated key", strings.Replace(validProgress, `"revision":1,`, `"revision":1,"revision":2,`, 1), []string{p + "must use its exact schema"}},
		{"unsafe revision", progressWith("revision", `9007199254740993`), []string{p + "revision must be a safe integer of at least 1: a committed state carries it"}},
		{"fractional count", progressWith("expectedObjects", `2.5`), []string{p + "expectedObjects must be a non-negative safe integer"}},
		{"negative timestamp", progressWith("updatedAt", `-1`), []string{p + "updatedAt must be a Unix millisecond timestamp"}},
		{"string executedAt", progressWith("executedAt", `"now"`), []string{p + "executedAt must be a Unix millisecond timestamp"}},
		{"canonical restore id", progressWith("restoreId", `"-r"`), []string{p + "restoreId must be a canonical identifier"}},
		{"node id rule", progressWith("nodeId", `"node a"`), []string{p + "nodeId must be a cluster node id"}},
		{"stagedObject null", progressWith("stagedObject", `null`), []string{p + "stagedObject must be an object"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := NormalizeIsolatedRestoreProgress([]byte(c.body))
			if err == nil {
				t.Fatalf("accepted %s", c.body)
			}
			if got := reasonsOf(t, err); !reflect.DeepEqual(got, c.want) {
				t.Fatalf("reasons %q\nwant    %q", got, c.want)
			}
		})
	}
	// The node-id reader, not the canonical one: a leading "-" or "_" is a node id.
	if _, err := NormalizeIsolatedRestoreProgress([]byte(progressWith("nodeId", `"_node"`))); err != nil {
		t.Fatal(err)
	}
}

// progressWithAll replaces (or adds) several members of validProgress.
func progressWithAll(repl map[string]string) string {
	members, _ := strictjson.ReadObject([]byte(validProgress))
	out := "{"
	seen := map[string]bool{}
	for i, m := range members {
		if i > 0 {
			out += ","
		}
		v := string(m.Value)
		if r, ok := repl[m.Key]; ok {
			v = r
		}
		seen[m.Key] = true
		out += `"` + m.Key + `":` + v
	}
	for _, k := range []string{"executedAt", "stagedObject"} {
		if v, ok := repl[k]; ok && !seen[k] {
			out += `,"` + k + `":` + v
		}
	}
	return out + "}"
}

func TestBindIsolatedRestoreProgressToNode(t *testing.T) {
	p, _ := NormalizeIsolatedRestoreProgress([]byte(validProgress))
	if got, err := BindIsolatedRestoreProgressToNode(p, IsolatedRestoreBinding{NodeID: "node-a", RestoreID: "restore-1"}); err != nil || !reflect.DeepEqual(got, p) {
		t.Fatalf("bound %v %v", got, err)
	}
	_, err := BindIsolatedRestoreProgressToNode(p, IsolatedRestoreBinding{NodeID: "node-b", RestoreID: "restore-2"})
	want := []string{"isolated restore progress nodeId must be the node the control was dispatched to",
		"isolated restore progress restoreId must be the restore the control belongs to"}
	if got := reasonsOf(t, err); !reflect.DeepEqual(got, want) {
		t.Fatalf("reasons %q", got)
	}
}

func TestProjectIsolatedRestoreProgress(t *testing.T) {
	summary := `{ "restoreId":"restore-1","nodeId":"node-z","stagingArchiveId":"staging-1","status":"prepared",` +
		`"revision":2,"lastFence":1,"expectedObjects":2,"receivedObjects":0,"completedMappings":0,"totalMappings":3,` +
		`"preparedAt":1,"updatedAt":2,"stagedObject":{ "key" : "a", "nextIndex":12345678901234567890 },` +
		`"object":{"key":"a","stored":true} }`
	out, p, err := ProjectIsolatedRestoreProgress("node-a", []byte(summary))
	if err != nil {
		t.Fatal(err)
	}
	want := `{"nodeId":"node-a","restoreId":"restore-1","stagingArchiveId":"staging-1","status":"prepared",` +
		`"revision":2,"lastFence":1,"expectedObjects":2,"receivedObjects":0,"completedMappings":0,"totalMappings":3,` +
		`"preparedAt":1,"updatedAt":2,"stagedObject":{ "key" : "a", "nextIndex":12345678901234567890 }}`
	if string(out) != want {
		t.Fatalf("projected\n%s\nwant\n%s", out, want)
	}
	if p.NodeID != "node-a" {
		t.Fatalf("nodeId %q", p.NodeID)
	}
	for _, bad := range []string{
		`[]`,
		strings.Replace(summary, `"revision":2`, `"revision":0`, 1),
		strings.Replace(summary, `"object"`, `"status"`, 1), // a repeated key
	} {
		if _, _, err := ProjectIsolatedRestoreProgress("node-a", []byte(bad)); err == nil {
			t.Errorf("projected %s", bad)
		}
	}
	_, _, err = ProjectIsolatedRestoreProgress("node-a", []byte(`[]`))
	if got := reasonsOf(t, err); !reflect.DeepEqual(got, []string{"Corestore's staging summary must be an object without repeated keys"}) {
		t.Fatalf("reasons %q", got)
	}
	// Tolerance: the summary is this project's guess at Corestore's answer, so a member the relay
	// does not know is left out of the progress, as the object receipt is, instead of refusing
	// Corestore's answer.
	t.Run("a member the relay does not know is left out", func(t *testing.T) {
		unknown := strings.Replace(summary, `"object"`, `"receipt"`, 1)
		unknown = strings.Replace(unknown, `{ "restoreId"`, `{ "corestoreVersion":"9.1.0", "restoreId"`, 1)
		out, _, err := ProjectIsolatedRestoreProgress("node-a", []byte(unknown))
		if err != nil || string(out) != want {
			t.Fatalf("projected\n%s\n%v\nwant\n%s", out, err, want)
		}
	})
}
