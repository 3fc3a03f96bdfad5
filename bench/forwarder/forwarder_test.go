package main

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"golang.org/x/sync/errgroup"

	"code.foss.global/serve.zone/relay/testenv/sim"
)

// TestForwardsEveryNodesCalls: nodes whose ids collide on the shared upstream socket (each counts
// from 1) register and call through the forwarder at once, and every answer reaches the node that
// asked; the simulated peers judge every frame.
func TestForwardsEveryNodesCalls(t *testing.T) {
	c, err := sim.NewCloudly(zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.AcceptNodesDirectly()
	addr, _, err := start("127.0.0.1:0", c.URL())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var g errgroup.Group
	for i := range 8 {
		g.Go(func() error {
			n := sim.NewNode(fmt.Sprintf("node-%d", i), zerolog.Nop())
			if err := n.Connect(ctx, "ws://"+addr.String()+"/"); err != nil {
				return err
			}
			defer n.Close()
			if _, err := n.Register(ctx); err != nil {
				return fmt.Errorf("%s: register: %w", n.ID, err)
			}
			body := json.RawMessage(fmt.Sprintf(`{"session":{"nodeId":%q},"observation":{"sequence":1}}`, n.ID))
			for range 50 {
				resp, err := n.Call(ctx, "reportRuntimeAssignmentObservation", body)
				if err != nil || string(resp) != `{"accepted":true}` {
					return fmt.Errorf("%s: %s %v", n.ID, resp, err)
				}
			}
			if v := n.Violations(); len(v) > 0 {
				return fmt.Errorf("%s: %v", n.ID, v)
			}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		t.Fatal(err)
	}
	if v := c.Violations(); len(v) > 0 {
		t.Fatalf("Cloudly saw %v", v)
	}
}
