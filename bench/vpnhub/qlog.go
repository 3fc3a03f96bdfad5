package main

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"

	"github.com/quic-go/quic-go"
	"github.com/quic-go/quic-go/qlog"
	"github.com/quic-go/quic-go/qlogwriter"
)

// quicDrops counts the losses quic-go sees but does not report elsewhere: DATAGRAM frames it
// dropped (its 128-datagram receive queue overflowing, or a frame that did not fit) and packets
// its loss detection declared lost. Installed only with -quic-drops: tracing costs an event per
// packet.
type quicDrops struct {
	mu     sync.Mutex
	counts map[string]int
}

func newQUICDrops() *quicDrops { return &quicDrops{counts: map[string]int{}} }

func (q *quicDrops) tracer(context.Context, bool, quic.ConnectionID) qlogwriter.Trace { return q }

func (q *quicDrops) AddProducer() qlogwriter.Recorder { return q }
func (q *quicDrops) Close() error                     { return nil }

func (q *quicDrops) RecordEvent(e qlogwriter.Event) {
	var key string
	switch ev := e.(type) {
	case qlog.DatagramDropped:
		key = "datagram_dropped:" + ev.Trigger
	case qlog.PacketLost:
		key = "packet_lost"
	default:
		return
	}
	q.mu.Lock()
	q.counts[key]++
	q.mu.Unlock()
}

func (q *quicDrops) String() string {
	q.mu.Lock()
	defer q.mu.Unlock()
	b, _ := json.Marshal(q.counts)
	return fmt.Sprintf("quic-go: %s", b)
}
