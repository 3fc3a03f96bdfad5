package main

import (
	"flag"
	"fmt"
	"io"

	"code.foss.global/serve.zone/relay/contracts"
	"code.foss.global/serve.zone/relay/vpnhub/vpnkey"
)

// cmdKeygen writes a new hub key file (0600, never overwriting) and prints its public key, or a
// new replicas' replication key file (SPEC §16), of which it prints nothing.
func cmdKeygen(args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("keygen", flag.ContinueOnError)
	path := fs.String("hub-key-file", "", "where to write the new VPN hub static key")
	replication := fs.String("replication-key-file", "", "where to write the new key the HA replicas share")
	if err := parse(fs, args); err != nil {
		return err
	}
	switch {
	case *path != "" && *replication != "":
		return usagef("--hub-key-file and --replication-key-file: one key file at a time")
	case *replication != "":
		return writeReplicationKey(*replication)
	case *path == "":
		return usagef("--hub-key-file or --replication-key-file: one is required")
	}
	k, err := vpnkey.WriteNewFile(*path)
	if err != nil {
		return err
	}
	fmt.Fprintln(stdout, contracts.EncodeKey32(k.Public))
	return nil
}

func cmdVersion(args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("version", flag.ContinueOnError)
	if err := parse(fs, args); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "relay %s (interfaces %s, accepts peers from %s)\n", buildVersion,
		contracts.InterfacesVersion, contracts.MinimumPeerVersion)
	return checkBuildVersion()
}

// checkBuildVersion refuses a binary whose build version registerClusterRelay cannot report. It
// is a build fault, not a flag: `relay version` fails too, so the Dockerfile's build fails.
func checkBuildVersion() error {
	if !contracts.IsReleaseVersion(buildVersion) {
		return fmt.Errorf("built as version %q, which is not MAJOR.MINOR.PATCH (-ldflags -X main.buildVersion; the Dockerfile's VERSION)", buildVersion)
	}
	return nil
}
