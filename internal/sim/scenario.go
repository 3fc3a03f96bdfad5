package sim

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"
	"golang.org/x/sync/errgroup"
)

// Counts are what the simulated peers observed during a scenario: answers they received, not the
// relay's own counters.
type Counts struct {
	Nodes          int64 // nodes whose registration was accepted
	Requests       int64 // requests answered end to end, both directions
	VPNPackets     int64 // packets delivered between VPN clients
	EscrowReleased int64 // DNS lease renewals nodes admitted from escrow
	RouteTables    int64 // route tables the ingress received
	Restores       int64 // isolated restores completed end to end
}

// Summary is the one line `relay dev` ends with.
func (c Counts) Summary() string {
	return fmt.Sprintf("nodes=%d requests=%d vpnPackets=%d escrowReleased=%d routeTables=%d restores=%d",
		c.Nodes, c.Requests, c.VPNPackets, c.EscrowReleased, c.RouteTables, c.Restores)
}

// Scenario drives real traffic through a relay: nodes register, report to Cloudly, and Cloudly
// pushes to them. Parts whose issue has not landed are reported as not yet.
type Scenario struct {
	Nodes    int
	Cloudly  *Cloudly
	RelayURL string // ws:// URL of the relay's downstream listener
	Log      zerolog.Logger

	counts struct {
		nodes, requests, vpn, escrow, routes, restores atomic.Int64
	}
}

// NotYet lists the scenario's parts that are not built yet.
var NotYet = []string{"vpn", "escrow", "route tables", "restore"}

// Snapshot reads the counts so far.
func (s *Scenario) Snapshot() Counts {
	return Counts{s.counts.nodes.Load(), s.counts.requests.Load(), s.counts.vpn.Load(),
		s.counts.escrow.Load(), s.counts.routes.Load(), s.counts.restores.Load()}
}

// Run connects and registers the nodes, then drives traffic until ctx ends.
func (s *Scenario) Run(ctx context.Context) error {
	nodes := make([]*Node, s.Nodes)
	var g errgroup.Group
	g.SetLimit(64)
	for i := range nodes {
		n := NewNode(fmt.Sprintf("node-%03d", i), s.Log)
		nodes[i] = n
		g.Go(func() error {
			if err := n.Connect(ctx, s.RelayURL); err != nil {
				return err
			}
			rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			defer cancel()
			if _, err := n.Register(rctx); err != nil {
				return fmt.Errorf("node %s register: %w", n.ID, err)
			}
			s.counts.nodes.Add(1)
			return nil
		})
	}
	defer func() {
		for _, n := range nodes {
			if n != nil && n.Conn() != nil {
				n.Close()
			}
		}
	}()
	if err := g.Wait(); err != nil {
		return err
	}
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	var wg sync.WaitGroup
	defer wg.Wait()
	for seq := 1; ; seq++ {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
		for _, n := range nodes {
			wg.Add(2)
			go func() {
				defer wg.Done()
				cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
				defer cancel()
				if _, err := n.Report(cctx, "reportRuntimeAssignmentObservation", map[string]any{"sequence": seq}); err == nil {
					s.counts.requests.Add(1)
				}
			}()
			go func() {
				defer wg.Done()
				cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
				defer cancel()
				body, _ := json.Marshal(map[string]any{"session": map[string]any{"nodeId": n.ID}, "assignment": map[string]any{"sequence": seq}})
				if _, err := s.Cloudly.Call(cctx, "readRuntimeAssignmentStats", body); err == nil {
					s.counts.requests.Add(1)
				}
			}()
		}
	}
}
