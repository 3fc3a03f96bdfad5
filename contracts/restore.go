package contracts

import (
	"encoding/json"
	"strconv"

	"code.foss.global/serve.zone/relay/contracts/strictjson"
)

// Isolated restore (seed-defined methods and progress, project-defined Corestore HTTP; docs/protocol.md#isolated-restore-and-corestore,
// docs/protocol.md#isolated-restore-and-corestore).
//
// Cloudly drives a restore on one node with five methods of one shape, { nodeId, control } →
// { progress }. control is the body the node's Corestore itself reads, a bearer grant inside: the
// relay routes on nodeId and forwards control byte for byte without parsing it (the seeds do not
// spell it; Corestore enforces isolatedRestoreContractLimits), refusing it only by its size
// (MaxIsolatedRestoreControlBytes). Corestore answers with its staging summary; the relay returns
// progress = summary + { nodeId } (ProjectIsolatedRestoreProgress), nodeId being the node it
// carried the control to, after NormalizeIsolatedRestoreProgress.

// Corestore operations: POST <corestore origin>/isolated-restore/<op> with the control bytes as
// the body (project-defined, docs/protocol.md#isolated-restore-and-corestore).
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
	return append(strictjson.AppendString([]byte(`{"reason":`), reason), '}')
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

// MaxIsolatedRestoreControlBytes bounds a control (project-defined, docs/protocol.md#isolated-restore-and-corestore): a write control
// carrying a 512 KiB chunk in base64 with its descriptor and grant stays well below it.
const MaxIsolatedRestoreControlBytes = 1 << 20

// ReadIsolatedRestoreNodeControl reads { nodeId, control } (seed-spelled, exact keys): nodeId by
// the node-id reader, control kept raw and not parsed — it is Corestore's to read — but refused
// beyond MaxIsolatedRestoreControlBytes. Reasons never quote the control.
func ReadIsolatedRestoreNodeControl(raw []byte) (IsolatedRestoreNodeControl, error) {
	const path = "isolated restore request"
	var nodeID, control []byte
	if strictjson.ReadExact(raw, strictjson.Req("nodeId", &nodeID), strictjson.Req("control", &control)) != nil {
		return IsolatedRestoreNodeControl{}, &InvalidError{[]string{path + " must use its exact schema { nodeId, control }"}}
	}
	var req IsolatedRestoreNodeControl
	var reasons []string
	if s, err := strictjson.ReadString(nodeID); err != nil || !IsClusterNodeID(s) {
		reasons = append(reasons, path+" nodeId must be a cluster node id")
	} else {
		req.NodeID = s
	}
	if len(control) > MaxIsolatedRestoreControlBytes {
		reasons = append(reasons, path+" control is "+strconv.Itoa(len(control))+" bytes, over the relay's limit of "+
			strconv.Itoa(MaxIsolatedRestoreControlBytes))
	} else {
		req.Control = control
	}
	if len(reasons) > 0 {
		return IsolatedRestoreNodeControl{}, &InvalidError{reasons}
	}
	return req, nil
}

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

// progressKeys are IIsolatedRestoreProgress's keys in the seed's order, the optional ones last.
var progressKeys = [...]string{"nodeId", "restoreId", "stagingArchiveId", "status", "revision", "lastFence",
	"expectedObjects", "receivedObjects", "completedMappings", "totalMappings", "preparedAt", "updatedAt",
	"executedAt", "stagedObject"}

// isProgressKey reports whether key is one of progressKeys.
func isProgressKey(key string) bool {
	for _, k := range progressKeys {
		if k == key {
			return true
		}
	}
	return false
}

// NormalizeIsolatedRestoreProgress is data.normalizeIsolatedRestoreProgress: it reads a progress
// exactly (exact keys, plain data) and refuses an unknown status, a count larger than the plan it
// belongs to, a revision or lastFence below 1, an executing or executed progress that does not
// hold the whole archive, and an executed progress that left a mapping behind or does not say when
// it finished. stagedObject, when present, must be an object and is kept opaque. The error is an
// *InvalidError with one reason per violation.
func NormalizeIsolatedRestoreProgress(raw []byte) (IsolatedRestoreProgress, error) {
	const path = "isolated restore progress"
	var nodeID, restoreID, archiveID, status, revision, lastFence, expected, received, completed, total,
		preparedAt, updatedAt, executedAt, stagedObject []byte
	if strictjson.ReadExact(raw, strictjson.Req("nodeId", &nodeID), strictjson.Req("restoreId", &restoreID), strictjson.Req("stagingArchiveId", &archiveID),
		strictjson.Req("status", &status), strictjson.Req("revision", &revision), strictjson.Req("lastFence", &lastFence),
		strictjson.Req("expectedObjects", &expected), strictjson.Req("receivedObjects", &received), strictjson.Req("completedMappings", &completed),
		strictjson.Req("totalMappings", &total), strictjson.Req("preparedAt", &preparedAt), strictjson.Req("updatedAt", &updatedAt),
		strictjson.Opt("executedAt", &executedAt), strictjson.Opt("stagedObject", &stagedObject)) != nil {
		return IsolatedRestoreProgress{}, &InvalidError{[]string{path + " must use its exact schema"}}
	}
	var p IsolatedRestoreProgress
	var reasons []string
	fail := func(reason string) { reasons = append(reasons, path+" "+reason) }
	if s, err := strictjson.ReadString(nodeID); err != nil || !IsClusterNodeID(s) {
		fail("nodeId must be a cluster node id")
	} else {
		p.NodeID = s
	}
	for _, f := range []struct {
		key string
		raw []byte
		dst *string
	}{{"restoreId", restoreID, &p.RestoreID}, {"stagingArchiveId", archiveID, &p.StagingArchiveID}} {
		if s, err := strictjson.ReadString(f.raw); err != nil || !IsCanonicalID(s) {
			fail(f.key + " must be a canonical identifier")
		} else {
			*f.dst = s
		}
	}
	if s, err := strictjson.ReadString(status); err != nil || !isIsolatedRestoreStatus(s) {
		fail("status must be one of prepared, executing, failed, executed, cleaned")
	} else {
		p.Status = s
	}
	counters := []struct {
		key      string
		raw      []byte
		dst      *int64
		min      int64
		minWords string
	}{
		{"revision", revision, &p.Revision, 1, "a safe integer of at least 1: a committed state carries it"},
		{"lastFence", lastFence, &p.LastFence, 1, "a safe integer of at least 1: a committed state carries it"},
		{"expectedObjects", expected, &p.ExpectedObjects, 0, "a non-negative safe integer"},
		{"receivedObjects", received, &p.ReceivedObjects, 0, "a non-negative safe integer"},
		{"completedMappings", completed, &p.CompletedMappings, 0, "a non-negative safe integer"},
		{"totalMappings", total, &p.TotalMappings, 0, "a non-negative safe integer"},
		{"preparedAt", preparedAt, &p.PreparedAt, 0, "a Unix millisecond timestamp"},
		{"updatedAt", updatedAt, &p.UpdatedAt, 0, "a Unix millisecond timestamp"},
	}
	bad := map[string]bool{}
	for _, c := range counters {
		if n, ok := strictjson.ReadCounter(c.raw); !ok || n < c.min {
			fail(c.key + " must be " + c.minWords)
			bad[c.key] = true
		} else {
			*c.dst = n
		}
	}
	if executedAt != nil {
		if n, ok := strictjson.ReadCounter(executedAt); !ok {
			fail("executedAt must be a Unix millisecond timestamp")
		} else {
			p.ExecutedAt = &n
		}
	}
	if stagedObject != nil {
		if strictjson.KindOf(stagedObject) != strictjson.KindObject {
			fail("stagedObject must be an object")
		} else {
			p.StagedObject = stagedObject
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
		if executedAt == nil {
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
	dst = strictjson.AppendString(dst, p.NodeID)
	dst = append(dst, `,"restoreId":`...)
	dst = strictjson.AppendString(dst, p.RestoreID)
	dst = append(dst, `,"stagingArchiveId":`...)
	dst = strictjson.AppendString(dst, p.StagingArchiveID)
	dst = append(dst, `,"status":`...)
	dst = strictjson.AppendString(dst, p.Status)
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

// ProjectIsolatedRestoreProgress builds progress = Corestore's summary + { nodeId }. The summary
// is project-defined, so it is read tolerantly: nodeId first, then the summary's members
// that are progress members (every key of IIsolatedRestoreProgress but nodeId), in Corestore's
// order, each value byte for byte (stagedObject stays opaque). Every other member — Corestore's
// own nodeId (the relay states the node it carried the control to), its object receipt (not
// projected, as the seed says) and any member this relay does not know — is left out. The
// result is checked exactly with NormalizeIsolatedRestoreProgress; a summary that is not an
// object, repeats a key, or breaks a progress rule is an *InvalidError.
func ProjectIsolatedRestoreProgress(nodeID string, summary []byte) (json.RawMessage, IsolatedRestoreProgress, error) {
	members, err := strictjson.ReadObject(summary)
	if err != nil {
		return nil, IsolatedRestoreProgress{}, &InvalidError{[]string{"Corestore's staging summary must be an object without repeated keys"}}
	}
	out := make([]byte, 0, len(summary)+len(nodeID)+16)
	out = append(out, `{"nodeId":`...)
	out = strictjson.AppendString(out, nodeID)
	for _, mem := range members {
		if mem.Key == "nodeId" || !isProgressKey(mem.Key) {
			continue
		}
		out = append(out, ',')
		out = strictjson.AppendString(out, mem.Key)
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
