package contracts

import (
	"bytes"
	"encoding/json"
	"reflect"
	"strconv"
	"testing"

	"code.foss.global/serve.zone/relay/contracts/strictjson"
)

func addProgressSeeds(f *testing.F) {
	f.Add([]byte(validProgress))
	f.Add([]byte(progressWithAll(map[string]string{"status": `"executed"`, "receivedObjects": "2", "completedMappings": "3",
		"executedAt": "1700000000001", "stagedObject": `{"key":"a","nextIndex":3,"nextOffset":1572864,"complete":false}`})))
	f.Add([]byte(progressWith("revision", "1e0")))
	f.Add([]byte(progressWith("status", `"executing"`)))
	f.Add([]byte(progressWith("stagedObject", `{"a":{"a":1},"a":2}`)))
	f.Add([]byte(progressWith("restoreId", `"r\u00e9"`)))
	f.Add([]byte(`{"nodeId":"n","nodeId":"m"}`))
}

// FuzzNormalizeIsolatedRestoreProgress checks the progress reader against a slow reference built on
// encoding/json, and that an accepted progress survives AppendJSON unchanged.
func FuzzNormalizeIsolatedRestoreProgress(f *testing.F) {
	addProgressSeeds(f)
	f.Fuzz(func(t *testing.T, in []byte) {
		p, err := NormalizeIsolatedRestoreProgress(in)
		ref, refOK := referenceProgress(in)
		switch {
		case err == nil && !refOK:
			t.Fatalf("accepted what the reference refuses: %q", in)
		case err == nil && !reflect.DeepEqual(p, ref):
			t.Fatalf("read %+v, reference %+v", p, ref)
		case err != nil && refOK:
			// The strict reader may refuse what encoding/json reads: a repeated key, invalid UTF-8,
			// a lone surrogate escape. Nothing else.
			if _, rerr := strictjson.ReadObject(in); rerr == nil {
				t.Fatalf("refused (%v) what the reference accepts: %q", err, in)
			}
		}
		if err != nil {
			return
		}
		again, err := NormalizeIsolatedRestoreProgress(p.AppendJSON(nil))
		if err != nil || !reflect.DeepEqual(again, p) {
			t.Fatalf("round trip: %+v -> %+v (%v)", p, again, err)
		}
	})
}

// FuzzProjectIsolatedRestoreProgress checks that a projected progress always states the carried
// node, passes every progress member of Corestore's summary byte for byte, leaves every other
// member out, and normalizes.
func FuzzProjectIsolatedRestoreProgress(f *testing.F) {
	addProgressSeeds(f)
	f.Add([]byte(`{"restoreId":"r","stagingArchiveId":"s","status":"prepared","revision":1,"lastFence":1,"expectedObjects":0,` +
		`"receivedObjects":0,"completedMappings":0,"totalMappings":0,"preparedAt":0,"updatedAt":0,"object":{"k":1}}`))
	f.Fuzz(func(t *testing.T, in []byte) {
		out, p, err := ProjectIsolatedRestoreProgress("_carried-node", in)
		if err != nil {
			return
		}
		if p.NodeID != "_carried-node" {
			t.Fatalf("nodeId %q", p.NodeID)
		}
		if _, err := NormalizeIsolatedRestoreProgress(out); err != nil {
			t.Fatalf("projected progress does not normalize: %v", err)
		}
		inMembers, _ := strictjson.ReadObject(in)
		outMembers, _ := strictjson.ReadObject(out)
		got := make(map[string][]byte, len(outMembers))
		for _, m := range outMembers {
			got[m.Key] = m.Value
		}
		for _, m := range inMembers {
			switch {
			case m.Key == "nodeId":
			case !isProgressKey(m.Key):
				if got[m.Key] != nil {
					t.Fatalf("%s projected, though it is no progress member", m.Key)
				}
			case !bytes.Equal(got[m.Key], m.Value):
				t.Fatalf("%s changed: %q -> %q", m.Key, m.Value, got[m.Key])
			}
		}
	})
}

// referenceProgress is a slow, independent reading of the normalize rules with encoding/json.
func referenceProgress(in []byte) (IsolatedRestoreProgress, bool) {
	var m map[string]json.RawMessage
	if !json.Valid(in) || json.Unmarshal(in, &m) != nil || m == nil {
		return IsolatedRestoreProgress{}, false
	}
	required := []string{"nodeId", "restoreId", "stagingArchiveId", "status", "revision", "lastFence", "expectedObjects",
		"receivedObjects", "completedMappings", "totalMappings", "preparedAt", "updatedAt"}
	for _, k := range required {
		if _, ok := m[k]; !ok {
			return IsolatedRestoreProgress{}, false
		}
	}
	if len(m) > len(required)+2 {
		return IsolatedRestoreProgress{}, false
	}
	for k := range m {
		if k != "executedAt" && k != "stagedObject" && !containsString(required, k) {
			return IsolatedRestoreProgress{}, false
		}
	}
	str := func(k string) (string, bool) {
		var s string
		if bytes.HasPrefix(bytes.TrimSpace(m[k]), []byte(`"`)) && json.Unmarshal(m[k], &s) == nil {
			return s, true
		}
		return "", false
	}
	num := func(k string) (int64, bool) {
		var n json.Number
		d := json.NewDecoder(bytes.NewReader(m[k]))
		d.UseNumber()
		var v any
		if d.Decode(&v) != nil {
			return 0, false
		}
		n, ok := v.(json.Number)
		if !ok {
			return 0, false
		}
		f, err := strconv.ParseFloat(string(n), 64)
		if err != nil || f != float64(int64(f)) || f < 0 || f > strictjson.MaxSafeInteger {
			return 0, false
		}
		if i, err := strconv.ParseInt(string(n), 10, 64); err == nil && i > strictjson.MaxSafeInteger {
			return 0, false
		}
		return int64(f), true
	}
	var p IsolatedRestoreProgress
	var ok [16]bool
	p.NodeID, ok[0] = str("nodeId")
	p.RestoreID, ok[1] = str("restoreId")
	p.StagingArchiveID, ok[2] = str("stagingArchiveId")
	p.Status, ok[3] = str("status")
	p.Revision, ok[4] = num("revision")
	p.LastFence, ok[5] = num("lastFence")
	p.ExpectedObjects, ok[6] = num("expectedObjects")
	p.ReceivedObjects, ok[7] = num("receivedObjects")
	p.CompletedMappings, ok[8] = num("completedMappings")
	p.TotalMappings, ok[9] = num("totalMappings")
	p.PreparedAt, ok[10] = num("preparedAt")
	p.UpdatedAt, ok[11] = num("updatedAt")
	for _, b := range ok[:12] {
		if !b {
			return IsolatedRestoreProgress{}, false
		}
	}
	if _, has := m["executedAt"]; has {
		n, good := num("executedAt")
		if !good {
			return IsolatedRestoreProgress{}, false
		}
		p.ExecutedAt = &n
	}
	if raw, has := m["stagedObject"]; has {
		if !bytes.HasPrefix(raw, []byte("{")) {
			return IsolatedRestoreProgress{}, false
		}
		p.StagedObject = raw
	}
	statusOK := false
	for _, s := range []string{"prepared", "executing", "failed", "executed", "cleaned"} {
		statusOK = statusOK || p.Status == s
	}
	whole := p.ReceivedObjects == p.ExpectedObjects
	if !IsClusterNodeID(p.NodeID) || !IsCanonicalID(p.RestoreID) || !IsCanonicalID(p.StagingArchiveID) || !statusOK ||
		p.Revision < 1 || p.LastFence < 1 || p.ReceivedObjects > p.ExpectedObjects || p.CompletedMappings > p.TotalMappings ||
		(p.Status == "executing" || p.Status == "executed") && !whole ||
		p.Status == "executed" && (p.CompletedMappings != p.TotalMappings || p.ExecutedAt == nil) {
		return IsolatedRestoreProgress{}, false
	}
	return p, true
}

func containsString(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}
