package ha

import (
	"context"
	"encoding/binary"
	"errors"
	"net"
	"strings"
	"sync"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"code.foss.global/serve.zone/relay/internal/backoff"
)

// Escrow survives a failover (SPEC §16): the leader copies the replicated part's records to every
// standby that dials it — the whole state first, then every change — and a standby adopts them
// as its own state, so that it holds every run and re-binding pair when it leads. In memory only,
// bounded on both sides, never logged. Every relay listens; only the leader feeds; a standby dials
// the address on the Pod the Lease names as holder.

// Bounds of replication.
const (
	// DefaultMaxCopyBytes bounds a standby's copy; past it the copy is incomplete, and says so.
	DefaultMaxCopyBytes = 512 << 20
	// maxFeedBytes bounds what the leader queues for one standby; past it that standby is
	// dropped, and copies again from the start when it comes back.
	maxFeedBytes = 512 << 20
	dialTimeout  = 5 * time.Second
)

// Record operations in a frame: op (1 byte), key length (2 bytes), key, value.
const (
	opSet    = 1
	opDelete = 2
	opSynced = 3 // the whole state has been sent; changes follow
)

// runPrefix names the records that are escrowed runs, for the counts the status page shows.
const runPrefix = "run/"

// ReplicationStatus is the status page's replication section.
type ReplicationStatus struct {
	Connected int  `json:"connected"` // on the leader: standbys fed; on a standby: 1 while it follows
	Runs      int  `json:"runs"`      // on the leader: runs it replicates; on a standby: runs it holds as a copy
	Complete  bool `json:"complete"`  // a standby's copy is whole and current
}

// replication is both sides of the channel.
type replication struct {
	e *Elector // set at construction

	runMu       sync.Mutex
	runsFedKeys map[string]bool // guarded by runMu: the runs the leader has replicated

	mu        sync.Mutex
	feeds     map[*feed]struct{} // guarded by mu: standbys fed while leading
	following net.Conn           // guarded by mu: the connection to the leader a standby follows
	copyKeys  map[string]int     // guarded by mu: a standby's copied records and their sizes
	copyBytes int64              // guarded by mu
	complete  bool               // guarded by mu
	overflow  bool               // guarded by mu: a record did not fit MaxCopyBytes
	wake      chan struct{}      // the holder changed: follow looks again
}

func newReplication(e *Elector) *replication {
	return &replication{e: e, feeds: make(map[*feed]struct{}), copyKeys: make(map[string]int), runsFedKeys: make(map[string]bool),
		wake: make(chan struct{}, 1)}
}

// countRun notes a run record the leader replicates; it runs under the replicated part's lock.
func (r *replication) countRun(key string, value []byte) {
	if !strings.HasPrefix(key, runPrefix) {
		return
	}
	r.runMu.Lock()
	if value == nil {
		delete(r.runsFedKeys, key)
	} else {
		r.runsFedKeys[key] = true
	}
	n := len(r.runsFedKeys)
	r.runMu.Unlock()
	r.e.m.replicatedRuns.Set(float64(n))
}

func (r *replication) runsFed() int {
	r.runMu.Lock()
	defer r.runMu.Unlock()
	return len(r.runsFedKeys)
}

// holderChanged: the Lease has another holder; a standby follows the new one.
func (r *replication) holderChanged() {
	r.mu.Lock()
	if r.following != nil {
		r.following.Close()
	}
	r.mu.Unlock()
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

// serve accepts standbys until ctx ends, and feeds them while this relay leads.
func (r *replication) serve(ctx context.Context) {
	ln := r.e.cfg.Replication
	if ln == nil {
		return
	}
	stop := context.AfterFunc(ctx, func() { ln.Close() })
	defer stop()
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		conn, err := ln.Accept()
		if err != nil {
			return
		}
		wg.Add(1)
		go func() { defer wg.Done(); r.feedOne(ctx, conn) }()
	}
}

// feedOne feeds one standby while this relay leads.
func (r *replication) feedOne(ctx context.Context, conn net.Conn) {
	defer conn.Close()
	if _, self := r.e.Holder(); !self || r.e.cfg.Replicated == nil {
		return
	}
	ch, err := handshake(conn, r.e.cfg.ReplicationKey, false)
	if err != nil {
		r.e.log.Warn().Str("remote", conn.RemoteAddr().String()).Str("outcome", "refused").Msg("a replication peer failed the handshake")
		return
	}
	f := &feed{wake: make(chan struct{}, 1)}
	stop := r.e.cfg.Replicated.Replicate(func(key string, value []byte) {
		r.countRun(key, value)
		f.push(key, value)
	})
	defer stop()
	f.push("", nil) // synced
	r.mu.Lock()
	r.feeds[f] = struct{}{}
	r.e.m.standbys.Set(float64(len(r.feeds)))
	r.mu.Unlock()
	runs := r.runsFed()
	defer func() {
		r.mu.Lock()
		delete(r.feeds, f)
		r.e.m.standbys.Set(float64(len(r.feeds)))
		r.mu.Unlock()
	}()
	r.e.log.Info().Str("remote", conn.RemoteAddr().String()).Int("runs", runs).Str("outcome", "connected").Msg("feeding a standby")
	tick := time.NewTicker(r.e.cfg.RetryPeriod)
	defer tick.Stop()
	for {
		items, broken := f.take()
		if broken {
			r.e.log.Warn().Str("outcome", "dropped").Msg("a standby reads too slowly for its copy's bound: dropped")
			return
		}
		for _, it := range items {
			if err := ch.writeFrame(it.frame()); err != nil {
				return
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-f.wake:
		case <-tick.C:
			if _, self := r.e.Holder(); !self {
				return // no longer the leader: feeds nothing more
			}
		}
	}
}

// feed is one standby's queue on the leader: pushed to under the replicated part's lock, never
// blocking; drained by feedOne.
type feed struct {
	mu     sync.Mutex
	items  []record // guarded by mu
	bytes  int      // guarded by mu
	broken bool     // guarded by mu: past maxFeedBytes
	wake   chan struct{}
}

type record struct {
	key    string
	value  []byte
	synced bool
}

func (f *feed) push(key string, value []byte) {
	f.mu.Lock()
	if !f.broken {
		f.items = append(f.items, record{key: key, value: value, synced: key == "" && value == nil})
		f.bytes += len(key) + len(value)
		f.broken = f.bytes > maxFeedBytes
	}
	f.mu.Unlock()
	select {
	case f.wake <- struct{}{}:
	default:
	}
}

func (f *feed) take() ([]record, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	items := f.items
	f.items, f.bytes = nil, 0
	return items, f.broken
}

func (rc record) frame() []byte {
	if rc.synced {
		return []byte{opSynced, 0, 0}
	}
	op := byte(opSet)
	if rc.value == nil {
		op = opDelete
	}
	b := make([]byte, 0, 3+len(rc.key)+len(rc.value))
	b = append(b, op)
	b = binary.BigEndian.AppendUint16(b, uint16(len(rc.key)))
	b = append(b, rc.key...)
	return append(b, rc.value...)
}

func readRecord(b []byte) (op byte, key string, value []byte, err error) {
	if len(b) < 3 {
		return 0, "", nil, errors.New("ha: replication record too short")
	}
	op, n := b[0], int(binary.BigEndian.Uint16(b[1:3]))
	if len(b) < 3+n || op < opSet || op > opSynced {
		return 0, "", nil, errors.New("ha: replication record does not read")
	}
	key, value = string(b[3:3+n]), b[3+n:]
	if op == opSet {
		value = append([]byte{}, value...) // the frame's buffer is reused
	}
	return op, key, value, nil
}

// follow keeps a standby's copy of the leader's records until ctx ends: it dials the holder's
// replication address, adopts what it is sent, and after the leader's whole state has come,
// forgets the records the leader no longer has.
func (r *replication) follow(ctx context.Context) {
	if r.e.cfg.Replicated == nil {
		return
	}
	bo := backoff.New()
	for ctx.Err() == nil {
		holder, self := r.e.Holder()
		if holder != "" && holder != r.e.cfg.Identity && !self {
			if err := r.followOne(ctx, holder); err != nil && ctx.Err() == nil {
				r.e.log.Debug().Err(err).Str("outcome", "lost").Msg("replication from the leader lost")
			}
		}
		r.mu.Lock()
		r.complete = false
		r.e.m.complete.Set(0)
		r.mu.Unlock()
		select {
		case <-ctx.Done():
		case <-r.wake:
		case <-time.After(bo.Next()):
		}
	}
}

func (r *replication) followOne(ctx context.Context, holder string) error {
	actx, cancel := context.WithTimeout(ctx, apiTimeout)
	pod, err := r.e.cfg.Client.CoreV1().Pods(r.e.cfg.Namespace).Get(actx, holder, metav1.GetOptions{})
	cancel()
	if err != nil {
		return err
	}
	addr := pod.Annotations[ReplicationAnnotation]
	if addr == "" {
		return errors.New("ha: the holder's Pod names no replication address")
	}
	d := net.Dialer{Timeout: dialTimeout}
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return err
	}
	defer conn.Close()
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	defer stop()
	r.mu.Lock()
	r.following = conn
	r.mu.Unlock()
	defer func() {
		r.mu.Lock()
		r.following = nil
		r.mu.Unlock()
	}()
	if now, _ := r.e.Holder(); now != holder {
		return errors.New("ha: the holder changed")
	}
	ch, err := handshake(conn, r.e.cfg.ReplicationKey, true)
	if err != nil {
		return err
	}
	r.e.log.Info().Str("node", holder).Str("outcome", "following").Msg("copying the leader's escrow")
	seen := make(map[string]bool)
	synced := false
	for {
		b, err := ch.readFrame()
		if err != nil {
			return err
		}
		op, key, value, err := readRecord(b)
		if err != nil {
			return err
		}
		switch op {
		case opSynced:
			r.forgetUnseen(seen)
			synced, seen = true, nil
		case opSet:
			if !synced {
				seen[key] = true
			}
			r.adopt(key, value)
		case opDelete:
			r.adopt(key, nil)
		}
	}
}

// adopt applies one record to the copy, within its bound.
func (r *replication) adopt(key string, value []byte) {
	r.mu.Lock()
	defer r.mu.Unlock()
	old, had := r.copyKeys[key]
	if value != nil && r.copyBytes-int64(old)+int64(len(value)) > r.e.cfg.MaxCopyBytes {
		r.overflow, r.complete = true, false
		r.e.m.complete.Set(0)
		return
	}
	if err := r.e.cfg.Replicated.Adopt(key, value); err != nil {
		r.e.log.Warn().Str("outcome", "refused").Msg("a replicated record does not read: " + err.Error())
		return
	}
	r.copyBytes -= int64(old)
	if value == nil {
		delete(r.copyKeys, key)
	} else {
		r.copyKeys[key] = len(value)
		r.copyBytes += int64(len(value))
	}
	if !had || value == nil {
		r.e.m.replicatedRuns.Set(float64(r.copiedRunsLocked()))
	}
}

// forgetUnseen drops what the leader's whole state did not hold, and marks the copy complete.
func (r *replication) forgetUnseen(seen map[string]bool) {
	r.mu.Lock()
	var gone []string
	for key := range r.copyKeys {
		if !seen[key] {
			gone = append(gone, key)
		}
	}
	r.mu.Unlock()
	for _, key := range gone {
		r.adopt(key, nil)
	}
	r.mu.Lock()
	r.complete = !r.overflow
	r.e.m.complete.Set(map[bool]float64{true: 1}[r.complete])
	r.mu.Unlock()
}

func (r *replication) copiedRunsLocked() int {
	n := 0
	for key := range r.copyKeys {
		if strings.HasPrefix(key, runPrefix) {
			n++
		}
	}
	return n
}

func (r *replication) status() ReplicationStatus {
	if _, self := r.e.Holder(); self {
		r.mu.Lock()
		defer r.mu.Unlock()
		return ReplicationStatus{Connected: len(r.feeds), Runs: r.runsFed(), Complete: true}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	st := ReplicationStatus{Runs: r.copiedRunsLocked(), Complete: r.complete}
	if r.following != nil {
		st.Connected = 1
	}
	return st
}

// copyReady says why this relay's copy of the leader's escrow is not complete, for the Elector's
// Ready (a standby's /readyz): nil on the leader, with nothing to copy, or once the standby holds
// the leader's whole state and follows its changes.
func (r *replication) copyReady() error {
	if _, self := r.e.Holder(); self || r.e.cfg.Replicated == nil {
		return nil
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	switch {
	case r.overflow:
		return errors.New("the copy of the leader's escrow is past its bound")
	case !r.complete:
		return errors.New("the copy of the leader's escrow is not complete")
	}
	return nil
}
