package contracts

import (
	"encoding/json"
	"strconv"

	"code.foss.global/serve.zone/relay/contracts/strictjson"
)

// Corestore platform agent (docs/platform.md). Seed-defined: the three relay →
// Cloudly methods and their key sets, IClusterPlatformBindingPlacement { nodeId, binding }, the
// backup media type and format, the 256 MiB Corestore closure limit. Project-defined (read
// tolerantly): the Corestore side (the /platform/… HTTP endpoints and their bodies) and
// pushCorestoreCredential.
//
// Every inner member — capabilities, providerConfigs, binding, descriptor — is opaque to the
// relay: kept as the raw bytes the peer sent (sub-slices, never re-encoded) and forwarded byte for
// byte.

// MethodPushCorestoreCredential is Cloudly → relay { nodeId, envelope } → {} (project-defined):
// a node's Corestore credential, sealed to the secret recipient the relay enrolled.
const MethodPushCorestoreCredential = "pushCorestoreCredential"

// Seed-defined: runtime.corestoreDatabaseBackupMediaType, the type a Corestore database backup
// archive is served and stored under, and runtime.corestoreDatabaseBackupFormat, the format a
// receipt states.
const (
	CorestoreDatabaseBackupMediaType = "application/vnd.serve-zone.corestore-database-backup"
	CorestoreDatabaseBackupFormat    = "corestore.database.backup"
)

// MaxCorestoreClosureBytes is the seed's Corestore closure limit, 256 MiB: a closure longer than
// this is aborted and refused relay-request-invalid to the side that sent it.
const MaxCorestoreClosureBytes = 256 << 20

// Corestore platform HTTP (project-defined, docs/platform.md). Paths are under the node's Corestore
// origin; <id> is a backupId, path-escaped.
const (
	CorestoreDesiredStatePath = "/platform/desired-state"       // PUT { capabilities, providerConfigs, bindings }
	CorestoreReadyBackupsPath = "/platform/backups?state=ready" // GET { backups: [{ backupId, serviceId, descriptor }] }
	CorestoreBackupsPrefix    = "/platform/backups/"            // + <id>/closure (GET), <id>/delivered (POST)
	CorestoreWantedPath       = "/platform/restores?state=wanted"
	CorestoreRestoresPrefix   = "/platform/restores/" // + <id>/closure (PUT)
	// CorestoreDescriptorHeader carries a restore's descriptor: its JSON bytes in base64url
	// without padding.
	CorestoreDescriptorHeader = "Serve-Zone-Descriptor"
)

// MaxPlatformBindings bounds the bindings of one desired state, MaxCorestoreListEntries the
// entries of one Corestore listing the relay takes (project-defined).
const (
	MaxPlatformBindings     = 65536
	MaxCorestoreListEntries = 1024
)

// PlatformBindingPlacement is IClusterPlatformBindingPlacement { nodeId, binding }.
type PlatformBindingPlacement struct {
	NodeID  string
	Binding json.RawMessage // opaque, a sub-slice of the answer
}

// PlatformDesiredState is getClusterPlatformDesiredState's answer { capabilities,
// providerConfigs, bindings }.
type PlatformDesiredState struct {
	Capabilities    json.RawMessage // opaque
	ProviderConfigs json.RawMessage // opaque
	Bindings        []PlatformBindingPlacement
}

// ReadPlatformDesiredState reads getClusterPlatformDesiredState's answer exactly (seed-spelled):
// the three members and nothing else, bindings an array of placements each exactly { nodeId,
// binding }, nodeId by the node-id reader. capabilities, providerConfigs and binding are kept
// raw, checked as JSON values and nothing else. Reasons never quote a member.
func ReadPlatformDesiredState(raw []byte) (PlatformDesiredState, error) {
	const path = "platform desired state"
	var capabilities, providerConfigs, bindings []byte
	if strictjson.ReadExact(raw, strictjson.Req("capabilities", &capabilities), strictjson.Req("providerConfigs", &providerConfigs), strictjson.Req("bindings", &bindings)) != nil {
		return PlatformDesiredState{}, &InvalidError{[]string{path + " must use its exact schema { capabilities, providerConfigs, bindings }"}}
	}
	st := PlatformDesiredState{Capabilities: capabilities, ProviderConfigs: providerConfigs}
	elems, err := strictjson.ReadArray(bindings)
	if err != nil {
		return PlatformDesiredState{}, &InvalidError{[]string{path + " bindings must be an array"}}
	}
	if len(elems) > MaxPlatformBindings {
		return PlatformDesiredState{}, &InvalidError{[]string{path + " has " + strconv.Itoa(len(elems)) + " bindings, over the relay's limit of " + strconv.Itoa(MaxPlatformBindings)}}
	}
	st.Bindings = make([]PlatformBindingPlacement, 0, len(elems))
	for i, e := range elems {
		var node, binding []byte
		at := path + " bindings[" + strconv.Itoa(i) + "]"
		if strictjson.ReadExact(e, strictjson.Req("nodeId", &node), strictjson.Req("binding", &binding)) != nil {
			return PlatformDesiredState{}, &InvalidError{[]string{at + " must use its exact schema { nodeId, binding }"}}
		}
		id, err := strictjson.ReadString(node)
		if err != nil || !IsClusterNodeID(id) {
			return PlatformDesiredState{}, &InvalidError{[]string{at + " nodeId must be a cluster node id"}}
		}
		st.Bindings = append(st.Bindings, PlatformBindingPlacement{NodeID: id, Binding: binding})
	}
	return st, nil
}

// SplitByNode is each node's Corestore desired-state body: { capabilities, providerConfigs,
// bindings: [binding, …] } with that node's bindings in the order Cloudly listed them, every
// member the bytes Cloudly sent. nodes names the nodes to build a body for (those with a
// Corestore); a node without a binding gets an empty bindings list, so that a Corestore whose
// last binding went away hears so.
func (s PlatformDesiredState) SplitByNode(nodes []string) map[string][]byte {
	by := make(map[string][]json.RawMessage, len(nodes))
	for _, n := range nodes {
		by[n] = nil
	}
	for _, b := range s.Bindings {
		if list, ok := by[b.NodeID]; ok {
			by[b.NodeID] = append(list, b.Binding)
		}
	}
	out := make(map[string][]byte, len(by))
	for n, list := range by {
		out[n] = s.appendCorestoreBody(nil, list)
	}
	return out
}

func (s PlatformDesiredState) appendCorestoreBody(b []byte, bindings []json.RawMessage) []byte {
	b = append(b, `{"capabilities":`...)
	b = append(b, s.Capabilities...)
	b = append(b, `,"providerConfigs":`...)
	b = append(b, s.ProviderConfigs...)
	b = append(b, `,"bindings":[`...)
	for i, x := range bindings {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, x...)
	}
	return append(b, "]}"...)
}

// BackupClosureRequest is backupServiceDatabaseClosure's request { backupId, serviceId, nodeId,
// descriptor, closure } (seed-spelled): closure is the VirtualStream marker of StreamID.
type BackupClosureRequest struct {
	BackupID, ServiceID, NodeID string
	Descriptor                  json.RawMessage // opaque: Corestore's, forwarded byte for byte
	StreamID                    string
}

// Encode is the request body, exactly the seed's five members.
func (r BackupClosureRequest) Encode() []byte {
	b := strictjson.AppendString([]byte(`{"backupId":`), r.BackupID)
	b = strictjson.AppendString(append(b, `,"serviceId":`...), r.ServiceID)
	b = strictjson.AppendString(append(b, `,"nodeId":`...), r.NodeID)
	b = append(append(b, `,"descriptor":`...), r.Descriptor...)
	b = AppendStreamMarker(append(b, `,"closure":`...), r.StreamID)
	return append(b, '}')
}

// ReadBackupClosureResponse reads backupServiceDatabaseClosure's answer { accepted } exactly.
func ReadBackupClosureResponse(raw []byte) (accepted bool, err error) {
	var v []byte
	if strictjson.ReadExact(raw, strictjson.Req("accepted", &v)) != nil {
		return false, &InvalidError{[]string{"backup closure answer must use its exact schema { accepted }"}}
	}
	accepted, ok := strictjson.ReadBool(v)
	if !ok {
		return false, &InvalidError{[]string{"backup closure answer accepted must be a boolean"}}
	}
	return accepted, nil
}

// EncodeRestoreClosureRequest is restoreServiceDatabaseClosure's request { backupId, serviceId,
// nodeId } (seed-spelled).
func EncodeRestoreClosureRequest(backupID, serviceID, nodeID string) []byte {
	b := strictjson.AppendString([]byte(`{"backupId":`), backupID)
	b = strictjson.AppendString(append(b, `,"serviceId":`...), serviceID)
	b = strictjson.AppendString(append(b, `,"nodeId":`...), nodeID)
	return append(b, '}')
}

// RestoreClosureResponse is restoreServiceDatabaseClosure's answer { descriptor, closure }.
type RestoreClosureResponse struct {
	Descriptor json.RawMessage // opaque, a sub-slice of the answer
	StreamID   string          // the closure's VirtualStream
}

// ReadRestoreClosureResponse reads the answer exactly (seed-spelled): descriptor kept raw, closure
// a VirtualStream marker (the library's object; its other members ignored, as every marker's).
func ReadRestoreClosureResponse(raw []byte) (RestoreClosureResponse, error) {
	var descriptor, closure []byte
	if strictjson.ReadExact(raw, strictjson.Req("descriptor", &descriptor), strictjson.Req("closure", &closure)) != nil {
		return RestoreClosureResponse{}, &InvalidError{[]string{"restore closure answer must use its exact schema { descriptor, closure }"}}
	}
	r := RestoreClosureResponse{Descriptor: descriptor}
	id, ok := ReadStreamMarker(closure)
	if !ok {
		return RestoreClosureResponse{}, &InvalidError{[]string{"restore closure answer closure must be a VirtualStream"}}
	}
	r.StreamID = id
	return r, nil
}

// AppendStreamMarker appends the library's stream marker { "_isVirtualStream": true, "streamId" }.
func AppendStreamMarker(b []byte, streamID string) []byte {
	b = strictjson.AppendString(append(b, `{"_isVirtualStream":true,"streamId":`...), streamID)
	return append(b, '}')
}

// ReadStreamMarker reads raw as one stream marker: an object whose _isVirtualStream is true and
// whose streamId is a string of 1 to MaxStreamIDLen bytes; other members are ignored.
func ReadStreamMarker(raw []byte) (string, bool) {
	var marked, id []byte
	if strictjson.ReadTolerant(raw, strictjson.Req("_isVirtualStream", &marked), strictjson.Req("streamId", &id)) != nil {
		return "", false
	}
	if v, ok := strictjson.ReadBool(marked); !ok || !v {
		return "", false
	}
	s, err := strictjson.ReadString(id)
	if err != nil || s == "" || len(s) > MaxStreamIDLen {
		return "", false
	}
	return s, true
}

// CorestoreBackup is one entry of Corestore's ready-backup listing.
type CorestoreBackup struct {
	BackupID, ServiceID string
	Descriptor          json.RawMessage // opaque, copied out of the listing
}

// CorestoreRestore is one entry of Corestore's wanted-restore listing.
type CorestoreRestore struct {
	BackupID, ServiceID string
}

// ReadCorestoreBackups reads GET /platform/backups?state=ready (project-defined, tolerant):
// { backups: [{ backupId, serviceId, descriptor }] }, other members ignored at every level. An
// entry the relay cannot carry (an id outside the canonical vocabulary, no descriptor) is skipped
// and counted in skipped, never a reason to refuse the others; at most MaxCorestoreListEntries are
// taken.
func ReadCorestoreBackups(raw []byte) (backups []CorestoreBackup, skipped int, err error) {
	elems, err := readCorestoreList(raw, "backups")
	if err != nil {
		return nil, 0, err
	}
	for _, e := range elems {
		var id, service, descriptor []byte
		if strictjson.ReadTolerant(e, strictjson.Req("backupId", &id), strictjson.Req("serviceId", &service), strictjson.Req("descriptor", &descriptor)) != nil {
			skipped++
			continue
		}
		b, ok := readCorestoreIDs(id, service)
		if !ok {
			skipped++
			continue
		}
		backups = append(backups, CorestoreBackup{BackupID: b.BackupID, ServiceID: b.ServiceID,
			Descriptor: append(json.RawMessage(nil), descriptor...)})
	}
	return backups, skipped, nil
}

// ReadCorestoreRestores reads GET /platform/restores?state=wanted (project-defined, tolerant):
// { restores: [{ backupId, serviceId }] }, with ReadCorestoreBackups' rules.
func ReadCorestoreRestores(raw []byte) (restores []CorestoreRestore, skipped int, err error) {
	elems, err := readCorestoreList(raw, "restores")
	if err != nil {
		return nil, 0, err
	}
	for _, e := range elems {
		var id, service []byte
		if strictjson.ReadTolerant(e, strictjson.Req("backupId", &id), strictjson.Req("serviceId", &service)) != nil {
			skipped++
			continue
		}
		r, ok := readCorestoreIDs(id, service)
		if !ok {
			skipped++
			continue
		}
		restores = append(restores, r)
	}
	return restores, skipped, nil
}

func readCorestoreList(raw []byte, key string) ([]json.RawMessage, error) {
	var list []byte
	if strictjson.ReadTolerant(raw, strictjson.Req(key, &list)) != nil {
		return nil, &InvalidError{[]string{"Corestore's listing must be an object carrying " + key}}
	}
	elems, err := strictjson.ReadArray(list)
	if err != nil {
		return nil, &InvalidError{[]string{"Corestore's listing " + key + " must be an array"}}
	}
	return elems[:min(len(elems), MaxCorestoreListEntries)], nil
}

// readCorestoreIDs reads a backupId and serviceId in the canonical identifier vocabulary: what
// Cloudly's exact validator reads them with, and safe in a URL path.
func readCorestoreIDs(id, service []byte) (CorestoreRestore, bool) {
	b, err1 := strictjson.ReadString(id)
	s, err2 := strictjson.ReadString(service)
	if err1 != nil || err2 != nil || !IsCanonicalID(b) || !IsCanonicalID(s) {
		return CorestoreRestore{}, false
	}
	return CorestoreRestore{BackupID: b, ServiceID: s}, true
}
