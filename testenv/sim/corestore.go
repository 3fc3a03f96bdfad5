package sim

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"log"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"sync"
	"time"

	"github.com/rs/zerolog"

	"code.foss.global/serve.zone/relay/contracts"
	"code.foss.global/serve.zone/relay/contracts/strictjson"
)

// Corestore is a node Corestore stand-in: the project-defined isolated-restore HTTP API
// (POST /isolated-restore/{prepare,write,status,execute,cleanup}, contracts/restore.go) over HTTPS
// on loopback (plain HTTP when Plaintext), with real staging state: it verifies every grant's
// RS256 signature, operation, cluster, node name and expiry; keeps revisions and fences; accepts
// chunks in order, each checked against its chunkSha256 and the object descriptor; settles a
// replayed chunk instead of failing it; and executes only a whole archive.
//
// A test that compares bytes asks it to keep a copy of every control it receives
// (RecordControls, read with Received); that copy holds grants and lives in memory only. It keeps
// the staging of the 16 restores updated last and forgets older ones, as a Corestore expires
// abandoned staging. It logs operations and outcomes, never a control.
type Corestore struct {
	opts CorestoreOptions // set at construction
	srv  *httptest.Server // set at construction
	log  zerolog.Logger   // set at construction
	// platform is the platform side (platformcorestore.go); set at construction.
	platform *PlatformCorestore

	mu       sync.Mutex
	restores map[string]*staging                 // guarded by mu: by restoreId, at most maxStagings
	received []CorestoreRequest                  // guarded by mu: every control, when RecordControls
	tamper   func(op string, body []byte) []byte // guarded by mu
	delay    time.Duration                       // guarded by mu
	gate     chan struct{}                       // guarded by mu: handlers wait while it is open
	refusals []*corestoreError                   // guarded by mu: answers for the next requests
}

// CorestoreOptions configure a Corestore stand-in.
type CorestoreOptions struct {
	ClusterID    string         // the cluster grants must bind (default "cluster-sim")
	NodeName     string         // the node name grants must bind (targetNodeName)
	Authority    *rsa.PublicKey // verifies grants
	Plaintext    bool           // serve http:// instead of https://
	ExecuteDelay time.Duration  // how long an execute stays executing before it is executed
	Log          zerolog.Logger
	Now          func() time.Time // default time.Now

	// RecordControls keeps a copy of every control received, for Received. Off, nothing of a
	// control outlives its request.
	RecordControls bool
	// ReceiveBuffer is the receive buffer of each connection it accepts, in bytes (0: the
	// system's, which grows to megabytes): a small one holds a relay's writes back soon once the
	// stand-in stops reading a body.
	ReceiveBuffer int
}

// CorestoreRequest is one control the stand-in received.
type CorestoreRequest struct {
	Op   string
	Body []byte
}

// staging is one restore's staging state.
type staging struct {
	restoreID, archiveID  string
	status                string
	revision, fence       int64
	manifest              []GrantObject
	mappings              []string
	completed, received   int64
	objects               map[string]*stagedObject
	preparedAt, updatedAt int64
	executedAt            *int64
	executeStarted        time.Time
}

type stagedObject struct {
	data      []byte
	chunkSums []string // by index
	complete  bool
}

// NewCorestore starts a Corestore stand-in on a loopback port.
func NewCorestore(opts CorestoreOptions) *Corestore {
	if opts.ClusterID == "" {
		opts.ClusterID = "cluster-sim"
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	c := &Corestore{opts: opts, restores: make(map[string]*staging), platform: newPlatformCorestore(),
		log: opts.Log.With().Str("component", "sim-corestore").Str("node", opts.NodeName).Logger()}
	c.srv = httptest.NewUnstartedServer(http.HandlerFunc(c.serve))
	c.srv.Config.ErrorLog = log.New(io.Discard, "", 0)
	if opts.ReceiveBuffer > 0 {
		c.srv.Listener = receiveBufferListener{c.srv.Listener, opts.ReceiveBuffer}
	}
	if opts.Plaintext {
		c.srv.Start()
	} else {
		c.srv.TLS = &tls.Config{Certificates: []tls.Certificate{selfSigned()}}
		c.srv.StartTLS()
	}
	return c
}

// receiveBufferListener sets the receive buffer of each connection it accepts.
type receiveBufferListener struct {
	net.Listener
	bytes int
}

func (l receiveBufferListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if tc, ok := c.(*net.TCPConn); ok {
		tc.SetReadBuffer(l.bytes)
	}
	return c, err
}

// selfSigned makes a certificate of its own for each stand-in (httptest's built-in one is shared
// by every test server), valid for the loopback addresses and localhost, usable as its own CA.
func selfSigned() tls.Certificate {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		panic(err)
	}
	serial, _ := rand.Int(rand.Reader, big.NewInt(1<<62))
	tmpl := &x509.Certificate{
		SerialNumber: serial, Subject: pkix.Name{CommonName: "sim corestore"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback}, DNSNames: []string{"localhost"},
		KeyUsage:    x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, BasicConstraintsValid: true, IsCA: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		panic(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

// Origin is the stand-in's origin, https://127.0.0.1:<port> (http:// when Plaintext).
func (c *Corestore) Origin() string { return c.srv.URL }

// CertificatePEM is the stand-in's TLS certificate, to be trusted as a CA; nil when Plaintext.
func (c *Corestore) CertificatePEM() []byte {
	if c.opts.Plaintext {
		return nil
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.srv.Certificate().Raw})
}

// Close stops the stand-in. Call Release first if Block was used.
func (c *Corestore) Close() { c.srv.Close() }

// Received returns copies of the controls received, in order; nil unless RecordControls.
func (c *Corestore) Received() []CorestoreRequest {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]CorestoreRequest, len(c.received))
	for i, r := range c.received {
		out[i] = CorestoreRequest{r.Op, append([]byte(nil), r.Body...)}
	}
	return out
}

// SetTamper rewrites every 2xx answer body before it is sent (nil: none), to play a Corestore
// that answers outside the contract.
func (c *Corestore) SetTamper(f func(op string, body []byte) []byte) {
	c.mu.Lock()
	c.tamper = f
	c.mu.Unlock()
}

// SetDelay makes every answer wait d (or until the caller gives up).
func (c *Corestore) SetDelay(d time.Duration) {
	c.mu.Lock()
	c.delay = d
	c.mu.Unlock()
}

// RefuseNext answers the next request with status and reason instead of handling it, to play a
// Corestore that refuses in words of its own (one that echoes a grant, say).
func (c *Corestore) RefuseNext(status int, reason string) {
	c.mu.Lock()
	c.refusals = append(c.refusals, &corestoreError{status, reason})
	c.mu.Unlock()
}

// Block holds every request from now on until the returned release is called.
func (c *Corestore) Block() (release func()) {
	gate := make(chan struct{})
	c.mu.Lock()
	c.gate = gate
	c.mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			c.mu.Lock()
			c.gate = nil
			c.mu.Unlock()
			close(gate)
		})
	}
}

// StagedObject returns the bytes staged for key in restoreID, and whether the object is complete.
func (c *Corestore) StagedObject(restoreID, key string) ([]byte, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := c.restores[restoreID]
	if s == nil || s.objects[key] == nil {
		return nil, false
	}
	o := s.objects[key]
	return append([]byte(nil), o.data...), o.complete
}

// corestoreError is a refusal: an HTTP status and Corestore's reason.
type corestoreError struct {
	status int
	reason string
}

func refuse(status int, format string, args ...any) *corestoreError {
	return &corestoreError{status, fmt.Sprintf(format, args...)}
}

func (c *Corestore) serve(w http.ResponseWriter, r *http.Request) {
	if strings.HasPrefix(r.URL.Path, "/platform/") {
		c.servePlatform(w, r)
		return
	}
	op, ok := strings.CutPrefix(r.URL.Path, contracts.CorestoreIsolatedRestorePathPrefix)
	if r.Method != http.MethodPost || !ok {
		c.answer(w, "", nil, refuse(http.StatusNotFound, "not-found: no such isolated-restore operation"))
		return
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, 4<<20))
	if err != nil {
		return
	}
	c.mu.Lock()
	if c.opts.RecordControls {
		c.received = append(c.received, CorestoreRequest{op, body})
	}
	delay, gate := c.delay, c.gate
	var forced *corestoreError
	if len(c.refusals) > 0 {
		forced, c.refusals = c.refusals[0], c.refusals[1:]
	}
	c.mu.Unlock()
	if forced != nil {
		c.answer(w, op, nil, forced)
		return
	}
	if gate != nil {
		select {
		case <-gate:
		case <-r.Context().Done():
			return
		}
	}
	if delay > 0 {
		t := time.NewTimer(delay)
		select {
		case <-t.C:
		case <-r.Context().Done():
			t.Stop()
			return
		}
	}
	answer, cerr := c.handle(op, body)
	c.answer(w, op, answer, cerr)
}

func (c *Corestore) answer(w http.ResponseWriter, op string, body []byte, err *corestoreError) {
	w.Header().Set("Content-Type", "application/json")
	if err != nil {
		c.log.Debug().Str("op", op).Int("status", err.status).Str("outcome", "refused").Msg("isolated restore")
		w.WriteHeader(err.status)
		w.Write(contracts.CorestoreRefusalBody(err.reason))
		return
	}
	c.mu.Lock()
	tamper := c.tamper
	c.mu.Unlock()
	if tamper != nil {
		body = tamper(op, body)
	}
	c.log.Debug().Str("op", op).Int("bytes", len(body)).Str("outcome", "answered").Msg("isolated restore")
	w.Write(body)
}

// grantOps maps each Corestore operation to the operation its grant must name.
var grantOps = map[string]string{
	contracts.CorestoreOpPrepare: "prepare", contracts.CorestoreOpWrite: "write-object",
	contracts.CorestoreOpStatus: "status", contracts.CorestoreOpExecute: "execute", contracts.CorestoreOpCleanup: "cleanup",
}

// controlKeys are each control's exact keys: this project's guess at Corestore's controls
// (docs/decisions.md, "Control shapes"). The relay never reads them; Corestore does.
var controlKeys = map[string][]string{
	contracts.CorestoreOpPrepare: {"grant", "expectedRevision"},
	contracts.CorestoreOpWrite:   {"grant", "expectedRevision", "object", "chunk"},
	contracts.CorestoreOpStatus:  {"grant"},
	contracts.CorestoreOpExecute: {"grant", "expectedRevision"},
	contracts.CorestoreOpCleanup: {"grant", "expectedRevision"},
}

func (c *Corestore) handle(op string, body []byte) ([]byte, *corestoreError) {
	keys, ok := controlKeys[op]
	if !ok {
		return nil, refuse(http.StatusNotFound, "not-found: no such isolated-restore operation")
	}
	m, ok := readExactKeys(body, keys...)
	if !ok {
		return nil, refuse(http.StatusBadRequest, "control-invalid: the %s control must use its exact schema", op)
	}
	grantText, err := strictjson.ReadString(m["grant"])
	if err != nil {
		return nil, refuse(http.StatusUnauthorized, "grant-refused: the grant must be a string")
	}
	claims, gerr := c.verifyGrant(grantText, grantOps[op])
	if gerr != nil {
		return nil, gerr
	}
	expected := int64(-1)
	if raw, ok := m["expectedRevision"]; ok {
		n, ok := strictjson.ReadCounter(raw)
		if !ok {
			return nil, refuse(http.StatusBadRequest, "control-invalid: expectedRevision must be a non-negative safe integer")
		}
		expected = n
	}
	now := c.opts.Now().UnixMilli()
	c.mu.Lock()
	defer c.mu.Unlock()
	s := c.restores[claims.RestoreID]
	if op == contracts.CorestoreOpPrepare {
		return c.prepareLocked(s, claims, expected, now)
	}
	if s == nil {
		return nil, refuse(http.StatusNotFound, "restore-unknown: no staging for that restore on this node")
	}
	if !reflect.DeepEqual(s.manifest, claims.Manifest) || !reflect.DeepEqual(s.mappings, claims.Mappings) {
		return nil, refuse(http.StatusForbidden, "grant-refused: the grant binds another manifest or mappings")
	}
	c.settleExecutionLocked(s, now)
	switch op {
	case contracts.CorestoreOpWrite:
		return c.writeLocked(s, m, expected, now)
	case contracts.CorestoreOpStatus:
		return s.summary(nil, nil), nil
	case contracts.CorestoreOpExecute:
		return c.executeLocked(s, expected, now)
	default:
		return c.cleanupLocked(s, expected, now)
	}
}

func (c *Corestore) prepareLocked(s *staging, g *GrantClaims, expected, now int64) ([]byte, *corestoreError) {
	if s != nil {
		if reflect.DeepEqual(s.manifest, g.Manifest) && reflect.DeepEqual(s.mappings, g.Mappings) {
			return s.summary(nil, nil), nil // a replayed prepare settles
		}
		return nil, refuse(http.StatusConflict, "restore-exists: the restore was prepared with another manifest")
	}
	if expected != 0 {
		return nil, refuse(http.StatusConflict, "revision-conflict: a restore is prepared with expectedRevision 0")
	}
	if len(c.restores) >= maxStagings {
		c.forgetOldestLocked()
	}
	sum := sha256.Sum256([]byte(g.RestoreID))
	s = &staging{
		restoreID: g.RestoreID, archiveID: "staging-" + hex.EncodeToString(sum[:8]), status: contracts.IsolatedRestorePrepared,
		revision: 1, fence: 1, manifest: g.Manifest, mappings: g.Mappings, objects: make(map[string]*stagedObject),
		preparedAt: now, updatedAt: now,
	}
	c.restores[g.RestoreID] = s
	return s.summary(nil, nil), nil
}

// maxStagings is how many restores a Corestore stand-in keeps staging for.
const maxStagings = 16

// forgetOldestLocked drops the staging updated longest ago: a restore abandoned half way (its
// Cloudly went away) or cleaned up long since.
func (c *Corestore) forgetOldestLocked() {
	var oldest *staging
	for _, s := range c.restores {
		if oldest == nil || s.updatedAt < oldest.updatedAt {
			oldest = s
		}
	}
	delete(c.restores, oldest.restoreID)
}

func (c *Corestore) writeLocked(s *staging, m map[string][]byte, expected, now int64) ([]byte, *corestoreError) {
	var object struct {
		Key    string `json:"key"`
		Size   int64  `json:"size"`
		Sha256 string `json:"sha256"`
	}
	var chunk struct {
		Index       int64  `json:"index"`
		Offset      int64  `json:"offset"`
		ChunkSha256 string `json:"chunkSha256"`
		Data        string `json:"data"`
	}
	if strictDecode(m["object"], &object, "key", "size", "sha256") != nil ||
		strictDecode(m["chunk"], &chunk, "index", "offset", "chunkSha256", "data") != nil {
		return nil, refuse(http.StatusBadRequest, "control-invalid: the write control's object and chunk must use their exact schema")
	}
	var desc *GrantObject
	for i := range s.manifest {
		if s.manifest[i].Key == object.Key {
			desc = &s.manifest[i]
		}
	}
	switch {
	case desc == nil:
		return nil, refuse(http.StatusBadRequest, "object-unknown: the manifest has no object %q", object.Key)
	case desc.Size != object.Size || desc.Sha256 != object.Sha256:
		return nil, refuse(http.StatusBadRequest, "object-descriptor-mismatch: object %q is not the manifest's", object.Key)
	case s.status != contracts.IsolatedRestorePrepared:
		return nil, refuse(http.StatusConflict, "staging-closed: the restore is %s", s.status)
	}
	o := s.objects[object.Key]
	if o == nil {
		o = &stagedObject{}
		s.objects[object.Key] = o
	}
	if chunk.Index >= 0 && chunk.Index < int64(len(o.chunkSums)) && o.chunkSums[chunk.Index] == chunk.ChunkSha256 {
		return s.summary(o.position(object.Key), receipt(object.Key, chunk.Index, chunk.ChunkSha256)), nil // a replay settles
	}
	limits := contracts.IsolatedRestoreContractLimits()
	data, err := base64.StdEncoding.Strict().DecodeString(chunk.Data)
	sum := sha256.Sum256(data)
	switch {
	case expected != s.revision:
		return nil, refuse(http.StatusConflict, "revision-conflict: expected revision %d, the node states %d", expected, s.revision)
	case o.complete:
		return nil, refuse(http.StatusConflict, "object-complete: object %q is already staged", object.Key)
	case chunk.Index != int64(len(o.chunkSums)) || chunk.Offset != int64(len(o.data)):
		return nil, refuse(http.StatusConflict, "chunk-out-of-order: object %q continues at chunk %d, offset %d", object.Key, len(o.chunkSums), len(o.data))
	case err != nil:
		return nil, refuse(http.StatusBadRequest, "chunk-invalid: chunk data is not standard base64")
	case int64(len(data)) > limits.MaximumChunkBytes || chunk.Index >= limits.MaximumChunksPerObject:
		return nil, refuse(http.StatusRequestEntityTooLarge, "chunk-over-limit: the chunk breaks isolatedRestoreContractLimits")
	case hex.EncodeToString(sum[:]) != chunk.ChunkSha256:
		return nil, refuse(http.StatusBadRequest, "chunk-digest-mismatch: chunk %d of object %q does not match its chunkSha256", chunk.Index, object.Key)
	case chunk.Offset+int64(len(data)) > object.Size:
		return nil, refuse(http.StatusBadRequest, "chunk-beyond-object: chunk %d ends beyond object %q", chunk.Index, object.Key)
	}
	o.data = append(o.data, data...)
	o.chunkSums = append(o.chunkSums, chunk.ChunkSha256)
	s.revision++
	s.updatedAt = now
	if int64(len(o.data)) == object.Size {
		whole := sha256.Sum256(o.data)
		if hex.EncodeToString(whole[:]) != object.Sha256 {
			s.status = contracts.IsolatedRestoreFailed
			return nil, refuse(http.StatusUnprocessableEntity, "object-digest-mismatch: object %q does not match its descriptor", object.Key)
		}
		o.complete = true
		s.received++
		s.fence++
	}
	return s.summary(o.position(object.Key), receipt(object.Key, chunk.Index, chunk.ChunkSha256)), nil
}

func (c *Corestore) executeLocked(s *staging, expected, now int64) ([]byte, *corestoreError) {
	switch {
	case s.status == contracts.IsolatedRestoreExecuting || s.status == contracts.IsolatedRestoreExecuted:
		return s.summary(nil, nil), nil // a replayed execute settles
	case s.status != contracts.IsolatedRestorePrepared:
		return nil, refuse(http.StatusConflict, "restore-not-prepared: the restore is %s", s.status)
	case expected != s.revision:
		return nil, refuse(http.StatusConflict, "revision-conflict: expected revision %d, the node states %d", expected, s.revision)
	case s.received != int64(len(s.manifest)):
		return nil, refuse(http.StatusConflict, "archive-incomplete: %d of %d objects staged", s.received, len(s.manifest))
	}
	s.status = contracts.IsolatedRestoreExecuting
	s.revision++
	s.fence++
	s.updatedAt = now
	s.executeStarted = c.opts.Now()
	c.settleExecutionLocked(s, now)
	return s.summary(nil, nil), nil
}

// settleExecutionLocked finishes an execute once ExecuteDelay has passed since it began.
func (c *Corestore) settleExecutionLocked(s *staging, now int64) {
	if s.status != contracts.IsolatedRestoreExecuting || c.opts.Now().Sub(s.executeStarted) < c.opts.ExecuteDelay {
		return
	}
	s.status = contracts.IsolatedRestoreExecuted
	s.completed = int64(len(s.mappings))
	s.revision++
	s.updatedAt = now
	s.executedAt = &now
}

func (c *Corestore) cleanupLocked(s *staging, expected, now int64) ([]byte, *corestoreError) {
	switch {
	case s.status == contracts.IsolatedRestoreCleaned:
		return s.summary(nil, nil), nil // a replayed cleanup settles
	case s.status == contracts.IsolatedRestoreExecuting:
		return nil, refuse(http.StatusConflict, "restore-executing: the restore is still executing")
	case expected != s.revision:
		return nil, refuse(http.StatusConflict, "revision-conflict: expected revision %d, the node states %d", expected, s.revision)
	}
	s.status = contracts.IsolatedRestoreCleaned
	for _, o := range s.objects {
		o.data = nil
	}
	s.revision++
	s.fence++
	s.updatedAt = now
	return s.summary(nil, nil), nil
}

// position is the stagedObject of a write answer: where the object's next chunk continues.
func (o *stagedObject) position(key string) json.RawMessage {
	b, _ := json.Marshal(map[string]any{"key": key, "nextIndex": len(o.chunkSums), "nextOffset": len(o.data), "complete": o.complete})
	return b
}

// receipt is the object receipt of Corestore's own write answer, which the relay does not project.
func receipt(key string, index int64, chunkSha256 string) json.RawMessage {
	b, _ := json.Marshal(map[string]any{"key": key, "index": index, "chunkSha256": chunkSha256, "stored": true})
	return b
}

// summary is Corestore's staging summary (project-defined: the progress without nodeId).
func (s *staging) summary(stagedObject, object json.RawMessage) []byte {
	b, _ := json.Marshal(struct {
		RestoreID         string          `json:"restoreId"`
		StagingArchiveID  string          `json:"stagingArchiveId"`
		Status            string          `json:"status"`
		Revision          int64           `json:"revision"`
		LastFence         int64           `json:"lastFence"`
		ExpectedObjects   int             `json:"expectedObjects"`
		ReceivedObjects   int64           `json:"receivedObjects"`
		CompletedMappings int64           `json:"completedMappings"`
		TotalMappings     int             `json:"totalMappings"`
		PreparedAt        int64           `json:"preparedAt"`
		UpdatedAt         int64           `json:"updatedAt"`
		ExecutedAt        *int64          `json:"executedAt,omitempty"`
		StagedObject      json.RawMessage `json:"stagedObject,omitempty"`
		Object            json.RawMessage `json:"object,omitempty"`
	}{s.restoreID, s.archiveID, s.status, s.revision, s.fence, len(s.manifest), s.received, s.completed, len(s.mappings),
		s.preparedAt, s.updatedAt, s.executedAt, stagedObject, object})
	return b
}

// readExactKeys reads raw as an object with exactly keys, all required, and returns their values.
func readExactKeys(raw []byte, keys ...string) (map[string][]byte, bool) {
	vals := make([][]byte, len(keys))
	fields := make([]strictjson.Field, len(keys))
	for i, k := range keys {
		fields[i] = strictjson.Req(k, &vals[i])
	}
	if strictjson.ReadExact(raw, fields...) != nil {
		return nil, false
	}
	m := make(map[string][]byte, len(keys))
	for i, k := range keys {
		m[k] = vals[i]
	}
	return m, true
}

// strictDecode decodes an object with exactly keys into v.
func strictDecode(raw []byte, v any, keys ...string) error {
	if _, ok := readExactKeys(raw, keys...); !ok {
		return fmt.Errorf("not the exact schema")
	}
	d := json.NewDecoder(strings.NewReader(string(raw)))
	d.DisallowUnknownFields()
	return d.Decode(v)
}
