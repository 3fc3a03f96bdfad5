package ha

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync/atomic"
	"time"

	"code.foss.global/serve.zone/relay/internal/backoff"
)

// The standby's side of the channel: it dials the holder's replication address, proves the key,
// names its Pod, and adopts what it is sent, acknowledging by number what it has applied (and
// every keepalive, which is also how the leader knows it is alive). After the leader's whole
// state has come (the synced marker) it removes the records the leader no longer has, and its
// copy is complete until the channel ends. A leader heard from not at all for silence is dropped.
// Copying another leader than the last one starts from nothing (each part's ForgetCopy): what the
// relay holds from its own term, or from a leader that is gone, is not the new leader's state.

// follow keeps a standby's copy of the leader's records until ctx ends. Its reconnect backoff
// starts again once a channel has given it a complete copy.
func (r *replication) follow(ctx context.Context) {
	if len(r.cfg.parts) == 0 {
		return
	}
	bo := backoff.New()
	for ctx.Err() == nil {
		holder := r.p.holder()
		if holder != "" && !r.isSelf(holder) && !r.p.leading() {
			complete, err := r.followOne(ctx, holder)
			if complete {
				bo.Reset()
			}
			if err != nil && ctx.Err() == nil {
				r.log.Debug().Err(err).Str("pod", holder).Str("outcome", reasonOf(err)).Msg("replication from the leader lost")
			}
		}
		r.mu.Lock()
		r.copyComplete = false
		r.mu.Unlock()
		r.m.complete.Set(0)
		select {
		case <-ctx.Done():
		case <-r.wake:
		case <-r.cfg.clock.After(bo.Next()):
		}
	}
}

func (r *replication) isSelf(name string) bool {
	for _, s := range r.cfg.self {
		if name == s {
			return true
		}
	}
	return false
}

// followOne copies from holder until the channel ends; complete reports whether it got as far as
// a complete copy.
func (r *replication) followOne(ctx context.Context, holder string) (complete bool, err error) {
	addr, err := r.p.address(ctx, holder)
	if err != nil {
		return false, err
	}
	d := net.Dialer{Timeout: dialTimeout}
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return false, err
	}
	defer conn.Close()
	fctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	stop := context.AfterFunc(fctx, func() { conn.Close() })
	defer stop()
	r.mu.Lock()
	r.following = conn
	r.mu.Unlock()
	defer func() {
		r.mu.Lock()
		r.following = nil
		r.mu.Unlock()
	}()
	if r.p.holder() != holder {
		return false, errors.New("ha: the holder changed")
	}
	conn.SetDeadline(time.Now().Add(handshakeTimeout))
	ch, err := handshake(conn, r.cfg.key, true)
	if err != nil {
		return false, err
	}
	ch.writeTimeout = r.cfg.writeTimeout
	if err := ch.writeFrame(helloFrame(r.cfg.pod)); err != nil {
		return false, err
	}
	conn.SetDeadline(time.Time{})
	r.heard.Store(r.cfg.clock.Now().UnixNano())
	r.startCopy(holder)
	r.log.Info().Str("pod", holder).Str("outcome", "following").Msg("copying the leader's replicated state")

	var applied atomic.Uint64
	kick := make(chan struct{}, 1)
	ends := make(chan error, 2)
	go func() { ends <- r.acknowledge(fctx, ch, &applied, kick) }()
	go func() {
		c, err := r.copyFrom(ch, holder, &applied, kick)
		complete = c
		ends <- err
	}()
	err = <-ends
	cancel(err)
	<-ends
	return complete, err
}

// startCopy readies the copy for a channel from holder: from nothing if the copy is not holder's.
func (r *replication) startCopy(holder string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.overflow = false
	if r.copiedFrom == holder {
		return
	}
	for _, p := range r.cfg.parts {
		p.Part.ForgetCopy()
	}
	clear(r.copyKeys)
	r.copyBytes, r.copiedRuns = 0, 0
	r.m.replicatedRuns.Set(0)
}

// copyFrom adopts the leader's records until the channel ends.
func (r *replication) copyFrom(ch *channel, holder string, applied *atomic.Uint64, kick chan<- struct{}) (complete bool, err error) {
	seen := make(map[string]bool)
	for {
		b, err := ch.readFrame(maxFrame)
		if err != nil {
			return complete, err
		}
		r.heard.Store(r.cfg.clock.Now().UnixNano())
		op, key, value, err := readRecord(b)
		if err != nil {
			return complete, err
		}
		switch op {
		case opPing:
			continue
		case opSynced:
			if seen == nil {
				return complete, errors.New("ha: the leader sent its whole state twice")
			}
			r.forgetUnseen(seen, holder)
			complete, seen = true, nil
		case opSet:
			if seen != nil {
				seen[key] = true
			}
			if err := r.adopt(key, value); err != nil {
				return complete, err
			}
		case opDelete:
			r.adopt(key, nil)
		}
		applied.Add(1)
		if ch.rd.Buffered() == 0 {
			select {
			case kick <- struct{}{}:
			default:
			}
		}
	}
}

// acknowledge tells the leader how many records the copy has applied: once nothing more is
// buffered, and every keepalive; it ends the channel when the leader has been silent.
func (r *replication) acknowledge(ctx context.Context, ch *channel, applied *atomic.Uint64, kick <-chan struct{}) error {
	clk := r.cfg.clock
	tick := clk.NewTicker(keepalive)
	defer tick.Stop()
	sent := uint64(0)
	for {
		ticked := false
		select {
		case <-ctx.Done():
			return context.Cause(ctx)
		case <-kick:
		case <-tick.C():
			if clk.Since(time.Unix(0, r.heard.Load())) > silence {
				return errSilent
			}
			ticked = true
		}
		if n := applied.Load(); n != sent || ticked {
			if err := ch.writeFrame(ackFrame(n)); err != nil {
				return err
			}
			sent = n
		}
	}
}

// adopt applies one record to the copy, within its bound. A record past the bound ends the
// channel (errCopyLarge): the copy is incomplete, and the older value of its key, stale now, is
// removed rather than kept.
func (r *replication) adopt(key string, value []byte) error {
	part, ok := r.partOf(key)
	if !ok {
		r.log.Warn().Str("outcome", "refused").Msg("a replicated record no part owns")
		return nil
	}
	run := r.isRun(key)
	r.mu.Lock()
	defer r.mu.Unlock()
	old, had := r.copyKeys[key]
	if value != nil && r.copyBytes-int64(old)+int64(len(value)) > r.cfg.maxCopy {
		r.overflow, r.copyComplete = true, false
		r.m.complete.Set(0)
		if had && part.Part.Adopt(key, nil) == nil {
			r.forgetLocked(key, old, run)
		}
		return fmt.Errorf("%w (%d bytes)", errCopyLarge, r.cfg.maxCopy)
	}
	if err := part.Part.Adopt(key, value); err != nil {
		r.log.Warn().Str("outcome", "refused").Msg("a replicated record does not read: " + err.Error())
		return nil
	}
	switch {
	case value == nil && had:
		r.forgetLocked(key, old, run)
	case value != nil:
		r.copyKeys[key] = len(value)
		r.copyBytes += int64(len(value) - old)
		if run && !had {
			r.copiedRuns++
		}
		r.m.replicatedRuns.Set(float64(r.copiedRuns))
	}
	return nil
}

func (r *replication) forgetLocked(key string, size int, run bool) {
	delete(r.copyKeys, key)
	r.copyBytes -= int64(size)
	if run {
		r.copiedRuns--
	}
	r.m.replicatedRuns.Set(float64(r.copiedRuns))
}

// forgetUnseen removes what the leader's whole state did not hold, and marks the copy complete.
func (r *replication) forgetUnseen(seen map[string]bool, holder string) {
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
	r.copyComplete, r.copiedFrom = !r.overflow, holder
	if r.copyComplete {
		r.m.complete.Set(1)
	}
	r.mu.Unlock()
}
