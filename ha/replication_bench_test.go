package ha

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"code.foss.global/serve.zone/relay/testenv/await"
)

// BenchmarkReplicationAck measures how long a hold waits for its acknowledgement: a leader
// holding 1 000 nodes' runs (each record the size of a held run's snapshot, ~1.8 KB), one
// standby following it over real TCP loopback and Noise, and each iteration one node's run
// changed and synced — from the change to the standby's acknowledgement answering the hold.
//
//	go test -run '^$' -bench ReplicationAck -benchtime 2000x ./ha/
func BenchmarkReplicationAck(b *testing.B) {
	const nodes = 1000
	part := newMemPart()
	record := strings.Repeat("r", 1800)
	for i := range nodes {
		part.set(fmt.Sprintf("run/node-%04d", i), record)
	}
	leader := startLeader(b, nil, part, nil)
	copyOf := newMemPart()
	standby := startStandby(b, nil, copyOf, leader.addr(), "relay-b")
	await.Until(b, "the standby's copy of 1 000 runs", waitFor, func() bool {
		f := leader.feedOf("relay-b")
		return standby.r.complete() && f != nil && f.isReady()
	})
	answered := make(chan bool, 1)
	done := func(ok bool) { answered <- ok }
	lat := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for i := range b.N {
		at := time.Now()
		part.set(fmt.Sprintf("run/node-%04d", i%nodes), record+fmt.Sprint(i))
		leader.r.sync(done)
		if ok := <-answered; !ok {
			b.Fatalf("hold %d answered unreplicated", i)
		}
		lat = append(lat, time.Since(at))
	}
	b.StopTimer()
	slices.Sort(lat)
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "ack-p50-µs")
	b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "ack-p99-µs")
	b.ReportMetric(float64(lat[len(lat)-1].Microseconds()), "ack-max-µs")
}
