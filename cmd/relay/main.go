// Command relay is the serve.zone cluster relay. It parses flags into a configuration, wires the
// parts together and runs them; no protocol logic lives here.
//
//	relay run      the daemon (flags or SERVEZONE_RELAY_* environment)
//	relay dev      the relay plus simulated Cloudly, nodes, ingress and Corestore on loopback
//	relay check    judge a configuration (the flags of run) without dialling or binding
//	relay keygen   write a new VPN hub static key file, or show an existing one's public key
//	relay probe    GET the admin listener's /healthz: exit 0 on 200 (a HEALTHCHECK)
//	relay version  print the build and protocol versions
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"

	"code.foss.global/serve.zone/relay/relay"
)

// buildVersion is the relay build, set with -ldflags "-X main.buildVersion=…".
var buildVersion = relay.DefaultBuildVersion

const usage = `usage: relay <command> [flags]

commands:
  run       run the cluster relay (flags also read SERVEZONE_RELAY_<FLAG>)
  check     judge a configuration (the flags of run) without dialling or binding; exit 0 when valid
  dev       run the relay with simulated Cloudly, nodes, ingress and Corestore on loopback
  keygen    write a new VPN hub static key file (--hub-key-file), or print the public key of one (--show)
  probe     GET the admin listener's /healthz; exit 0 on 200, else 1 (the image's HEALTHCHECK)
  version   print the build and protocol versions

"relay <command> -h" lists a command's flags.
`

func main() {
	os.Exit(realMain(context.Background(), os.Args[1:], os.Stdout, os.Stderr))
}

// realMain runs one command and returns the exit status: 0 done, 1 failed, 2 bad usage (a bad
// flag, a missing or unreadable file, a missing required value), with one line naming it.
func realMain(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return 2
	}
	cmd, rest := args[0], args[1:]
	var err error
	switch cmd {
	case "run":
		err = cmdRun(ctx, rest, stderr)
	case "check":
		err = cmdCheck(rest, stdout, stderr)
	case "probe":
		err = cmdProbe(ctx, rest, stdout)
	case "dev":
		err = cmdDev(ctx, rest, stdout, stderr)
	case "keygen":
		err = cmdKeygen(rest, stdout, stderr)
	case "version":
		err = cmdVersion(rest, stdout)
	case "help", "-h", "--help":
		fmt.Fprint(stdout, usage)
		return 0
	default:
		fmt.Fprintf(stderr, "relay: unknown command %q (run, check, dev, keygen, probe, version)\n", cmd)
		return 2
	}
	var ue *usageError
	var ce *relay.ConfigError
	var he *helpError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &he):
		fmt.Fprint(stdout, he.text)
		return 0
	case errors.As(err, &ue), errors.As(err, &ce):
		fmt.Fprintf(stderr, "relay %s: %v\n", cmd, err)
		return 2
	default:
		fmt.Fprintf(stderr, "relay %s: %v\n", cmd, err)
		return 1
	}
}
