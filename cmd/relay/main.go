// Command relay is the serve.zone cluster relay: `relay run` is the daemon, and `relay check`,
// `keygen`, `probe` and `version` the tools beside it (package daemon). It links no test support:
// the demo with simulated peers is cmd/relay-dev.
package main

import (
	"context"
	"os"

	"code.foss.global/serve.zone/relay/daemon"
	"code.foss.global/serve.zone/relay/relay"
)

// buildVersion is the relay build, set with -ldflags "-X main.buildVersion=…".
var buildVersion = relay.DefaultBuildVersion

func main() {
	os.Exit(daemon.Main(context.Background(), buildVersion, os.Args[1:], os.Stdout, os.Stderr))
}
