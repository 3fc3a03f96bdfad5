package daemon

import (
	"flag"
	"fmt"
	"io"

	"code.foss.global/serve.zone/relay/contracts"
	"code.foss.global/serve.zone/relay/vpnhub/vpnkey"
)

// cmdKeygen writes a new hub key file (0600, never overwriting) and prints its public key,
// labelled; or a new replicas' replication key file (docs/ha.md), of which it prints nothing; or,
// with --show, prints the public key of an existing hub key file. A private key is never printed.
func cmdKeygen(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("keygen", flag.ContinueOnError)
	path := fs.String("hub-key-file", "", "where to write the new VPN hub static key")
	replication := fs.String("replication-key-file", "", "where to write the new key the HA replicas share")
	show := fs.String("show", "", "print the public key of this existing VPN hub key file")
	if _, err := parse(fs, args); err != nil {
		return err
	}
	n := 0
	for _, s := range []string{*path, *replication, *show} {
		if s != "" {
			n++
		}
	}
	switch {
	case n > 1:
		return Usagef("--hub-key-file, --replication-key-file and --show: one at a time")
	case *replication != "":
		return WriteReplicationKey(*replication)
	case *show != "":
		k, err := vpnkey.LoadFile(*show, NewLogger("warn", "console", stderr))
		if err != nil {
			return Usagef("--show: %v", err)
		}
		printPublic(stdout, *show, k)
		return nil
	case *path == "":
		return Usagef("--hub-key-file, --replication-key-file or --show: one is required")
	}
	k, err := vpnkey.WriteNewFile(*path)
	if err != nil {
		return err
	}
	printPublic(stdout, *path, k)
	return nil
}

// printPublic labels a hub key's public half and the file holding the private half.
func printPublic(w io.Writer, path string, k vpnkey.Pair) {
	fmt.Fprintf(w, "VPN hub key file: %s (the private key stays in it)\npublic key: %s\n", path, contracts.EncodeKey32(k.Public))
}
