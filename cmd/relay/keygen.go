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
