package daemon

import (
	"flag"
	"fmt"
	"io"

	"code.foss.global/serve.zone/relay/contracts"
)

func cmdVersion(version string, args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("version", flag.ContinueOnError)
	if _, err := parse(fs, args); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "relay %s (interfaces %s, accepts peers from %s)\n", version,
		contracts.InterfacesVersion, contracts.MinimumPeerVersion)
	return checkBuildVersion(version)
}

// checkBuildVersion refuses a binary whose build version registerClusterRelay cannot report. It
// is a build fault, not a flag: `relay version` fails too, so the Dockerfile's build fails.
func checkBuildVersion(version string) error {
	if !contracts.IsReleaseVersion(version) {
		return fmt.Errorf("built as version %q, which is not MAJOR.MINOR.PATCH (-ldflags -X main.buildVersion; the Dockerfile's VERSION)", version)
	}
	return nil
}
