package sim

import (
	"bytes"
	"context"
	"crypto/ecdh"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"io"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"code.foss.global/serve.zone/relay/contracts"
	"code.foss.global/serve.zone/relay/contracts/strictjson"
	"code.foss.global/serve.zone/relay/internal/typedsocket"
	"code.foss.global/serve.zone/relay/internal/vstream"
)

// Cloudly's side of the relay's platform agent (docs/platform.md): getClusterPlatformDesiredState,
// backupServiceDatabaseClosure (the closure received as a VirtualStream, checked as it arrives
// and never held whole), restoreServiceDatabaseClosure (the closure written as a VirtualStream the
// way the library's writer does: each chunk waits for its answer, a keep-alive every second, the
// closing chunk), and the secret-recipient enrollment with a real HPKE seal, after which it pushes
// each node's Corestore credential sealed to the relay's key. Both stream ends are
// internal/vstream, the relay's own; the interop peers, on the published library, judge it.

// PlatformCloudly is the platform side of a Cloudly stand-in (Cloudly.Platform).
type PlatformCloudly struct {
	c *Cloudly // set at construction

	mu          sync.Mutex
	desired     []byte                       // guarded by mu: the desired-state answer; nil refuses the call
	credentials map[string]string            // guarded by mu: the credential pushed per node after an enrollment
	sources     map[string]RestoreSource     // guarded by mu: the closures Cloudly serves, by backupId
	accept      func(backupID string) bool   // guarded by mu: nil accepts every backup
	received    map[string]*ReceivedClosure  // guarded by mu: by backupId
	pending     map[string]pendingEnrollment // guarded by mu: by enrollmentId
	recipient   *ecdh.PublicKey              // guarded by mu: the key of the newest completed enrollment
	served      map[string]*ServedClosure    // guarded by mu: restores served, by backupId
	chunk       int                          // guarded by mu: bytes per chunk it writes (default 256 KiB)
	violations  []string                     // guarded by mu

	desiredServed atomic.Int64
	enrollments   atomic.Int64
	pushed        atomic.Int64 // credential pushes the relay accepted
	nextID        atomic.Int64
}

// RestoreSource is a closure Cloudly serves for restoreServiceDatabaseClosure: Size bytes of
// ClosureReader(backupId, Size).
type RestoreSource struct {
	Size       int64
	Descriptor json.RawMessage
	// Stall, when set, holds the closure the first time it is served, after Stall.Bytes of it,
	// until released: a Cloudly that stands still midway, so that the relay waits on Cloudly.
	Stall *ClosureStall
}

// ReceivedClosure is what Cloudly received for one backup.
type ReceivedClosure struct {
	NodeID, ServiceID string
	Descriptor        []byte
	Bytes             int64
	Sum               [32]byte
	Complete          bool // the closing chunk arrived
	Aborted           bool // the relay ended the stream without it
	Accepted          bool // what Cloudly answered
	h                 hash.Hash
}

// ServedClosure is how a restore's closure went.
type ServedClosure struct {
	Bytes    int64
	Sum      [32]byte
	Complete bool   // the closing chunk was answered
	Refusal  string // the error text the relay answered a chunk with, if any
	// Unanswered counts, while the stream runs, the keep-alives Cloudly sent since the relay
	// last answered one of its chunks: at two, the relay has held a chunk unanswered for a
	// keep-alive period at least.
	Unanswered int
}

type pendingEnrollment struct {
	pub    *ecdh.PublicKey
	secret []byte
}

func newPlatformCloudly(c *Cloudly) *PlatformCloudly {
	return &PlatformCloudly{c: c, credentials: make(map[string]string), sources: make(map[string]RestoreSource),
		received: make(map[string]*ReceivedClosure), pending: make(map[string]pendingEnrollment), served: make(map[string]*ServedClosure), chunk: 256 << 10}
}

// Platform is the stand-in's platform side.
func (c *Cloudly) Platform() *PlatformCloudly { return c.platform }

// SetDesiredState sets the desired-state answer, as its JSON.
func (p *PlatformCloudly) SetDesiredState(body json.RawMessage) {
	p.mu.Lock()
	p.desired = body
	p.mu.Unlock()
}

// SetCredential sets the Corestore credential pushed for node after each enrollment.
func (p *PlatformCloudly) SetCredential(node, credential string) {
	p.mu.Lock()
	p.credentials[node] = credential
	p.mu.Unlock()
}

// ServeRestore makes Cloudly serve backupID's closure.
func (p *PlatformCloudly) ServeRestore(backupID string, src RestoreSource) {
	if src.Descriptor == nil {
		src.Descriptor = json.RawMessage(`{"format":"` + contracts.CorestoreDatabaseBackupFormat + `","backupId":"` + backupID + `"}`)
	}
	p.mu.Lock()
	p.sources[backupID] = src
	p.mu.Unlock()
}

// SetAccept decides Cloudly's { accepted } per backup (nil: accept all).
func (p *PlatformCloudly) SetAccept(f func(backupID string) bool) {
	p.mu.Lock()
	p.accept = f
	p.mu.Unlock()
}

// SetChunkSize sets the bytes per chunk Cloudly writes.
func (p *PlatformCloudly) SetChunkSize(n int) {
	p.mu.Lock()
	p.chunk = n
	p.mu.Unlock()
}

// Received is a copy of what arrived for backupID.
func (p *PlatformCloudly) Received(backupID string) (ReceivedClosure, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	r, ok := p.received[backupID]
	if !ok {
		return ReceivedClosure{}, false
	}
	out := *r
	out.h = nil
	return out, true
}

// Served is a copy of how backupID's restore went.
func (p *PlatformCloudly) Served(backupID string) (ServedClosure, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	s, ok := p.served[backupID]
	if !ok {
		return ServedClosure{}, false
	}
	return *s, true
}

// DesiredServed, Enrollments and CredentialsPushed count what the relay asked for and took.
func (p *PlatformCloudly) DesiredServed() int64     { return p.desiredServed.Load() }
func (p *PlatformCloudly) Enrollments() int64       { return p.enrollments.Load() }
func (p *PlatformCloudly) CredentialsPushed() int64 { return p.pushed.Load() }

// Violations lists what the relay sent outside the seed's shapes.
func (p *PlatformCloudly) Violations() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.violations...)
}

func (p *PlatformCloudly) violation(format string, args ...any) *typedsocket.Error {
	text := fmt.Sprintf(format, args...)
	p.mu.Lock()
	p.violations = firstFew(p.violations, text)
	p.mu.Unlock()
	return &typedsocket.Error{Text: "request-invalid: " + text, Data: json.RawMessage("null")}
}

func simError(text string) error {
	return &typedsocket.Error{Text: text, Data: json.RawMessage("null")}
}

// serve answers one of the relay's platform calls.
func (p *PlatformCloudly) serve(conn *typedsocket.Conn, method string, body json.RawMessage, answer func(json.RawMessage, error)) {
	switch method {
	case contracts.MethodGetClusterPlatformDesiredState:
		p.mu.Lock()
		d := p.desired
		p.mu.Unlock()
		if string(body) != "{}" {
			answer(nil, p.violation("getClusterPlatformDesiredState takes {}"))
			return
		}
		if d == nil {
			answer(nil, simError("platform-not-configured: this cluster has no platform desired state"))
			return
		}
		p.desiredServed.Add(1)
		answer(d, nil)
	case contracts.MethodBeginSecretRecipientEnrollment:
		answer(p.begin(body))
	case contracts.MethodCompleteSecretRecipientEnrollment:
		out, err := p.complete(body)
		answer(out, err)
		if err == nil {
			p.pushCredentials(conn)
		}
	case contracts.MethodBackupServiceDatabaseClosure:
		p.receiveBackup(conn, body, answer)
	case contracts.MethodRestoreServiceDatabaseClosure:
		p.serveRestore(conn, body, answer)
	}
}

func (p *PlatformCloudly) begin(body json.RawMessage) (json.RawMessage, error) {
	pub, err := contracts.ReadBeginEnrollment(body)
	if err != nil {
		return nil, p.violation("%v", err)
	}
	secret := make([]byte, contracts.EnrollmentChallengeBytes)
	rand.Read(secret)
	challenge, err := contracts.SealEnvelope(pub, contracts.EnvelopeInfoEnrollment, secret)
	if err != nil {
		return nil, simError("enrollment-failed: cannot seal")
	}
	id := "enr-" + strconv.FormatInt(p.nextID.Add(1), 10)
	p.mu.Lock()
	p.pending[id] = pendingEnrollment{pub: pub, secret: secret}
	p.mu.Unlock()
	return json.Marshal(map[string]string{"enrollmentId": id, "challenge": challenge})
}

func (p *PlatformCloudly) complete(body json.RawMessage) (json.RawMessage, error) {
	var id, resp []byte
	if strictjson.ReadExact(body, strictjson.Req("enrollmentId", &id), strictjson.Req("response", &resp)) != nil {
		return nil, p.violation("completeSecretRecipientEnrollment must be { enrollmentId, response }")
	}
	ids, _ := strictjson.ReadString(id)
	rs, _ := strictjson.ReadString(resp)
	got, err := base64.RawURLEncoding.Strict().DecodeString(rs)
	p.mu.Lock()
	pe, ok := p.pending[ids]
	delete(p.pending, ids)
	p.mu.Unlock()
	if !ok || err != nil || subtle.ConstantTimeCompare(got, pe.secret) != 1 {
		return nil, simError("enrollment-refused: the response does not answer the challenge")
	}
	p.mu.Lock()
	p.recipient = pe.pub
	p.mu.Unlock()
	p.enrollments.Add(1)
	return json.RawMessage(`{}`), nil
}

// pushCredentials pushes every node's credential sealed to the newest recipient.
func (p *PlatformCloudly) pushCredentials(conn *typedsocket.Conn) {
	p.mu.Lock()
	creds := make(map[string]string, len(p.credentials))
	for n, c := range p.credentials {
		creds[n] = c
	}
	p.mu.Unlock()
	for n, c := range creds {
		p.pushCredential(conn, n, c, func(error) {})
	}
}

func (p *PlatformCloudly) pushCredential(conn *typedsocket.Conn, node, credential string, done func(error)) {
	p.mu.Lock()
	pub := p.recipient
	p.mu.Unlock()
	if pub == nil {
		done(errors.New("sim cloudly: the relay has not enrolled"))
		return
	}
	env, err := contracts.SealEnvelope(pub, contracts.EnvelopeInfoCorestoreCredential, []byte(credential))
	if err != nil {
		done(err)
		return
	}
	body, _ := json.Marshal(map[string]string{"nodeId": node, "envelope": env})
	_, err = conn.CallAsync(contracts.MethodPushCorestoreCredential, body, func(r typedsocket.Reply) {
		if r.Err == nil {
			p.pushed.Add(1)
		}
		done(r.Err)
	})
	if err != nil {
		done(err)
	}
}

// PushCredential pushes node's credential now, sealed to the relay's newest key, and waits for
// the relay's answer.
func (p *PlatformCloudly) PushCredential(ctx context.Context, node, credential string) error {
	p.c.mu.Lock()
	conn := p.c.conn
	p.c.mu.Unlock()
	if conn == nil {
		return errors.New("sim cloudly: no relay socket")
	}
	ch := make(chan error, 1)
	p.pushCredential(conn, node, credential, func(err error) { ch <- err })
	select {
	case err := <-ch:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// receiveBackup reads a backup request exactly, then the closure from its stream (read as the
// library's reader does, internal/vstream), and answers once the closing chunk arrived (or the
// stream was aborted).
func (p *PlatformCloudly) receiveBackup(conn *typedsocket.Conn, body json.RawMessage, answer func(json.RawMessage, error)) {
	var id, service, node, descriptor, closure []byte
	if strictjson.ReadExact(body, strictjson.Req("backupId", &id), strictjson.Req("serviceId", &service), strictjson.Req("nodeId", &node),
		strictjson.Req("descriptor", &descriptor), strictjson.Req("closure", &closure)) != nil {
		answer(nil, p.violation("backupServiceDatabaseClosure must be { backupId, serviceId, nodeId, descriptor, closure }"))
		return
	}
	streamID, ok := contracts.ReadStreamMarker(closure)
	backupID, err1 := strictjson.ReadString(id)
	serviceID, err2 := strictjson.ReadString(service)
	nodeID, err3 := strictjson.ReadString(node)
	if !ok || err1 != nil || err2 != nil || err3 != nil {
		answer(nil, p.violation("backupServiceDatabaseClosure members are not what the seed says"))
		return
	}
	rc := &ReceivedClosure{NodeID: nodeID, ServiceID: serviceID, Descriptor: append([]byte(nil), descriptor...), h: sha256.New()}
	p.mu.Lock()
	p.received[backupID] = rc
	accept := p.accept
	p.mu.Unlock()
	rd := vstream.NewReader(vstream.ReaderOptions{Idle: time.Minute, Peer: "the relay",
		Dropped: func(string) { p.violation("a closure frame that is not readable") }})
	rd.Attach(simLink{conn, streamID})
	p.c.streams.setSink(streamID, func(_ *typedsocket.Conn, frame []byte) { rd.StreamFrame(frame) })
	go func() {
		defer p.c.streams.dropSink(streamID)
		defer rd.Close()
		_, err := io.Copy(receivedWriter{p, rc}, rd)
		p.mu.Lock()
		rc.h.Sum(rc.Sum[:0])
		rc.Complete = err == nil
		rc.Aborted = rd.Aborted()
		rc.Accepted = err == nil && (accept == nil || accept(backupID))
		accepted := rc.Accepted
		p.mu.Unlock()
		switch {
		case rc.Aborted:
			answer(nil, simError("closure-aborted: the relay ended the stream before its closing chunk"))
		case errors.Is(err, contracts.RelayRequestInvalid):
			p.violation("a closure chunk in no library encoding")
			answer(nil, simError("closure-incomplete: "+err.Error()))
		case err != nil:
			answer(nil, simError("closure-incomplete: "+err.Error()))
		default:
			answer(json.RawMessage(`{"accepted":`+strconv.FormatBool(accepted)+`}`), nil)
		}
	}()
}

// receivedWriter takes a backup's bytes as they arrive: counted and hashed, never held.
type receivedWriter struct {
	p  *PlatformCloudly
	rc *ReceivedClosure
}

func (w receivedWriter) Write(b []byte) (int, error) {
	w.p.mu.Lock()
	w.rc.Bytes += int64(len(b))
	w.rc.h.Write(b)
	w.p.mu.Unlock()
	return len(b), nil
}

// simLink is one stream's path on the stand-in's socket.
type simLink struct {
	c  *typedsocket.Conn
	id string
}

func (l simLink) ID() string              { return l.id }
func (l simLink) Send(frame []byte) error { return l.c.SendFrame(frame) }
func (l simLink) Done() <-chan struct{}   { return l.c.Context().Done() }

// serveRestore answers with the closure's descriptor and stream, then writes the closure.
func (p *PlatformCloudly) serveRestore(conn *typedsocket.Conn, body json.RawMessage, answer func(json.RawMessage, error)) {
	var id, service, node []byte
	if strictjson.ReadExact(body, strictjson.Req("backupId", &id), strictjson.Req("serviceId", &service), strictjson.Req("nodeId", &node)) != nil {
		answer(nil, p.violation("restoreServiceDatabaseClosure must be { backupId, serviceId, nodeId }"))
		return
	}
	backupID, _ := strictjson.ReadString(id)
	p.mu.Lock()
	src, ok := p.sources[backupID]
	if ok && src.Stall != nil {
		held := src
		held.Stall = nil
		p.sources[backupID] = held // it stands still once
	}
	chunk := p.chunk
	p.mu.Unlock()
	if !ok {
		answer(nil, simError("backup-unknown: Cloudly holds no backup "+backupID))
		return
	}
	streamID := newStreamID()
	out := append([]byte(`{"descriptor":`), src.Descriptor...)
	out = contracts.AppendStreamMarker(append(out, `,"closure":`...), streamID)
	out = append(out, '}')
	sc := &ServedClosure{}
	p.mu.Lock()
	p.served[backupID] = sc
	p.mu.Unlock()
	w := vstream.NewWriter(vstream.WriterOptions{ChunkBytes: chunk, Idle: time.Minute, Peer: "the relay"})
	p.c.streams.setSink(streamID, func(_ *typedsocket.Conn, frame []byte) { w.StreamFrame(frame) })
	answer(out, nil) // queued before the first chunk: the relay takes the stream from it
	go func() {
		defer p.c.streams.dropSink(streamID)
		var closure io.Reader = ClosureReader(backupID, src.Size)
		if src.Stall != nil {
			closure = &heldReader{r: closure, s: src.Stall, done: conn.Context().Done()}
		}
		link := keepAliveCounter{simLink{conn, streamID}, func() { p.mu.Lock(); sc.Unanswered++; p.mu.Unlock() }}
		n, sum, complete, refusal := writeClosure(w, link, closure, func() { p.mu.Lock(); sc.Unanswered = 0; p.mu.Unlock() })
		p.mu.Lock()
		sc.Bytes, sc.Sum, sc.Complete, sc.Refusal = n, sum, complete, refusal
		p.mu.Unlock()
	}()
}

// writeClosure writes src as the library's writer does (internal/vstream) and returns what went:
// the bytes the relay answered and their digest, whether the closing chunk was answered, and the
// relay's refusal text if it refused a chunk. answered is called as each chunk is answered.
func writeClosure(w *vstream.Writer, link vstream.Link, src io.Reader, answered func()) (int64, [32]byte, bool, string) {
	h := &answeredHash{h: sha256.New(), src: src, then: answered}
	// The writer reads a chunk ahead: the digest takes a chunk's bytes once it was answered.
	w.SetAnswered(h.answered)
	_, err := w.Write(link, h)
	var sum [32]byte
	h.h.Sum(sum[:0])
	var refused *vstream.PeerRefusal
	if errors.As(err, &refused) {
		return h.n, sum, false, refused.Text
	}
	return h.n, sum, err == nil, ""
}

// heldReader reads r and stands still once s.Bytes of it were read, until s is released (or done
// closes: then it fails).
type heldReader struct {
	r    io.Reader
	s    *ClosureStall
	done <-chan struct{}
	n    int64
	held bool // it stood still already
}

func (h *heldReader) Read(b []byte) (int, error) {
	if !h.held {
		if h.n >= h.s.Bytes {
			h.held = true
			close(h.s.Reached)
			select {
			case <-h.s.release:
			case <-h.done:
				return 0, errors.New("sim: the connection ended while Cloudly stood still")
			}
		} else {
			b = b[:min(int64(len(b)), h.s.Bytes-h.n)]
		}
	}
	n, err := h.r.Read(b)
	h.n += int64(n)
	return n, err
}

// answeredHash reads src, holding what was read until the reader answered it (at most two
// chunks), then hashes it.
type answeredHash struct {
	h       hash.Hash
	src     io.Reader
	pending []byte
	n       int64
	then    func() // called after each answer
}

func (a *answeredHash) Read(b []byte) (int, error) {
	n, err := a.src.Read(b)
	a.pending = append(a.pending, b[:n]...)
	return n, err
}

func (a *answeredHash) answered(k int) {
	a.h.Write(a.pending[:k])
	a.pending = append(a.pending[:0], a.pending[k:]...)
	a.n += int64(k)
	a.then()
}

// keepAliveCounter is a stream's link that calls sent for each keep-alive going out.
type keepAliveCounter struct {
	simLink
	sent func()
}

func (l keepAliveCounter) Send(frame []byte) error {
	// A frame's purpose comes before its data: the head is enough.
	if bytes.Contains(frame[:min(len(frame), 256)], []byte(`"mainPurpose":"keepAlive"`)) {
		l.sent()
	}
	return l.simLink.Send(frame)
}
