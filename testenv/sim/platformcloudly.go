package sim

import (
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
)

// Cloudly's side of the relay's platform agent (SPEC §17): getClusterPlatformDesiredState,
// backupServiceDatabaseClosure (the closure received as a VirtualStream, checked as it arrives
// and never held whole), restoreServiceDatabaseClosure (the closure written as a VirtualStream the
// way the library's writer does: each chunk waits for its answer, a keep-alive every second, the
// closing chunk), and the secret-recipient enrollment with a real HPKE seal, after which it pushes
// each node's Corestore credential sealed to the relay's key.

// PlatformCloudly is the platform side of a Cloudly stand-in (Cloudly.Platform).
type PlatformCloudly struct {
	c *Cloudly // set at construction

	mu          sync.Mutex
	desired     []byte                                    // guarded by mu: the desired-state answer; nil refuses the call
	credentials map[string]string                         // guarded by mu: the credential pushed per node after an enrollment
	sources     map[string]RestoreSource                  // guarded by mu: the closures Cloudly serves, by backupId
	accept      func(backupID string) bool                // guarded by mu: nil accepts every backup
	received    map[string]*ReceivedClosure               // guarded by mu: by backupId
	pending     map[string]pendingEnrollment              // guarded by mu: by enrollmentId
	recipient   *ecdh.PublicKey                           // guarded by mu: the key of the newest completed enrollment
	served      map[string]*ServedClosure                 // guarded by mu: restores served, by backupId
	waiters     map[string]chan contracts.StreamFrameBody // guarded by mu: answers awaited, by cycleId
	chunk       int                                       // guarded by mu: bytes per chunk it writes (default 256 KiB)
	violations  []string                                  // guarded by mu

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
}

type pendingEnrollment struct {
	pub    *ecdh.PublicKey
	secret []byte
}

func newPlatformCloudly(c *Cloudly) *PlatformCloudly {
	return &PlatformCloudly{c: c, credentials: make(map[string]string), sources: make(map[string]RestoreSource),
		received: make(map[string]*ReceivedClosure), pending: make(map[string]pendingEnrollment), served: make(map[string]*ServedClosure),
		waiters: make(map[string]chan contracts.StreamFrameBody), chunk: 256 << 10}
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
		p.receiveBackup(body, answer)
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

// receiveBackup reads a backup request exactly, then the closure from its stream, and answers
// once the closing chunk arrived (or the stream was aborted).
func (p *PlatformCloudly) receiveBackup(body json.RawMessage, answer func(json.RawMessage, error)) {
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
	var once sync.Once
	finish := func(err error) {
		once.Do(func() {
			p.c.streams.dropSink(streamID)
			p.mu.Lock()
			rc.h.Sum(rc.Sum[:0])
			rc.Accepted = err == nil && rc.Complete && (accept == nil || accept(backupID))
			accepted := rc.Accepted
			p.mu.Unlock()
			if err != nil {
				answer(nil, err)
				return
			}
			answer(json.RawMessage(`{"accepted":`+strconv.FormatBool(accepted)+`}`), nil)
		})
	}
	idle := time.AfterFunc(time.Minute, func() { finish(simError("closure-incomplete: no chunk for a minute")) })
	p.c.streams.setSink(streamID, func(conn *typedsocket.Conn, frame []byte) {
		f, err := contracts.ReadStreamFrameBody(frame)
		if err != nil || !f.Request.Present || f.Response.Present {
			return // an answer is never answered: it would bounce between the ends for ever
		}
		idle.Reset(time.Minute)
		a := contracts.StreamAnswer{StreamID: streamID, CycleID: f.Request.CycleID, Purpose: "feedback"}
		switch f.Request.MainPurpose {
		case "chunk":
			data, closing, err := contracts.AppendChunkData(nil, f.Request.ChunkData)
			if err != nil {
				p.violation("a closure chunk in no library encoding")
				conn.SendFrame(contracts.AppendStreamAnswer(nil, a))
				return
			}
			p.mu.Lock()
			rc.Bytes += int64(len(data))
			rc.h.Write(data)
			if closing {
				rc.Complete = true
			}
			p.mu.Unlock()
			conn.SendFrame(contracts.AppendStreamAnswer(nil, a))
			if closing {
				idle.Stop()
				finish(nil)
			}
		case "keepAlive":
			a.Purpose, a.KeepAlive, a.Request = "keepAlive", true, f.RequestRaw
			conn.SendFrame(contracts.AppendStreamAnswer(nil, a))
			if f.Request.HasKeepAlive && !f.Request.KeepAlive {
				p.mu.Lock()
				rc.Aborted = true
				p.mu.Unlock()
				idle.Stop()
				finish(simError("closure-aborted: the relay ended the stream before its closing chunk"))
			}
		default:
			a.Request = f.RequestRaw
			conn.SendFrame(contracts.AppendStreamAnswer(nil, a))
		}
	})
}

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
	p.c.streams.setSink(streamID, p.answers)
	answer(out, nil) // queued before the first chunk: the relay takes the stream from it
	go func() {
		defer p.c.streams.dropSink(streamID)
		n, sum, complete, refusal := p.writeClosure(conn, streamID, ClosureReader(backupID, src.Size), chunk)
		p.mu.Lock()
		sc.Bytes, sc.Sum, sc.Complete, sc.Refusal = n, sum, complete, refusal
		p.mu.Unlock()
	}()
}

// answers takes the relay's answers on a stream Cloudly writes, for whoever waits for them.
func (p *PlatformCloudly) answers(conn *typedsocket.Conn, frame []byte) {
	f, err := contracts.ReadStreamFrameBody(frame)
	if err != nil || !f.Response.Present {
		return
	}
	p.mu.Lock()
	ch := p.waiters[f.Response.CycleID]
	delete(p.waiters, f.Response.CycleID)
	p.mu.Unlock()
	if ch != nil {
		ch <- f
	}
}

// writeClosure writes src as the library's writer does and returns what went: bytes, digest,
// whether the closing chunk was answered, and the relay's refusal text if it refused a chunk.
func (p *PlatformCloudly) writeClosure(conn *typedsocket.Conn, streamID string, src io.Reader, chunk int) (int64, [32]byte, bool, string) {
	h := sha256.New()
	var sum [32]byte
	var n int64
	buf := make([]byte, chunk)
	ka := time.NewTicker(time.Second)
	defer ka.Stop()
	cycle := 0
	send := func(frame []byte, cid string) (contracts.StreamFrameBody, error) {
		ch := make(chan contracts.StreamFrameBody, 1)
		p.mu.Lock()
		p.waiters[cid] = ch
		p.mu.Unlock()
		defer func() {
			p.mu.Lock()
			delete(p.waiters, cid)
			p.mu.Unlock()
		}()
		if err := conn.SendFrame(frame); err != nil {
			return contracts.StreamFrameBody{}, err
		}
		idle := time.NewTimer(time.Minute)
		defer idle.Stop()
		for {
			select {
			case f := <-ch:
				return f, nil
			case <-ka.C:
				cycle++
				conn.SendFrame(contracts.AppendKeepAliveFrame(nil, streamID, "ka-"+strconv.Itoa(cycle), true))
			case <-idle.C:
				return contracts.StreamFrameBody{}, errors.New("no answer")
			case <-conn.Context().Done():
				return contracts.StreamFrameBody{}, typedsocket.ErrClosed
			}
		}
	}
	for {
		m, rerr := io.ReadFull(src, buf)
		last := rerr != nil
		if m > 0 {
			cycle++
			cid := streamID + "-" + strconv.Itoa(cycle)
			f, err := send(contracts.AppendChunkFrame(nil, streamID, cid, buf[:m], !last, false), cid)
			if err != nil {
				h.Sum(sum[:0])
				return n, sum, false, ""
			}
			if f.ErrorText != "" {
				h.Sum(sum[:0])
				return n, sum, false, f.ErrorText
			}
			n += int64(m)
			h.Write(buf[:m])
			for f.Response.Backpressure {
				time.Sleep(50 * time.Millisecond)
				cycle++
				cid := streamID + "-" + strconv.Itoa(cycle)
				if f, err = send(contracts.AppendFeedbackFrame(nil, streamID, cid), cid); err != nil {
					h.Sum(sum[:0])
					return n, sum, false, ""
				}
			}
		}
		if last {
			cycle++
			cid := streamID + "-" + strconv.Itoa(cycle)
			f, err := send(contracts.AppendChunkFrame(nil, streamID, cid, nil, false, true), cid)
			h.Sum(sum[:0])
			if err != nil {
				return n, sum, false, ""
			}
			return n, sum, f.ErrorText == "", f.ErrorText
		}
	}
}
