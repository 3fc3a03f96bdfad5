package platform

import (
	"encoding/json"

	"code.foss.global/serve.zone/relay/contracts"
	"code.foss.global/serve.zone/relay/feature"
	"code.foss.global/serve.zone/relay/internal/vstream"
)

// Restores, Cloudly → node: restoreServiceDatabaseClosure answers with the closure as a
// VirtualStream Cloudly writes (read with internal/vstream); the relay accepts the stream in the call's answer (on the socket's
// read loop, before Cloudly's first chunk is read) and streams what arrives into the node's
// Corestore. Each chunk is answered once it has been handed to Corestore, so a writer that waits
// for its answers, as the library does, has one chunk in flight; a writer that does not is held
// to maxQueuedChunks and the closure's share, then refused relay-node-busy.

// maxQueuedChunks bounds the chunks a restore holds before Corestore took them.
const maxQueuedChunks = 4

// restore asks Cloudly for one wanted restore's closure and writes it into the node's Corestore.
func (n *node) restore(origin string, cred contracts.Secret, r contracts.CorestoreRestore) {
	start := n.p.clock.Now()
	got, err := n.receiveRestore(origin, cred, r)
	n.carried(carriedRestore, r.BackupID, got, err, start)
}

func (n *node) receiveRestore(origin string, cred contracts.Secret, r contracts.CorestoreRestore) (int64, error) {
	p := n.p
	release, err := n.closureSlot()
	if err != nil {
		return 0, err
	}
	defer release()
	share := p.memory.NewShare(int64(maxQueuedChunks)*(int64(contracts.MaxBufferChunkLen(p.opts.ChunkBytes))+4096) + int64(p.opts.ChunkBytes))
	defer share.Close()
	rd := vstream.NewReader(vstream.ReaderOptions{Clock: p.clock, Idle: p.opts.StreamIdle, Queue: maxQueuedChunks,
		Limit: p.opts.MaxClosureBytes, Budget: share, Stop: n.ctx.Done(), Stopped: errStopped, Peer: "Cloudly",
		Taken:   func(k int) { p.metrics.bytes.WithLabelValues("to-corestore").Add(float64(k)) },
		Dropped: func(reason string) { p.metrics.frames.WithLabelValues(reason).Inc() }})
	type accepted struct {
		resp contracts.RestoreClosureResponse
		st   feature.Stream
		err  error
	}
	answered := make(chan accepted, 1)
	p.up.Call(contracts.MethodRestoreServiceDatabaseClosure, contracts.EncodeRestoreClosureRequest(r.BackupID, r.ServiceID, n.id),
		func(body json.RawMessage, err error) {
			// On the socket's read loop: the stream is taken before Cloudly's first chunk is read.
			var a accepted
			if a.err = err; err == nil {
				if a.resp, a.err = contracts.ReadRestoreClosureResponse(body); a.err != nil {
					a.err = contracts.RelayRequestInvalid.Refuse("Cloudly's answer to %s: %v", contracts.MethodRestoreServiceDatabaseClosure, a.err)
				} else if a.st, a.err = p.streams.AcceptStream(a.resp.StreamID, share, rd); a.err == nil {
					rd.Attach(a.st)
				}
			}
			answered <- a
		})
	var a accepted
	select {
	case a = <-answered:
	case <-n.ctx.Done():
		return 0, errStopped
	}
	if a.err != nil {
		return 0, a.err
	}
	defer a.st.Close()
	defer rd.Close() // Cloudly's chunks still waiting are answered with why it ended
	err = p.cs.PutRestoreClosure(n.ctx, origin, cred, r.BackupID, a.resp.Descriptor, rd)
	if rerr := rd.Err(); rerr != nil {
		return rd.Total(), rerr
	}
	if err != nil {
		rd.Fail(err)
	}
	return rd.Total(), err
}
