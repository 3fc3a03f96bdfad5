package platform

import (
	"encoding/json"
	"errors"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"code.foss.global/serve.zone/relay/contracts"
	"code.foss.global/serve.zone/relay/internal/vstream"
)

// Backups, node → Cloudly: a closure read from the node's Corestore is written into a
// VirtualStream the relay opens, carried by backupServiceDatabaseClosure, chunk by chunk as the
// library writes one (internal/vstream): each chunk waits for Cloudly's answer (and, while it
// says backpressure, for Cloudly to ask for more), a keep-alive goes every second, the closing
// chunk ends it. So at most one chunk of a closure is in flight: what it holds is one read buffer
// and two frames, charged to its share, whatever the closure's size.

// closureShare is what one closure may hold at once: its read buffer and two frames.
func (p *Platform) closureShare() int64 {
	return int64(p.opts.ChunkBytes + 2*contracts.MaxBufferChunkLen(p.opts.ChunkBytes) + 4096)
}

// backup carries one ready backup to Cloudly and, when Cloudly accepts it, tells Corestore.
func (n *node) backup(origin string, cred contracts.Secret, b contracts.CorestoreBackup) {
	start := n.p.clock.Now()
	sent, err := n.sendBackup(origin, cred, b)
	n.carried(carriedBackup, b.BackupID, sent, err, start)
}

// carriage is what a carried closure is counted, kept and logged as: a backup or a restore.
type carriage struct {
	ok     string                                  // the outcome when it went whole
	metric func(*metrics) *prometheus.CounterVec   // its outcome counter
	count  func(*node) (last *string, done *int64) // guarded by the node's mu: its status fields
	msg    string
}

var (
	carriedBackup = carriage{outcomeDelivered, func(m *metrics) *prometheus.CounterVec { return m.backups },
		func(n *node) (*string, *int64) { return &n.lastBackup, &n.delivered }, "database backup carried to Cloudly"}
	carriedRestore = carriage{outcomeSettled, func(m *metrics) *prometheus.CounterVec { return m.restores },
		func(n *node) (*string, *int64) { return &n.lastRestor, &n.settled }, "database restore carried to Corestore"}
)

// carried counts, keeps on the node's status and logs one closure carried (or not) with c.
func (n *node) carried(c carriage, backupID string, bytes int64, err error, start time.Time) {
	p := n.p
	out := outcome(err, c.ok)
	c.metric(p.metrics).WithLabelValues(out).Inc()
	n.mu.Lock()
	last, done := c.count(n)
	*last = out
	if err == nil {
		*done++
	}
	n.mu.Unlock()
	ev := p.log.Debug()
	if err != nil {
		ev = p.log.Info()
	}
	ev.Str("node", n.id).Str("backup", backupID).Int64("bytes", bytes).Str("outcome", out).Dur("latency", p.clock.Since(start)).Msg(c.msg)
}

// closureSlot takes one of the slots the node's closures are carried in (slots.go), on an
// upstream that carries streams of its own; release gives it back.
func (n *node) closureSlot() (release func(), err error) {
	p := n.p
	if p.streams == nil || p.memory == nil {
		return nil, contracts.RelayMethodUnknown.Refuse("this relay's upstream carries no streams of its own")
	}
	if !p.slots.acquire(n.ctx, n.id) {
		return nil, errStopped
	}
	return func() { p.slots.release(n.id) }, nil
}

// errNotAccepted is Cloudly's { accepted: false }: the backup stays ready and is offered again.
var errNotAccepted = errors.New("Cloudly did not accept the backup")

func (n *node) sendBackup(origin string, cred contracts.Secret, b contracts.CorestoreBackup) (int64, error) {
	p := n.p
	release, err := n.closureSlot()
	if err != nil {
		return 0, err
	}
	defer release()
	body, err := p.cs.OpenBackupClosure(n.ctx, origin, cred, b.BackupID)
	if err != nil {
		return 0, err
	}
	defer body.Close()
	share := p.memory.NewShare(p.closureShare())
	defer share.Close()
	if !share.Charge(p.opts.ChunkBytes) { // the read buffer
		return 0, contracts.RelayNodeBusy.Refuse("the relay's peer memory budget has no room for a closure")
	}
	defer share.Release(p.opts.ChunkBytes)
	answered := make(chan struct{})
	var res callResult // written before answered is closed
	w := vstream.NewWriter(vstream.WriterOptions{Clock: p.clock, ChunkBytes: p.opts.ChunkBytes, Limit: p.opts.MaxClosureBytes,
		Idle: p.opts.StreamIdle, Stop: n.ctx.Done(), Stopped: errStopped, Ended: answered, Peer: "Cloudly",
		Answered: func(k int) { p.metrics.bytes.WithLabelValues("to-cloudly").Add(float64(k)) },
		Dropped:  func(reason string) { p.metrics.frames.WithLabelValues(reason).Inc() }})
	st, err := p.streams.OpenStream(share, w)
	if err != nil {
		return 0, err
	}
	defer st.Close()
	req := contracts.BackupClosureRequest{BackupID: b.BackupID, ServiceID: b.ServiceID, NodeID: n.id, Descriptor: b.Descriptor, StreamID: st.ID()}
	st.Call(contracts.MethodBackupServiceDatabaseClosure, req.Encode(), func(body json.RawMessage, err error) {
		res = callResult{body, err}
		close(answered)
	})
	sent, werr := w.Write(st, body)
	if werr != nil && !errors.Is(werr, vstream.ErrEndedEarly) {
		w.Abort(st)
		return sent, werr
	}
	select {
	case <-answered:
	case <-n.ctx.Done():
		return sent, errStopped
	}
	if res.err != nil {
		return sent, res.err
	}
	accepted, err := contracts.ReadBackupClosureResponse(res.body)
	switch {
	case err != nil:
		return sent, contracts.RelayRequestInvalid.Refuse("Cloudly's answer to %s: %v", contracts.MethodBackupServiceDatabaseClosure, err)
	case !accepted:
		return sent, errNotAccepted
	case werr != nil:
		// Accepted before the closing chunk: Cloudly cannot hold the whole closure, so it is not
		// a delivery.
		return sent, contracts.RelayRequestInvalid.Refuse("Cloudly accepted the backup before its closure ended")
	}
	ctx, cancel := p.withTimeout(n.ctx, p.opts.CallTimeout)
	defer cancel()
	return sent, p.cs.MarkDelivered(ctx, origin, cred, b.BackupID)
}

type callResult struct {
	body []byte
	err  error
}

// errStopped: the node left the configuration, or the agent closed.
var errStopped = contracts.RestoreNodeUnreachable.Refuse("the platform agent stopped this node's work")
