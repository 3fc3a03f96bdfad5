// Command relay-dev is the demo: a relay wired as `relay run` wires it (package daemon), with a
// simulated Cloudly, nodes, ingress and Corestore on loopback, and with --replicas N several relays
// elected through a Lease on a test Kubernetes API server. It is a command of its own so that the
// daemon links none of this test support.
//
//	go run ./cmd/relay-dev [--nodes 20] [--duration 0] [--replicas 1]
package main

import (
	"context"
	"io"
	"os"

	"code.foss.global/serve.zone/relay/daemon"
)

func main() {
	os.Exit(realMain(context.Background(), os.Args[1:], os.Stdout, os.Stderr))
}

// realMain runs the demo until ctx ends or --duration passes and returns the exit status as the
// relay's commands do: 0 done, 1 failed, 2 bad usage, with one line naming it.
func realMain(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	return daemon.Exit("relay-dev", cmdDev(ctx, args, stdout, stderr), stdout, stderr)
}
