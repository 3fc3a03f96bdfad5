package sim

import (
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"mime"
	"net/http"
	"strconv"
	"strings"
	"sync"

	"code.foss.global/serve.zone/relay/contracts"
	"code.foss.global/serve.zone/relay/contracts/strictjson"
)

// The Corestore stand-in's platform side (docs/platform.md, project-defined): PUT /platform/desired-state,
// GET /platform/backups?state=ready, GET /platform/backups/<id>/closure (served as the backup media
// type), POST /platform/backups/<id>/delivered, GET /platform/restores?state=wanted and
// PUT /platform/restores/<id>/closure (the media type, the descriptor in Serve-Zone-Descriptor).
// Every call must carry the node's credential as its bearer (refused 401 otherwise, and counted
// as a violation). Closures are made and checked as they stream: never held whole, so a test of
// a 200 MiB closure measures the relay, not the stand-in.

// PlatformCorestore is the platform state of one Corestore stand-in.
type PlatformCorestore struct {
	mu         sync.Mutex
	bearer     string                      // guarded by mu: the credential it accepts ("": every call refused)
	desired    [][]byte                    // guarded by mu: every desired state handed over (the newest 16)
	puts       int64                       // guarded by mu: desired states taken
	backups    map[string]*PlatformClosure // guarded by mu: by backupId
	order      []string                    // guarded by mu: backup ids in listing order
	restores   map[string]*PlatformRestore // guarded by mu: by backupId
	rorder     []string                    // guarded by mu
	delivered  int64                       // guarded by mu
	settled    int64                       // guarded by mu
	violations []string                    // guarded by mu: what the relay did wrong
	stallOut   *ClosureStall               // guarded by mu: holds the next backup closure served
	stallIn    *ClosureStall               // guarded by mu: holds the next restore closure taken
	refill     func(p *PlatformCorestore)  // guarded by mu: called after a delivery or settlement
}

// PlatformClosure is a backup the stand-in serves: Size bytes made from its id, so that whoever
// receives it can check it (ClosureDigest).
type PlatformClosure struct {
	ServiceID  string
	Descriptor json.RawMessage
	Size       int64
	// NoLength serves the closure without a Content-Length (chunked), so only its bytes tell
	// its length.
	NoLength bool
	// Type is the Content-Type it is served as; "" the backup media type.
	Type      string
	Delivered bool
}

// PlatformRestore is a restore the stand-in wants and what it received for it.
type PlatformRestore struct {
	ServiceID  string
	Settled    bool
	Bytes      int64
	Sum        [32]byte
	Descriptor []byte // the descriptor's JSON as the header carried it
	Attempts   int
}

// ClosureStall holds a closure after Bytes bytes of it moved until Release is called: a Corestore
// that stands still mid-closure.
type ClosureStall struct {
	Bytes   int64
	Reached chan struct{} // closed when the stall begins
	release chan struct{}
	once    sync.Once
}

// NewClosureStall stalls after n bytes.
func NewClosureStall(n int64) *ClosureStall {
	return &ClosureStall{Bytes: n, Reached: make(chan struct{}), release: make(chan struct{})}
}

// Release lets the stalled closure go on (it fails if the relay gave up meanwhile).
func (s *ClosureStall) Release() { s.once.Do(func() { close(s.release) }) }

func newPlatformCorestore() *PlatformCorestore {
	return &PlatformCorestore{backups: make(map[string]*PlatformClosure), restores: make(map[string]*PlatformRestore)}
}

// Platform is the stand-in's platform side.
func (c *Corestore) Platform() *PlatformCorestore { return c.platform }

// SetBearer sets the credential the platform calls must carry.
func (p *PlatformCorestore) SetBearer(b string) {
	p.mu.Lock()
	p.bearer = b
	p.mu.Unlock()
}

// AddBackup makes a backup ready.
func (p *PlatformCorestore) AddBackup(id string, b PlatformClosure) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if b.Descriptor == nil {
		b.Descriptor = json.RawMessage(`{"format":"` + contracts.CorestoreDatabaseBackupFormat + `","backupId":"` + id + `"}`)
	}
	if _, ok := p.backups[id]; !ok {
		p.order = append(p.order, id)
	}
	p.backups[id] = &b
}

// WantRestore lists a restore as wanted.
func (p *PlatformCorestore) WantRestore(backupID, serviceID string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if _, ok := p.restores[backupID]; !ok {
		p.rorder = append(p.rorder, backupID)
	}
	p.restores[backupID] = &PlatformRestore{ServiceID: serviceID}
}

// StallNextBackup holds the next backup closure served (see ClosureStall).
func (p *PlatformCorestore) StallNextBackup(s *ClosureStall) {
	p.mu.Lock()
	p.stallOut = s
	p.mu.Unlock()
}

// StallNextRestore holds the next restore closure taken.
func (p *PlatformCorestore) StallNextRestore(s *ClosureStall) {
	p.mu.Lock()
	p.stallIn = s
	p.mu.Unlock()
}

// Refill has f called (with the lock not held) after each delivery or settlement: a Corestore
// that keeps making backups and wanting restores.
func (p *PlatformCorestore) Refill(f func(p *PlatformCorestore)) {
	p.mu.Lock()
	p.refill = f
	p.mu.Unlock()
}

// DesiredStates is how many desired states the stand-in took, and the newest.
func (p *PlatformCorestore) DesiredStates() (int64, []byte) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.desired) == 0 {
		return p.puts, nil
	}
	return p.puts, p.desired[len(p.desired)-1]
}

// Delivered and Settled count backups Cloudly accepted (the relay said so) and restores taken.
func (p *PlatformCorestore) Delivered() int64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.delivered
}

func (p *PlatformCorestore) Settled() int64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.settled
}

// Backup and Restore return a copy of one backup's or restore's state.
func (p *PlatformCorestore) Backup(id string) (PlatformClosure, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	b, ok := p.backups[id]
	if !ok {
		return PlatformClosure{}, false
	}
	return *b, true
}

func (p *PlatformCorestore) Restore(id string) (PlatformRestore, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	r, ok := p.restores[id]
	if !ok {
		return PlatformRestore{}, false
	}
	return *r, true
}

// Violations lists what the relay did that Corestore refuses: a wrong bearer, a wrong media type,
// a descriptor that is not JSON.
func (p *PlatformCorestore) Violations() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.violations...)
}

func (p *PlatformCorestore) violation(format string, args ...any) {
	p.mu.Lock()
	p.violations = firstFew(p.violations, fmt.Sprintf(format, args...))
	p.mu.Unlock()
}

// ClosureReader makes the bytes of the closure named id: size bytes from a generator seeded by
// the id, so a receiver can check them without anyone holding them.
func ClosureReader(id string, size int64) io.Reader {
	seed := sha256.Sum256([]byte(id))
	return io.LimitReader(chachaReader{rand.NewChaCha8(seed)}, size)
}

// ClosureDigest is the SHA-256 of ClosureReader(id, size).
func ClosureDigest(id string, size int64) [32]byte {
	h := sha256.New()
	io.Copy(h, ClosureReader(id, size))
	var s [32]byte
	h.Sum(s[:0])
	return s
}

type chachaReader struct{ c *rand.ChaCha8 }

func (r chachaReader) Read(b []byte) (int, error) { return r.c.Read(b) }

// servePlatform serves /platform/….
func (c *Corestore) servePlatform(w http.ResponseWriter, r *http.Request) {
	p := c.platform
	p.mu.Lock()
	bearer := p.bearer
	p.mu.Unlock()
	if got, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer "); !ok || bearer == "" || got != bearer {
		p.violation("%s %s without the node's credential", r.Method, r.URL.Path)
		c.answer(w, "platform", nil, refuse(http.StatusUnauthorized, "unauthenticated: the bearer is not this node's credential"))
		return
	}
	path := r.URL.Path
	switch {
	case r.Method == http.MethodPut && path == contracts.CorestoreDesiredStatePath:
		body, err := io.ReadAll(io.LimitReader(r.Body, 8<<20))
		if err != nil || strictjson.Valid(body) != nil {
			c.answer(w, "platform", nil, refuse(http.StatusBadRequest, "desired-state-invalid: not JSON"))
			return
		}
		p.mu.Lock()
		p.puts++
		p.desired = append(p.desired, body)
		if len(p.desired) > 16 {
			p.desired = p.desired[1:]
		}
		p.mu.Unlock()
		w.Write([]byte(`{}`))
	case r.Method == http.MethodGet && path == "/platform/backups" && r.URL.Query().Get("state") == "ready":
		p.mu.Lock()
		list := make([]map[string]any, 0, len(p.order))
		for _, id := range p.order {
			if b := p.backups[id]; !b.Delivered {
				list = append(list, map[string]any{"backupId": id, "serviceId": b.ServiceID, "descriptor": b.Descriptor, "state": "ready"})
			}
		}
		p.mu.Unlock()
		body, _ := json.Marshal(map[string]any{"backups": list})
		w.Header().Set("Content-Type", "application/json")
		w.Write(body)
	case r.Method == http.MethodGet && path == "/platform/restores" && r.URL.Query().Get("state") == "wanted":
		p.mu.Lock()
		list := make([]map[string]any, 0, len(p.rorder))
		for _, id := range p.rorder {
			if x := p.restores[id]; !x.Settled {
				list = append(list, map[string]any{"backupId": id, "serviceId": x.ServiceID})
			}
		}
		p.mu.Unlock()
		body, _ := json.Marshal(map[string]any{"restores": list})
		w.Header().Set("Content-Type", "application/json")
		w.Write(body)
	case strings.HasPrefix(path, contracts.CorestoreBackupsPrefix):
		c.serveBackup(w, r, strings.TrimPrefix(path, contracts.CorestoreBackupsPrefix))
	case r.Method == http.MethodPut && strings.HasPrefix(path, contracts.CorestoreRestoresPrefix) && strings.HasSuffix(path, "/closure"):
		c.takeRestore(w, r, strings.TrimSuffix(strings.TrimPrefix(path, contracts.CorestoreRestoresPrefix), "/closure"))
	default:
		c.answer(w, "platform", nil, refuse(http.StatusNotFound, "not-found: no such platform endpoint"))
	}
}

func (c *Corestore) serveBackup(w http.ResponseWriter, r *http.Request, rest string) {
	p := c.platform
	id, what, _ := strings.Cut(rest, "/")
	p.mu.Lock()
	b := p.backups[id]
	var copyB PlatformClosure
	if b != nil {
		copyB = *b
	}
	stall := p.stallOut
	p.mu.Unlock()
	switch {
	case b == nil:
		c.answer(w, "platform", nil, refuse(http.StatusNotFound, "backup-unknown: no backup %s", id))
	case r.Method == http.MethodPost && what == "delivered":
		p.mu.Lock()
		first := !b.Delivered
		b.Delivered = true
		if first {
			p.delivered++
		}
		refill := p.refill
		p.mu.Unlock()
		if first && refill != nil {
			refill(p)
		}
		w.Write([]byte(`{}`))
	case r.Method == http.MethodGet && what == "closure":
		typ := copyB.Type
		if typ == "" {
			typ = contracts.CorestoreDatabaseBackupMediaType
		}
		w.Header().Set("Content-Type", typ)
		if !copyB.NoLength {
			w.Header().Set("Content-Length", strconv.FormatInt(copyB.Size, 10))
		}
		src := ClosureReader(id, copyB.Size)
		if stall != nil {
			p.mu.Lock()
			p.stallOut = nil
			p.mu.Unlock()
			io.CopyN(w, src, stall.Bytes)
			w.(http.Flusher).Flush()
			close(stall.Reached)
			select {
			case <-stall.release:
			case <-r.Context().Done():
				return
			}
		}
		io.Copy(w, src)
	default:
		c.answer(w, "platform", nil, refuse(http.StatusNotFound, "not-found: no such backup endpoint"))
	}
}

func (c *Corestore) takeRestore(w http.ResponseWriter, r *http.Request, id string) {
	p := c.platform
	if mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type")); err != nil || mt != contracts.CorestoreDatabaseBackupMediaType {
		p.violation("a restore closure sent as %q", r.Header.Get("Content-Type"))
		c.answer(w, "platform", nil, refuse(http.StatusUnsupportedMediaType, "media-type: a closure is %s", contracts.CorestoreDatabaseBackupMediaType))
		return
	}
	desc, err := base64.RawURLEncoding.Strict().DecodeString(r.Header.Get(contracts.CorestoreDescriptorHeader))
	if err != nil || strictjson.Valid(desc) != nil {
		p.violation("a restore descriptor that is not base64url JSON")
		c.answer(w, "platform", nil, refuse(http.StatusBadRequest, "descriptor-invalid: %s must be base64url JSON", contracts.CorestoreDescriptorHeader))
		return
	}
	p.mu.Lock()
	x := p.restores[id]
	stall := p.stallIn
	if stall != nil {
		p.stallIn = nil
	}
	if x != nil {
		x.Attempts++
	}
	p.mu.Unlock()
	if x == nil {
		c.answer(w, "platform", nil, refuse(http.StatusNotFound, "restore-unknown: no restore %s is wanted", id))
		return
	}
	h := sha256.New()
	var n int64
	if stall != nil {
		k, err := io.CopyN(h, r.Body, stall.Bytes)
		n += k
		close(stall.Reached)
		if err != nil {
			return
		}
		select {
		case <-stall.release:
		case <-r.Context().Done():
			return
		}
	}
	k, err := io.Copy(h, r.Body)
	n += k
	if err != nil {
		return // cut short: nothing settles
	}
	var sum [32]byte
	h.Sum(sum[:0])
	p.mu.Lock()
	first := !x.Settled
	x.Settled, x.Bytes, x.Sum, x.Descriptor = true, n, sum, desc
	if first {
		p.settled++
	}
	refill := p.refill
	p.mu.Unlock()
	if first && refill != nil {
		refill(p)
	}
	w.Write([]byte(`{}`))
}
