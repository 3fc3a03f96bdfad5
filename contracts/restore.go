package contracts

import (
	"encoding/json"
	"strconv"
)

// Isolated restore (seed-defined methods and progress, project-defined Corestore HTTP; SPEC §9,
// CONTRACTS §9).
//
// Cloudly drives a restore on one node with five methods of one shape, { nodeId, control } →
// { progress }. control is the body the node's Corestore itself reads, a bearer grant inside: the
// relay routes on nodeId, forwards control byte for byte, and reads of it only what the contract
// limits need (ReadIsolatedRestoreWriteChunk). Corestore answers with its staging summary; the
// relay returns progress = summary + { nodeId } (ProjectIsolatedRestoreProgress), nodeId being the
// node it carried the control to, after NormalizeIsolatedRestoreProgress.

// Corestore operations: POST <corestore origin>/isolated-restore/<op> with the control bytes as
// the body (project-defined, SPEC §9).
const (
	CorestoreOpPrepare = "prepare"
	CorestoreOpWrite   = "write"
	CorestoreOpStatus  = "status"
	CorestoreOpExecute = "execute"
	CorestoreOpCleanup = "cleanup"
)

// CorestoreIsolatedRestorePathPrefix is the path every Corestore operation lives under.
const CorestoreIsolatedRestorePathPrefix = "/isolated-restore/"

// CorestoreRefusalBody is the answer Corestore refuses a control with, beside a non-2xx status:
// { reason } (project-defined). The relay passes the reason on as restore-node-refused: <reason>.
func CorestoreRefusalBody(reason string) []byte {
	return append(AppendString([]byte(`{"reason":`), reason), '}')
}

// IsolatedRestoreCorestoreOp maps one of the five methods to its Corestore operation.
func IsolatedRestoreCorestoreOp(method string) (string, bool) {
	switch method {
	case MethodPrepareIsolatedRestoreOnNode:
		return CorestoreOpPrepare, true
	case MethodStageIsolatedRestoreArchive:
		return CorestoreOpWrite, true
	case MethodGetIsolatedRestoreProgressOnNode:
		return CorestoreOpStatus, true
	case MethodExecuteIsolatedRestoreOnNode:
		return CorestoreOpExecute, true
	case MethodCleanupIsolatedRestoreOnNode:
		return CorestoreOpCleanup, true
	}
	return "", false
}

// IsolatedRestoreLimits is data.isolatedRestoreContractLimits (field names project-defined).
type IsolatedRestoreLimits struct {
	MaximumChunkBytes      int64 // decoded bytes per chunk
	MaximumChunksPerObject int64
	MaximumObjectBytes     int64
}

var isolatedRestoreContractLimits = IsolatedRestoreLimits{
	MaximumChunkBytes:      512 << 10,
	MaximumChunksPerObject: 4096,
	MaximumObjectBytes:     64 << 20,
}

// IsolatedRestoreContractLimits is data.isolatedRestoreContractLimits: at most 512 KiB decoded per
// chunk, 4 096 chunks per object and 64 MiB per object, each chunk with its own chunkSha256.
func IsolatedRestoreContractLimits() IsolatedRestoreLimits { return isolatedRestoreContractLimits }

// data.isolatedRestoreProgressStatuses.
const (
	IsolatedRestorePrepared  = "prepared"
	IsolatedRestoreExecuting = "executing"
	IsolatedRestoreFailed    = "failed"
	IsolatedRestoreExecuted  = "executed"
	IsolatedRestoreCleaned   = "cleaned"
)

var isolatedRestoreProgressStatuses = [...]string{
	IsolatedRestorePrepared, IsolatedRestoreExecuting, IsolatedRestoreFailed, IsolatedRestoreExecuted, IsolatedRestoreCleaned,
}

// IsolatedRestoreProgressStatuses is data.isolatedRestoreProgressStatuses, in the seed's order.
func IsolatedRestoreProgressStatuses() [5]string { return isolatedRestoreProgressStatuses }

func isIsolatedRestoreStatus(s string) bool {
	for _, v := range isolatedRestoreProgressStatuses {
		if v == s {
			return true
		}
	}
	return false
}

// IsolatedRestoreNodeControl is the request of the five methods, { nodeId, control }.
type IsolatedRestoreNodeControl struct {
	NodeID  string
	Control json.RawMessage // a sub-slice of the request: forwarded as is, never re-encoded
}

// ReadIsolatedRestoreNodeControl reads { nodeId, control }: exact keys, nodeId by the node-id
// reader, control a well-formed JSON object kept raw. Reasons never quote the control.
func ReadIsolatedRestoreNodeControl(raw []byte) (IsolatedRestoreNodeControl, error) {
	const path = "isolated restore request"
	members, err := ReadObject(raw)
	if err != nil || !hasExactKeys(members, "nodeId", "control") {
		return IsolatedRestoreNodeControl{}, &InvalidError{[]string{path + " must use its exact schema { nodeId, control }"}}
	}
	m := byKey(members)
	var req IsolatedRestoreNodeControl
	var reasons []string
	if s, err := ReadString(m["nodeId"]); err != nil || !IsClusterNodeID(s) {
		reasons = append(reasons, path+" nodeId must be a cluster node id")
	} else {
		req.NodeID = s
	}
	if KindOf(m["control"]) != KindObject {
		reasons = append(reasons, path+" control must be an object")
	} else {
		req.Control = m["control"]
	}
	if len(reasons) > 0 {
		return IsolatedRestoreNodeControl{}, &InvalidError{reasons}
	}
	return req, nil
}

// Project-defined control shapes (the seeds name IIsolatedRestoreControl{Prepare,Write,Status,
// Execute,Cleanup}Request but do not spell them; Corestore reads them exact-key):
//
//	prepare  { grant, expectedRevision }                       expectedRevision 0 on the first call
//	write    { grant, expectedRevision,
//	           object: { key, size, sha256 },                  the immutable manifest descriptor
//	           chunk:  { index, offset, chunkSha256, data } }  data: standard base64 with padding
//	status   { grant }
//	execute  { grant, expectedRevision }
//	cleanup  { grant, expectedRevision }
//
// grant is the compact RS256 grant (data.IIsolatedRestoreControlAuthority) naming one operation.
// The relay never reads it. Of a write control it reads object.size and the chunk's index,
// offset, chunkSha256 and data, only to refuse a chunk over the contract limits before sending.

// IsolatedRestoreWriteChunk is what the relay reads of a write control.
type IsolatedRestoreWriteChunk struct {
	ObjectSize   int64 // object.size: the declared size of the whole object
	Index        int64 // chunk.index, from 0
	Offset       int64 // chunk.offset: where the chunk starts in the object
	DecodedBytes int64 // the decoded length of chunk.data
}

// ReadIsolatedRestoreWriteChunk reads a write control and checks it against
// isolatedRestoreContractLimits: the decoded chunk, its index, the object's declared size, and the
// chunk lying inside the object. Every violation is one reason; none quotes the control.
func ReadIsolatedRestoreWriteChunk(control []byte) (IsolatedRestoreWriteChunk, error) {
	const path = "write control"
	lim := isolatedRestoreContractLimits
	top, err := ReadObject(control)
	if err != nil {
		return IsolatedRestoreWriteChunk{}, &InvalidError{[]string{path + " must be an object without repeated keys"}}
	}
	tm := byKey(top)
	if tm["object"] == nil || tm["chunk"] == nil {
		return IsolatedRestoreWriteChunk{}, &InvalidError{[]string{path + " must carry an object descriptor and a chunk"}}
	}
	object, err1 := ReadObject(tm["object"])
	chunk, err2 := ReadObject(tm["chunk"])
	if err1 != nil || err2 != nil {
		return IsolatedRestoreWriteChunk{}, &InvalidError{[]string{path + " object and chunk must be objects without repeated keys"}}
	}
	om, cm := byKey(object), byKey(chunk)
	var w IsolatedRestoreWriteChunk
	var reasons []string
	sizeOK, indexOK, offsetOK, dataOK := false, false, false, false
	if w.ObjectSize, sizeOK = ReadCounter(om["size"]); !sizeOK {
		reasons = append(reasons, path+" object size must be a non-negative safe integer")
	} else if w.ObjectSize > lim.MaximumObjectBytes {
		sizeOK = false
		reasons = append(reasons, path+" object size "+itoa(w.ObjectSize)+" exceeds the limit of "+itoa(lim.MaximumObjectBytes)+" bytes per object")
	}
	if w.Index, indexOK = ReadCounter(cm["index"]); !indexOK {
		reasons = append(reasons, path+" chunk index must be a non-negative safe integer")
	} else if w.Index >= lim.MaximumChunksPerObject {
		reasons = append(reasons, path+" chunk index "+itoa(w.Index)+" exceeds the limit of "+itoa(lim.MaximumChunksPerObject)+" chunks per object")
	}
	if w.Offset, offsetOK = ReadCounter(cm["offset"]); !offsetOK {
		reasons = append(reasons, path+" chunk offset must be a non-negative safe integer")
	}
	if s, err := ReadString(cm["chunkSha256"]); err != nil || !IsLowerHex(s, 64) {
		reasons = append(reasons, path+" chunk chunkSha256 must be 64 lowercase hex digits")
	}
	if s, err := ReadString(cm["data"]); err != nil {
		reasons = append(reasons, path+" chunk data must be a base64 string")
	} else if w.DecodedBytes, dataOK = base64DecodedLen(s); !dataOK {
		reasons = append(reasons, path+" chunk data must be standard base64 with padding")
	} else if w.DecodedBytes > lim.MaximumChunkBytes {
		reasons = append(reasons, path+" chunk is "+itoa(w.DecodedBytes)+" bytes decoded, over the limit of "+itoa(lim.MaximumChunkBytes))
	}
	if sizeOK && offsetOK && dataOK && w.Offset+w.DecodedBytes > w.ObjectSize {
		reasons = append(reasons, path+" chunk ends at byte "+itoa(w.Offset+w.DecodedBytes)+", beyond the object's declared size "+itoa(w.ObjectSize))
	}
	if len(reasons) > 0 {
		return IsolatedRestoreWriteChunk{}, &InvalidError{reasons}
	}
	return w, nil
}

// base64DecodedLen is the decoded length of s in standard base64 with padding, without decoding
// it; ok is false when s is not that encoding.
func base64DecodedLen(s string) (int64, bool) {
	if len(s)%4 != 0 {
		return 0, false
	}
	pad := 0
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c >= 'A' && c <= 'Z', c >= 'a' && c <= 'z', c >= '0' && c <= '9', c == '+', c == '/':
			if pad > 0 {
				return 0, false
			}
		case c == '=' && i >= len(s)-2:
			pad++
		default:
			return 0, false
		}
	}
	return int64(len(s)/4*3 - pad), true
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }

// IsolatedRestoreProgress is data.IIsolatedRestoreProgress: Corestore's staging summary plus the
// node the control was carried to. Timestamps are Unix milliseconds.
type IsolatedRestoreProgress struct {
	NodeID            string
	RestoreID         string
	StagingArchiveID  string
	Status            string
	Revision          int64
	LastFence         int64
	ExpectedObjects   int64
	ReceivedObjects   int64
	CompletedMappings int64
	TotalMappings     int64
	PreparedAt        int64
	UpdatedAt         int64
	ExecutedAt        *int64          // nil when absent
	StagedObject      json.RawMessage // opaque; nil when absent
}

// progressKeys are IIsolatedRestoreProgress's keys in the seed's order: required, "?", optional.
var progressKeys = []string{"nodeId", "restoreId", "stagingArchiveId", "status", "revision", "lastFence",
	"expectedObjects", "receivedObjects", "completedMappings", "totalMappings", "preparedAt", "updatedAt",
	"?", "executedAt", "stagedObject"}

// NormalizeIsolatedRestoreProgress is data.normalizeIsolatedRestoreProgress: it reads a progress
// exactly (exact keys, plain data) and refuses an unknown status, a count larger than the plan it
// belongs to, a revision or lastFence below 1, an executing or executed progress that does not
// hold the whole archive, and an executed progress that left a mapping behind or does not say when
// it finished. stagedObject, when present, must be an object and is kept opaque. The error is an
// *InvalidError with one reason per violation.
func NormalizeIsolatedRestoreProgress(raw []byte) (IsolatedRestoreProgress, error) {
	const path = "isolated restore progress"
	members, err := ReadObject(raw)
	if err != nil || !hasExactKeys(members, progressKeys...) {
		return IsolatedRestoreProgress{}, &InvalidError{[]string{path + " must use its exact schema"}}
	}
	m := byKey(members)
	var p IsolatedRestoreProgress
	var reasons []string
	fail := func(reason string) { reasons = append(reasons, path+" "+reason) }
	if s, err := ReadString(m["nodeId"]); err != nil || !IsClusterNodeID(s) {
		fail("nodeId must be a cluster node id")
	} else {
		p.NodeID = s
	}
	for _, f := range []struct {
		key string
		dst *string
	}{{"restoreId", &p.RestoreID}, {"stagingArchiveId", &p.StagingArchiveID}} {
		if s, err := ReadString(m[f.key]); err != nil || !IsCanonicalID(s) {
			fail(f.key + " must be a canonical identifier")
		} else {
			*f.dst = s
		}
	}
	if s, err := ReadString(m["status"]); err != nil || !isIsolatedRestoreStatus(s) {
		fail("status must be one of prepared, executing, failed, executed, cleaned")
	} else {
		p.Status = s
	}
	counters := []struct {
		key      string
		dst      *int64
		min      int64
		minWords string
	}{
		{"revision", &p.Revision, 1, "a safe integer of at least 1: a committed state carries it"},
		{"lastFence", &p.LastFence, 1, "a safe integer of at least 1: a committed state carries it"},
		{"expectedObjects", &p.ExpectedObjects, 0, "a non-negative safe integer"},
		{"receivedObjects", &p.ReceivedObjects, 0, "a non-negative safe integer"},
		{"completedMappings", &p.CompletedMappings, 0, "a non-negative safe integer"},
		{"totalMappings", &p.TotalMappings, 0, "a non-negative safe integer"},
		{"preparedAt", &p.PreparedAt, 0, "a Unix millisecond timestamp"},
		{"updatedAt", &p.UpdatedAt, 0, "a Unix millisecond timestamp"},
	}
	bad := map[string]bool{}
	for _, c := range counters {
		if n, ok := ReadCounter(m[c.key]); !ok || n < c.min {
			fail(c.key + " must be " + c.minWords)
			bad[c.key] = true
		} else {
			*c.dst = n
		}
	}
	if raw, ok := m["executedAt"]; ok {
		if n, ok := ReadCounter(raw); !ok {
			fail("executedAt must be a Unix millisecond timestamp")
		} else {
			p.ExecutedAt = &n
		}
	}
	if raw, ok := m["stagedObject"]; ok {
		if KindOf(raw) != KindObject {
			fail("stagedObject must be an object")
		} else {
			p.StagedObject = raw
		}
	}
	if !bad["receivedObjects"] && !bad["expectedObjects"] && p.ReceivedObjects > p.ExpectedObjects {
		fail("receivedObjects must not exceed expectedObjects, the plan it belongs to")
	}
	if !bad["completedMappings"] && !bad["totalMappings"] && p.CompletedMappings > p.TotalMappings {
		fail("completedMappings must not exceed totalMappings, the plan it belongs to")
	}
	if (p.Status == IsolatedRestoreExecuting || p.Status == IsolatedRestoreExecuted) &&
		!bad["receivedObjects"] && !bad["expectedObjects"] && p.ReceivedObjects != p.ExpectedObjects {
		fail("that is " + p.Status + " must hold the whole archive")
	}
	if p.Status == IsolatedRestoreExecuted {
		if !bad["completedMappings"] && !bad["totalMappings"] && p.CompletedMappings != p.TotalMappings {
			fail("that is executed must leave no mapping behind")
		}
		if _, ok := m["executedAt"]; !ok {
			fail("that is executed must state executedAt")
		}
	}
	if len(reasons) > 0 {
		return IsolatedRestoreProgress{}, &InvalidError{reasons}
	}
	return p, nil
}

// AppendJSON appends the progress as JSON, keys in the seed's order.
func (p IsolatedRestoreProgress) AppendJSON(dst []byte) []byte {
	dst = append(dst, `{"nodeId":`...)
	dst = AppendString(dst, p.NodeID)
	dst = append(dst, `,"restoreId":`...)
	dst = AppendString(dst, p.RestoreID)
	dst = append(dst, `,"stagingArchiveId":`...)
	dst = AppendString(dst, p.StagingArchiveID)
	dst = append(dst, `,"status":`...)
	dst = AppendString(dst, p.Status)
	for _, f := range []struct {
		key string
		n   int64
	}{{"revision", p.Revision}, {"lastFence", p.LastFence}, {"expectedObjects", p.ExpectedObjects},
		{"receivedObjects", p.ReceivedObjects}, {"completedMappings", p.CompletedMappings},
		{"totalMappings", p.TotalMappings}, {"preparedAt", p.PreparedAt}, {"updatedAt", p.UpdatedAt}} {
		dst = append(dst, ',', '"')
		dst = append(dst, f.key...)
		dst = append(dst, '"', ':')
		dst = strconv.AppendInt(dst, f.n, 10)
	}
	if p.ExecutedAt != nil {
		dst = append(dst, `,"executedAt":`...)
		dst = strconv.AppendInt(dst, *p.ExecutedAt, 10)
	}
	if p.StagedObject != nil {
		dst = append(dst, `,"stagedObject":`...)
		dst = append(dst, p.StagedObject...)
	}
	return append(dst, '}')
}

// IsolatedRestoreBinding is what an answer is tied back to: the node Cloudly dispatched the
// control to and the restore it belongs to.
type IsolatedRestoreBinding struct {
	NodeID    string
	RestoreID string
}

// BindIsolatedRestoreProgressToNode is data.bindIsolatedRestoreProgressToNode: it refuses a
// progress that names another node or another restore. The control names neither, so this is
// Cloudly's check; the relay only guarantees nodeId is the node it carried the control to.
func BindIsolatedRestoreProgressToNode(p IsolatedRestoreProgress, b IsolatedRestoreBinding) (IsolatedRestoreProgress, error) {
	const path = "isolated restore progress"
	var reasons []string
	if p.NodeID != b.NodeID {
		reasons = append(reasons, path+" nodeId must be the node the control was dispatched to")
	}
	if p.RestoreID != b.RestoreID {
		reasons = append(reasons, path+" restoreId must be the restore the control belongs to")
	}
	if len(reasons) > 0 {
		return IsolatedRestoreProgress{}, &InvalidError{reasons}
	}
	return p, nil
}

// summaryKeys are the keys of Corestore's staging summary (project-defined): the progress without
// nodeId, plus two optional keys the relay never projects: nodeId (whatever Corestore says, the
// relay states the node it carried the control to) and object (the receipt of Corestore's own
// write answer, a different shape).
var summaryKeys = []string{"restoreId", "stagingArchiveId", "status", "revision", "lastFence",
	"expectedObjects", "receivedObjects", "completedMappings", "totalMappings", "preparedAt", "updatedAt",
	"?", "executedAt", "stagedObject", "nodeId", "object"}

// ProjectIsolatedRestoreProgress builds progress = Corestore's summary + { nodeId }: nodeId first,
// then the summary's members in Corestore's order, each value byte for byte (stagedObject stays
// opaque), nodeId and object left out. The result is checked with
// NormalizeIsolatedRestoreProgress; a summary that is not readable or breaks its rules is an
// *InvalidError.
func ProjectIsolatedRestoreProgress(nodeID string, summary []byte) (json.RawMessage, IsolatedRestoreProgress, error) {
	members, err := ReadObject(summary)
	if err != nil || !hasExactKeys(members, summaryKeys...) {
		return nil, IsolatedRestoreProgress{}, &InvalidError{[]string{"Corestore's staging summary must use its exact schema"}}
	}
	out := make([]byte, 0, len(summary)+len(nodeID)+16)
	out = append(out, `{"nodeId":`...)
	out = AppendString(out, nodeID)
	for _, mem := range members {
		if mem.Key == "nodeId" || mem.Key == "object" {
			continue
		}
		out = append(out, ',')
		out = AppendString(out, mem.Key)
		out = append(out, ':')
		out = append(out, mem.Value...)
	}
	out = append(out, '}')
	p, err := NormalizeIsolatedRestoreProgress(out)
	if err != nil {
		return nil, IsolatedRestoreProgress{}, err
	}
	return out, p, nil
}
