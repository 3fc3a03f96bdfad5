package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"

	"code.foss.global/serve.zone/relay/relay"
)

// usageError is a command line that cannot run: exit status 2 with one line naming what is wrong.
type usageError struct{ msg string }

func (e *usageError) Error() string { return e.msg }

func usagef(format string, args ...any) error { return &usageError{fmt.Sprintf(format, args...)} }

// helpError is -h or --help: exit status 0 with the command's flags on standard output.
type helpError struct{ text string }

func (e *helpError) Error() string { return "help requested" }
func (e *helpError) Unwrap() error { return flag.ErrHelp }

// helpText lists every flag of fs with its default and its environment variable, so that an
// operator with only the binary (the image carries no docs) can see what a command takes.
func helpText(fs *flag.FlagSet) string {
	var b strings.Builder
	fmt.Fprintf(&b, "usage: relay %s [flags]\n", fs.Name())
	if !hasFlags(fs) {
		return b.String()
	}
	b.WriteString("\nflags (each also read from its environment variable; a flag given wins):\n")
	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	fs.VisitAll(func(f *flag.Flag) {
		def := ""
		if f.DefValue != "" && f.DefValue != "0" && f.DefValue != "0s" && f.DefValue != "false" {
			def = " (default " + f.DefValue + ")"
		}
		fmt.Fprintf(tw, "  --%s\t%s\t%s%s\n", f.Name, envName(f.Name), f.Usage, def)
	})
	tw.Flush()
	return b.String()
}

func hasFlags(fs *flag.FlagSet) bool {
	n := 0
	fs.VisitAll(func(*flag.Flag) { n++ })
	return n > 0
}

// envName is the environment variable that supplies a flag: SERVEZONE_RELAY_<FLAG_IN_UPPER_SNAKE>.
func envName(flagName string) string {
	return "SERVEZONE_RELAY_" + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

// parse parses args into fs, then fills every flag not given on the command line from its
// environment variable. Errors are one line naming the flag.
func parse(fs *flag.FlagSet, args []string) error {
	fs.SetOutput(io.Discard)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return &helpError{text: helpText(fs)}
		}
		msg := err.Error()
		if name, ok := strings.CutPrefix(msg, "flag provided but not defined: -"); ok {
			msg = "unknown flag --" + strings.TrimPrefix(name, "-")
		}
		return usagef("%s", msg)
	}
	if fs.NArg() > 0 {
		return usagef("unexpected argument %q", fs.Arg(0))
	}
	given := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	var err error
	fs.VisitAll(func(f *flag.Flag) {
		if err != nil || given[f.Name] {
			return
		}
		if v, ok := os.LookupEnv(envName(f.Name)); ok {
			if serr := fs.Set(f.Name, v); serr != nil {
				err = usagef("--%s (from %s): invalid value", f.Name, envName(f.Name))
			}
		}
	})
	return err
}

// runFlags defines every flag of `relay run` (SPEC §11) on fs, writing into cfg.
func runFlags(fs *flag.FlagSet, cfg *relay.Config) {
	fs.StringVar(&cfg.ClusterID, "cluster-id", "", "the cluster this relay serves")
	fs.StringVar(&cfg.NodeID, "node-id", "", "the cluster node the relay runs on")
	fs.StringVar(&cfg.CloudlyURL, "cloudly-url", "", "Cloudly's WebSocket URL (wss://…)")
	fs.StringVar(&cfg.CloudlyTokenFile, "cloudly-token-file", "", "file holding the relay's machine JWT")
	fs.StringVar(&cfg.CloudlyCAFile, "cloudly-ca-file", "", "extra CA certificates (PEM) for Cloudly")
	fs.StringVar(&cfg.CorestoreCAFile, "corestore-ca-file", "", "extra CA certificates (PEM) for node Corestores")
	fs.StringVar(&cfg.RegistryCAFile, "registry-ca-file", "", "extra CA certificates (PEM) for the registry upstream")
	fs.StringVar(&cfg.Listen, "listen", relay.DefaultListen, "downstream HTTPS/WebSocket listen address")
	fs.StringVar(&cfg.AdvertiseAddress, "advertise-address", "", "IPv4 address nodes reach the relay on")
	fs.StringVar(&cfg.TLSCertFile, "tls-cert-file", "", "downstream TLS certificate (PEM)")
	fs.StringVar(&cfg.TLSKeyFile, "tls-key-file", "", "downstream TLS private key (PEM)")
	fs.BoolVar(&cfg.InsecurePlaintext, "insecure-plaintext", false, "allow ws:// and plain HTTP (development only)")
	fs.StringVar(&cfg.HubListen, "hub-listen", "", "VPN hub UDP listen address (empty: hub off)")
	fs.StringVar(&cfg.HubKeyFile, "hub-key-file", "", "VPN hub static key file (created 0600 when missing)")
	fs.StringVar(&cfg.HubAdvertiseAddress, "hub-advertise-address", "", "IPv4 address the hub report names, when not the bound one (several relays behind one Service)")
	fs.StringVar(&cfg.RegistryUpstream, "registry-upstream", "", "registry /v2/ is forwarded to (empty: off)")
	fs.StringVar(&cfg.RegistryCacheDir, "registry-cache-dir", "", "digest cache directory for registry forwarding")
	fs.Int64Var(&cfg.RegistryCacheMaxBytes, "registry-cache-max-bytes", relay.DefaultRegistryCacheMaxBytes,
		"bound of the registry digest cache; least recently used objects are evicted beyond it")
	fs.StringVar(&cfg.AdminListen, "admin-listen", relay.DefaultAdminListen, "admin listen address (/metrics, /healthz, /readyz)")
	fs.BoolVar(&cfg.AdminPprof, "admin-pprof", false, "serve net/http/pprof under /debug/pprof/ on the admin listener")
	fs.Int64Var(&cfg.MaxMessageBytes, "max-message-bytes", relay.DefaultMaxMessageBytes, "largest WebSocket message after registration")
	fs.Int64Var(&cfg.PeerMemoryBytes, "peer-memory-bytes", relay.DefaultPeerMemoryBytes,
		"budget of bytes held for downstream peers (queued answers, requests, stream frames, registrations)")
	fs.IntVar(&cfg.MaxUnregisteredPerSource, "max-unregistered-per-source", relay.DefaultMaxUnregisteredPerSource,
		"connections from one address that have not registered (0: no limit, where nodes share one translated address)")
	fs.StringVar(&cfg.LogLevel, "log-level", "info", "debug, info, warn or error")
	fs.StringVar(&cfg.LogFormat, "log-format", "json", "json or console")
}
