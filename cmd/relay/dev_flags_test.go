package main

import (
	"context"
	"strings"
	"testing"
	"time"
)

// TestDevRefusesBadCounts checks `relay dev`'s flag edges exit 2 naming the flag before anything
// starts: no nodes, a negative count, more than the bound, and a negative --duration (which
// would otherwise run until Ctrl-C). A case that wrongly starts is stopped after a few seconds.
func TestDevRefusesBadCounts(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--nodes", "0"}, "--nodes:"},
		{[]string{"--nodes", "-1"}, "--nodes:"},
		{[]string{"--nodes", "100001"}, "--nodes:"},
		{[]string{"--duration", "-1s"}, "--duration:"},
	} {
		t.Run(strings.Join(c.args, " "), func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
			defer cancel()
			var out, errOut strings.Builder
			code := realMain(ctx, append([]string{"dev"}, c.args...), &out, &errOut)
			if code != 2 || strings.Count(errOut.String(), "\n") != 1 || !strings.Contains(errOut.String(), c.want) {
				t.Fatalf("exit %d, stderr %.200q; want 2 and one line naming %s", code, errOut.String(), c.want)
			}
		})
	}
}
