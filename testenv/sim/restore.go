package sim

import (
	"context"
	"crypto"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"time"

	"code.foss.global/serve.zone/relay/contracts"
	"code.foss.global/serve.zone/relay/contracts/strictjson"
)

// The Cloudly side of an isolated restore: the grant authority and a driver that runs a whole
// restore through the relay with the five node-control methods (docs/protocol.md#isolated-restore-and-corestore).
//
// The seeds say the grant is a compact RS256 grant naming one operation, expiring within minutes,
// binding the cluster, the node name, the resource mappings and the archive manifest; they do not
// spell its claims. The simulator's claims are GrantClaims. Only Cloudly (here RestoreAuthority)
// mints grants and only Corestore reads them; the relay forwards them inside the control.

// GrantObject is one manifest object: the immutable descriptor chunks are checked against.
type GrantObject struct {
	Key    string `json:"key"`
	Size   int64  `json:"size"`
	Sha256 string `json:"sha256"` // lowercase hex SHA-256 of the whole object
}

// GrantClaims are the simulator's grant claims.
type GrantClaims struct {
	Op             string        `json:"op"` // prepare, write-object, status, execute, cleanup
	ClusterID      string        `json:"clusterId"`
	TargetNodeName string        `json:"targetNodeName"`
	RestoreID      string        `json:"restoreId"`
	Manifest       []GrantObject `json:"manifest"`
	Mappings       []string      `json:"mappings"`
	ExpiresAt      int64         `json:"exp"` // Unix seconds
}

// RestoreAuthority mints isolated-restore grants, as Cloudly does.
type RestoreAuthority struct {
	ClusterID string        // default "cluster-sim"
	TTL       time.Duration // grant lifetime (default 5 minutes)
	// RecordGrants keeps every grant minted, for Minted: tests look for them in logs. Set it
	// before the first grant.
	RecordGrants bool

	key *rsa.PrivateKey // set at construction

	mu     sync.Mutex
	minted []string // guarded by mu: every grant minted while RecordGrants
}

// NewRestoreAuthority generates the authority's RSA key.
func NewRestoreAuthority() (*RestoreAuthority, error) {
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return nil, err
	}
	return &RestoreAuthority{ClusterID: "cluster-sim", TTL: 5 * time.Minute, key: key}, nil
}

// PublicKey is what Corestores verify grants with.
func (a *RestoreAuthority) PublicKey() *rsa.PublicKey { return &a.key.PublicKey }

// Minted returns every grant minted so far; nil unless RecordGrants.
func (a *RestoreAuthority) Minted() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]string(nil), a.minted...)
}

var grantHeader = base64.RawURLEncoding.EncodeToString([]byte(`{"alg":"RS256","typ":"JWT"}`))

// Grant mints a grant for one operation of plan.
func (a *RestoreAuthority) Grant(op string, p *RestorePlan) string {
	claims, _ := json.Marshal(GrantClaims{
		Op: op, ClusterID: a.ClusterID, TargetNodeName: p.NodeName, RestoreID: p.RestoreID,
		Manifest: p.Manifest(), Mappings: p.Mappings, ExpiresAt: time.Now().Add(a.TTL).Unix(),
	})
	signingInput := grantHeader + "." + base64.RawURLEncoding.EncodeToString(claims)
	digest := sha256.Sum256([]byte(signingInput))
	sig, err := rsa.SignPKCS1v15(rand.Reader, a.key, crypto.SHA256, digest[:])
	if err != nil {
		panic(err) // an RSA key of our own making cannot fail to sign
	}
	g := signingInput + "." + base64.RawURLEncoding.EncodeToString(sig)
	if a.RecordGrants {
		a.mu.Lock()
		a.minted = append(a.minted, g)
		a.mu.Unlock()
	}
	return g
}

// verifyGrant checks a grant's signature, operation, cluster, node name and expiry. Refusals name
// what failed and never quote the grant.
func (c *Corestore) verifyGrant(g, op string) (*GrantClaims, *corestoreError) {
	parts := strings.Split(g, ".")
	if len(parts) != 3 || parts[0] != grantHeader {
		return nil, refuse(http.StatusUnauthorized, "grant-refused: the grant is not a compact RS256 grant")
	}
	sig, err := base64.RawURLEncoding.DecodeString(parts[2])
	digest := sha256.Sum256([]byte(parts[0] + "." + parts[1]))
	if err != nil || c.opts.Authority == nil || rsa.VerifyPKCS1v15(c.opts.Authority, crypto.SHA256, digest[:], sig) != nil {
		return nil, refuse(http.StatusUnauthorized, "grant-refused: the grant's signature does not verify")
	}
	payload, err := base64.RawURLEncoding.DecodeString(parts[1])
	var claims GrantClaims
	if err != nil || json.Unmarshal(payload, &claims) != nil {
		return nil, refuse(http.StatusUnauthorized, "grant-refused: the grant's claims are unreadable")
	}
	switch {
	case claims.Op != op:
		return nil, refuse(http.StatusForbidden, "grant-refused: the grant names operation %s, not %s", claims.Op, op)
	case claims.ClusterID != c.opts.ClusterID:
		return nil, refuse(http.StatusForbidden, "grant-refused: the grant binds another cluster")
	case claims.TargetNodeName != c.opts.NodeName:
		return nil, refuse(http.StatusForbidden, "grant-refused: the grant binds another node")
	case claims.ExpiresAt <= c.opts.Now().Unix():
		return nil, refuse(http.StatusUnauthorized, "grant-refused: the grant has expired")
	case !contracts.IsCanonicalID(claims.RestoreID):
		return nil, refuse(http.StatusForbidden, "grant-refused: the grant names no restore")
	}
	return &claims, nil
}

// RestoreObject is one archive object of a plan.
type RestoreObject struct {
	Key  string
	Data []byte
}

// RestorePlan is one restore as Cloudly knows it.
type RestorePlan struct {
	RestoreID  string
	NodeID     string // the cluster node id Cloudly routes on
	NodeName   string // the node name the grant binds and Corestore verifies
	Objects    []RestoreObject
	Mappings   []string
	ChunkBytes int // default the contract limit, 512 KiB
}

func (p *RestorePlan) chunkBytes() int {
	if p.ChunkBytes > 0 {
		return p.ChunkBytes
	}
	return int(contracts.IsolatedRestoreContractLimits().MaximumChunkBytes)
}

// Manifest is the plan's manifest: one descriptor per object.
func (p *RestorePlan) Manifest() []GrantObject {
	out := make([]GrantObject, len(p.Objects))
	for i, o := range p.Objects {
		sum := sha256.Sum256(o.Data)
		out[i] = GrantObject{Key: o.Key, Size: int64(len(o.Data)), Sha256: hex.EncodeToString(sum[:])}
	}
	return out
}

// Chunks is how many chunks object i is staged in (an empty object is one empty chunk).
func (p *RestorePlan) Chunks(i int) int {
	n := (len(p.Objects[i].Data) + p.chunkBytes() - 1) / p.chunkBytes()
	return max(n, 1)
}

func control(fields ...any) json.RawMessage {
	b := []byte{'{'}
	for i := 0; i < len(fields); i += 2 {
		if i > 0 {
			b = append(b, ',')
		}
		v, _ := json.Marshal(fields[i+1])
		b = append(strictjson.AppendString(b, fields[i].(string)), ':')
		b = append(b, v...)
	}
	return append(b, '}')
}

// PrepareControl is the prepare control, expectedRevision 0.
func (a *RestoreAuthority) PrepareControl(p *RestorePlan) json.RawMessage {
	return control("grant", a.Grant("prepare", p), "expectedRevision", 0)
}

// WriteControl is the write control for chunk c of object i.
func (a *RestoreAuthority) WriteControl(p *RestorePlan, i, c int, expectedRevision int64) json.RawMessage {
	o := p.Objects[i]
	from := min(c*p.chunkBytes(), len(o.Data))
	to := min(from+p.chunkBytes(), len(o.Data))
	data := o.Data[from:to]
	sum := sha256.Sum256(data)
	return control("grant", a.Grant("write-object", p), "expectedRevision", expectedRevision,
		"object", p.Manifest()[i],
		"chunk", map[string]any{"index": c, "offset": from, "chunkSha256": hex.EncodeToString(sum[:]),
			"data": base64.StdEncoding.EncodeToString(data)})
}

// StatusControl is the status control.
func (a *RestoreAuthority) StatusControl(p *RestorePlan) json.RawMessage {
	return control("grant", a.Grant("status", p))
}

// ExecuteControl is the execute control.
func (a *RestoreAuthority) ExecuteControl(p *RestorePlan, expectedRevision int64) json.RawMessage {
	return control("grant", a.Grant("execute", p), "expectedRevision", expectedRevision)
}

// CleanupControl is the cleanup control.
func (a *RestoreAuthority) CleanupControl(p *RestorePlan, expectedRevision int64) json.RawMessage {
	return control("grant", a.Grant("cleanup", p), "expectedRevision", expectedRevision)
}

// NodeControlRequest is the { nodeId, control } request of the five methods.
func NodeControlRequest(nodeID string, control json.RawMessage) json.RawMessage {
	b := strictjson.AppendString([]byte(`{"nodeId":`), nodeID)
	b = append(b, `,"control":`...)
	b = append(b, control...)
	return append(b, '}')
}

// CallFunc calls the relay as Cloudly: Cloudly.Call.
type CallFunc func(ctx context.Context, method string, body json.RawMessage) (json.RawMessage, error)

// ReadProgressAnswer reads { progress }, normalizes the progress and binds it to the plan's node
// and restore, as Cloudly does.
func ReadProgressAnswer(answer json.RawMessage, p *RestorePlan) (contracts.IsolatedRestoreProgress, error) {
	var raw []byte
	if strictjson.ReadExact(answer, strictjson.Req("progress", &raw)) != nil {
		return contracts.IsolatedRestoreProgress{}, errors.New("answer must be { progress }")
	}
	progress, err := contracts.NormalizeIsolatedRestoreProgress(raw)
	if err != nil {
		return contracts.IsolatedRestoreProgress{}, err
	}
	return contracts.BindIsolatedRestoreProgressToNode(progress, contracts.IsolatedRestoreBinding{NodeID: p.NodeID, RestoreID: p.RestoreID})
}

// RestoreRun is what a driven restore observed.
type RestoreRun struct {
	Chunks   int                               // chunks staged
	Polls    int                               // progress reads while executing
	Executed contracts.IsolatedRestoreProgress // the progress that said executed
	Final    contracts.IsolatedRestoreProgress // the answer to cleanup
}

// RunIsolatedRestore drives a whole restore through the relay: prepare with expectedRevision 0,
// stage every chunk of every object (each mutation carrying the revision the node last stated),
// execute, read progress until executed, and clean up. Every answer is normalized and bound to
// the plan's node and restore.
func RunIsolatedRestore(ctx context.Context, call CallFunc, a *RestoreAuthority, p *RestorePlan) (RestoreRun, error) {
	var run RestoreRun
	step := func(method string, control json.RawMessage) (contracts.IsolatedRestoreProgress, error) {
		answer, err := call(ctx, method, NodeControlRequest(p.NodeID, control))
		if err != nil {
			return contracts.IsolatedRestoreProgress{}, fmt.Errorf("%s: %w", method, err)
		}
		progress, err := ReadProgressAnswer(answer, p)
		if err != nil {
			return contracts.IsolatedRestoreProgress{}, fmt.Errorf("%s answer: %w", method, err)
		}
		return progress, nil
	}
	progress, err := step(contracts.MethodPrepareIsolatedRestoreOnNode, a.PrepareControl(p))
	if err != nil {
		return run, err
	}
	for i := range p.Objects {
		for c := 0; c < p.Chunks(i); c++ {
			if progress, err = step(contracts.MethodStageIsolatedRestoreArchive, a.WriteControl(p, i, c, progress.Revision)); err != nil {
				return run, err
			}
			run.Chunks++
		}
	}
	if progress, err = step(contracts.MethodExecuteIsolatedRestoreOnNode, a.ExecuteControl(p, progress.Revision)); err != nil {
		return run, err
	}
	for progress.Status == contracts.IsolatedRestoreExecuting {
		select {
		case <-ctx.Done():
			return run, ctx.Err()
		case <-time.After(10 * time.Millisecond):
		}
		if progress, err = step(contracts.MethodGetIsolatedRestoreProgressOnNode, a.StatusControl(p)); err != nil {
			return run, err
		}
		run.Polls++
	}
	if progress.Status != contracts.IsolatedRestoreExecuted {
		return run, fmt.Errorf("restore %s ended %s, not executed", p.RestoreID, progress.Status)
	}
	run.Executed = progress
	if progress, err = step(contracts.MethodCleanupIsolatedRestoreOnNode, a.CleanupControl(p, progress.Revision)); err != nil {
		return run, err
	}
	run.Final = progress
	return run, nil
}
