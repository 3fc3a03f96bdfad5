// Package daemon is the relay command: it parses flags into a configuration, wires the parts
// together and runs them; no protocol logic lives here. cmd/relay is its main; the demo
// (cmd/relay-dev) builds its relays with BuildParts, as `relay run` does. Nothing here imports
// test support, so the binary operators deploy carries none.
//
//	relay run      the daemon (flags or SERVEZONE_RELAY_* environment)
//	relay check    judge a configuration (the flags of run) without dialling or binding
//	relay keygen   write a new VPN hub static key file, or show an existing one's public key
//	relay probe    GET the admin listener's /healthz: exit 0 on 200 (a HEALTHCHECK)
//	relay version  print the build and protocol versions
package daemon

import (
	"context"
	"errors"
	"fmt"
	"io"

	"code.foss.global/serve.zone/relay/relay"
)

const usage = `usage: relay <command> [flags]

commands:
  run       run the cluster relay (flags also read SERVEZONE_RELAY_<FLAG>)
  check     judge a configuration (the flags of run) without dialling or binding; exit 0 when valid
  keygen    write a new VPN hub static key file (--hub-key-file), or print the public key of one (--show)
  probe     GET the admin listener's /healthz; exit 0 on 200, else 1 (the image's HEALTHCHECK)
  version   print the build and protocol versions

"relay <command> -h" lists a command's flags. The demo with simulated peers is a command of its
own, not part of this binary: go run ./cmd/relay-dev
`

// devMoved is what `relay-dev` says: the demo left the daemon, which carries no simulated peers.
const devMoved = "the demo is a command of its own, not part of the daemon: go run ./cmd/relay-dev (same flags)"

// Main runs one command of the relay built as version and returns the exit status: 0 done, 1
// failed, 2 bad usage (a bad flag, a missing or unreadable file, a missing required value), with
// one line naming it.
func Main(ctx context.Context, version string, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return 2
	}
	cmd, rest := args[0], args[1:]
	var err error
	switch cmd {
	case "run":
		err = cmdRun(ctx, version, rest, stderr)
	case "check":
		err = cmdCheck(version, rest, stdout, stderr)
	case "probe":
		err = cmdProbe(ctx, rest, stdout)
	case "dev":
		err = Usagef("%s", devMoved)
	case "keygen":
		err = cmdKeygen(rest, stdout, stderr)
	case "version":
		err = cmdVersion(version, rest, stdout)
	case "help", "-h", "--help":
		fmt.Fprint(stdout, usage)
		return 0
	default:
		fmt.Fprintf(stderr, "relay: unknown command %q (run, check, keygen, probe, version)\n", cmd)
		return 2
	}
	return Exit("relay "+cmd, err, stdout, stderr)
}

// Exit is the exit status of a command named name that returned err, with what it says: 0 and
// nothing for nil, 0 and the help text for -h, 2 and one line for a usage or configuration error,
// 1 and one line otherwise.
func Exit(name string, err error, stdout, stderr io.Writer) int {
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
		fmt.Fprintf(stderr, "%s: %v\n", name, err)
		return 2
	default:
		fmt.Fprintf(stderr, "%s: %v\n", name, err)
		return 1
	}
}
