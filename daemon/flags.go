package daemon

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"regexp"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"code.foss.global/serve.zone/relay/relay"
)

// usageError is a command line that cannot run: exit status 2 with one line naming what is wrong.
type usageError struct{ msg string }

func (e *usageError) Error() string { return e.msg }

// Usagef is a usage error: Exit gives it status 2 and prints it as one line.
func Usagef(format string, args ...any) error { return &usageError{fmt.Sprintf(format, args...)} }

// helpError is -h or --help: exit status 0 with the command's flags on standard output.
type helpError struct{ text string }

func (e *helpError) Error() string { return "help requested" }
func (e *helpError) Unwrap() error { return flag.ErrHelp }

// rules are what a command says about its flags beyond each flag's own value: which are required
// (always, or unless or with another flag), and which mean nothing without another flag. Help
// shows them; checkRules enforces them, every missing required flag in one error.
type rules struct {
	required []requirement
	needs    map[string]string // flag → the flag it needs; set without it, the flag would be ignored
}

// requirement is a flag that must be given; unless names a boolean flag that waives it, with a
// flag that makes it required only when that flag is given.
type requirement struct{ flag, unless, with string }

// commandRules are the rules of each command by its flag set's name.
var commandRules = map[string]*rules{"run": &runRules, "check": &runRules}

var runRules = rules{
	required: []requirement{{flag: "cluster-id"}, {flag: "node-id"}, {flag: "cloudly-url"}, {flag: "cloudly-token-file"},
		{flag: "advertise-address"}, {flag: "tls-cert-file", unless: "insecure-plaintext"}, {flag: "tls-key-file", unless: "insecure-plaintext"},
		{flag: "hub-key-file", with: "hub-listen"}, {flag: "ha-replication-key-file", with: "ha-lease-name"}},
	needs: map[string]string{
		"registry-cache-dir": "registry-upstream", "registry-cache-max-bytes": "registry-upstream", "registry-ca-file": "registry-upstream",
		"hub-key-file": "hub-listen", "hub-advertise-address": "hub-listen",
		"ha-lease-namespace": "ha-lease-name", "ha-identity": "ha-lease-name", "ha-lease-duration": "ha-lease-name",
		"ha-renew-deadline": "ha-lease-name", "ha-retry-period": "ha-lease-name", "kubeconfig": "ha-lease-name",
		"ha-replication-listen": "ha-lease-name", "ha-replication-key-file": "ha-lease-name",
	},
}

// note is what help says of name's requirements: "required", "required unless --x", "needs --y".
func (r *rules) note(name string) string {
	if r == nil {
		return ""
	}
	var parts []string
	for _, q := range r.required {
		switch {
		case q.flag != name:
		case q.unless != "":
			parts = append(parts, "required unless --"+q.unless)
		case q.with != "":
			parts = append(parts, "required with --"+q.with)
		default:
			parts = append(parts, "required")
		}
	}
	if n, ok := r.needs[name]; ok && !strings.Contains(strings.Join(parts, ""), "--"+n) {
		parts = append(parts, "needs --"+n)
	}
	return strings.Join(parts, ", ")
}

// given reports whether fs's flag name holds a value: non-empty, and true for a boolean flag.
func given(fs *flag.FlagSet, name string) bool {
	f := fs.Lookup(name)
	if f == nil {
		return false
	}
	v := f.Value.String()
	return v != "" && v != "false"
}

// check enforces r on fs after parse: every missing required flag in one error, then the first
// flag set (on the command line or by its variable) without the flag it needs.
func (r *rules) check(fs *flag.FlagSet, src sources) error {
	var missing []string
	waived := ""
	for _, q := range r.required {
		if given(fs, q.flag) || q.unless != "" && given(fs, q.unless) || q.with != "" && !given(fs, q.with) {
			continue
		}
		missing = append(missing, "--"+q.flag)
		if q.unless != "" {
			waived = fmt.Sprintf(" (--%s: not needed with --%s)", strings.Join(r.waivedBy(q.unless), ", --"), q.unless)
		}
	}
	switch len(missing) {
	case 0:
	case 1:
		return Usagef("missing required flag %s%s; a flag can also come from its SERVEZONE_RELAY_* variable", missing[0], waived)
	default:
		return Usagef("missing required flags %s%s; each can also come from its SERVEZONE_RELAY_* variable",
			strings.Join(missing, ", "), waived)
	}
	var err error
	fs.VisitAll(func(f *flag.Flag) {
		if n, ok := r.needs[f.Name]; ok && err == nil && src.set(f.Name) && !given(fs, n) {
			err = Usagef("%s needs --%s; without it --%s would be ignored", src.name(f.Name), n, f.Name)
		}
	})
	return err
}

// waivedBy lists the required flags that flag waives.
func (r *rules) waivedBy(flag string) []string {
	var out []string
	for _, q := range r.required {
		if q.unless == flag {
			out = append(out, q.flag)
		}
	}
	return out
}

// helpText lists every flag of fs with its default and its environment variable, so that an
// operator with only the binary (the image carries no docs) can see what a command takes.
func helpText(fs *flag.FlagSet) string {
	var b strings.Builder
	prog := "relay " + fs.Name()
	if strings.HasPrefix(fs.Name(), "relay") {
		prog = fs.Name() // a command of its own, such as relay-dev
	}
	fmt.Fprintf(&b, "usage: %s [flags]\n", prog)
	if !hasFlags(fs) {
		return b.String()
	}
	b.WriteString("\nflags (each also read from its environment variable; a flag given wins):\n")
	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	r := commandRules[fs.Name()]
	fs.VisitAll(func(f *flag.Flag) {
		def := ""
		if f.DefValue != "" && f.DefValue != "0" && f.DefValue != "0s" && f.DefValue != "false" {
			def = " (default " + f.DefValue + ")"
		}
		if n := r.note(f.Name); n != "" {
			def += " [" + n + "]"
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

// sources records where each flag given came from: "" the command line, else the value of its
// environment variable.
type sources map[string]*string

func (s sources) set(name string) bool { _, ok := s[name]; return ok }

// name is how an error names flag: "--flag", or "--flag (from VAR="value")" when its variable
// set it. A value that may carry credentials is never quoted.
func (s sources) name(flag string) string {
	v, ok := s[flag]
	if !ok || v == nil {
		return "--" + flag
	}
	if mayHoldCredentials[flag] {
		return fmt.Sprintf("--%s (from %s; its value is not shown: a URL may carry credentials)", flag, envName(flag))
	}
	return fmt.Sprintf("--%s (from %s=%q)", flag, envName(flag), *v)
}

// mayHoldCredentials are the flags whose values errors never quote.
var mayHoldCredentials = map[string]bool{"cloudly-url": true, "registry-upstream": true}

// explain rewrites a *relay.ConfigError about a flag its variable set so that it names the
// variable and the value; other errors pass unchanged.
func (s sources) explain(err error) error {
	var ce *relay.ConfigError
	if errors.As(err, &ce) && s[ce.Flag] != nil {
		return Usagef("%s: %s", s.name(ce.Flag), ce.Reason)
	}
	return err
}

// flagSetError is what the flag package says of a value it could not set.
var flagSetError = regexp.MustCompile(`^invalid (?:boolean )?value "(.*)" for (?:flag )?-(\S+): `)

// Parse is parse for commands that do not ask where each flag came from (the demo's).
func Parse(fs *flag.FlagSet, args []string) error {
	_, err := parse(fs, args)
	return err
}

// parse parses args into fs, then fills every flag not given on the command line from its
// environment variable. Errors are one line naming the flag, the value and the rule it breaks,
// and for a value from the environment the variable too. It returns where each flag given came
// from.
func parse(fs *flag.FlagSet, args []string) (sources, error) {
	fs.SetOutput(io.Discard)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil, &helpError{text: helpText(fs)}
		}
		msg := err.Error()
		if name, ok := strings.CutPrefix(msg, "flag provided but not defined: -"); ok {
			msg = "unknown flag --" + strings.TrimPrefix(name, "-")
		} else if m := flagSetError.FindStringSubmatch(msg); m != nil {
			if f := fs.Lookup(m[2]); f != nil {
				msg = fmt.Sprintf("--%s=%q: %s", f.Name, m[1], ruleOf(f.Value))
			}
		} else if name, ok := strings.CutPrefix(msg, "flag needs an argument: -"); ok {
			msg = "--" + strings.TrimPrefix(name, "-") + " needs a value"
		}
		return nil, Usagef("%s", msg)
	}
	if fs.NArg() > 0 {
		return nil, Usagef("unexpected argument %q", fs.Arg(0))
	}
	src := sources{}
	fs.Visit(func(f *flag.Flag) { src[f.Name] = nil })
	var err error
	fs.VisitAll(func(f *flag.Flag) {
		if err != nil || src.set(f.Name) {
			return
		}
		if v, ok := os.LookupEnv(envName(f.Name)); ok {
			src[f.Name] = &v
			if serr := fs.Set(f.Name, v); serr != nil {
				err = Usagef("%s: %s", src.name(f.Name), ruleOf(f.Value))
			}
		}
	})
	return src, err
}

// ruleOf is the rule a flag's value follows, for errors about a value that breaks it.
func ruleOf(v flag.Value) string {
	if r, ok := v.(interface{ rule() string }); ok {
		return r.rule()
	}
	if g, ok := v.(flag.Getter); ok {
		switch g.Get().(type) {
		case bool:
			return "must be true or false"
		case time.Duration:
			return "must be a duration with its unit, such as 500ms, 6s or 2m"
		case int, int64, uint, uint64:
			return "must be a whole number"
		}
	}
	return "invalid value"
}

// byteSize is the value of every size flag: a number of bytes, plain or with a binary unit
// (8MiB, 256MiB, 10GiB), as the docs write sizes.
type byteSize struct{ p *int64 }

func bytesVar(fs *flag.FlagSet, p *int64, name string, def int64, usage string) {
	*p = def
	fs.Var(byteSize{p}, name, usage)
}

var byteUnits = []struct {
	suffix string
	shift  uint
}{{"TiB", 40}, {"GiB", 30}, {"MiB", 20}, {"KiB", 10}, {"B", 0}}

func (b byteSize) rule() string {
	return "must be a number of bytes, plain or with a unit: 65536, 64KiB, 8MiB, 10GiB (KiB, MiB, GiB, TiB: powers of 1024)"
}

// String is the size in its largest whole unit: 8MiB, 10GiB, 65537.
func (b byteSize) String() string {
	if b.p == nil {
		return "0"
	}
	n := *b.p
	for _, u := range byteUnits[:4] {
		if n != 0 && n%(1<<u.shift) == 0 {
			return strconv.FormatInt(n>>u.shift, 10) + u.suffix
		}
	}
	return strconv.FormatInt(n, 10)
}

func (b byteSize) Set(s string) error {
	n, err := parseBytes(s)
	if err != nil {
		return err
	}
	*b.p = n
	return nil
}

func (b byteSize) Get() any { return *b.p }

// parseBytes reads "65536", "64KiB", "8 MiB", "10GiB".
func parseBytes(s string) (int64, error) {
	num, shift := strings.TrimSpace(s), uint(0)
	for _, u := range byteUnits {
		if rest, ok := strings.CutSuffix(num, u.suffix); ok {
			num, shift = strings.TrimSpace(rest), u.shift
			break
		}
	}
	n, err := strconv.ParseInt(num, 10, 64)
	if err != nil || n < 0 || n > (1<<62)>>shift {
		return 0, errors.New("not a size")
	}
	return n << shift, nil
}

// byteRate is the value of a rate flag: a size a second, "/s" optional (32KiB/s, 32768).
type byteRate struct{ byteSize }

func rateVar(fs *flag.FlagSet, p *int64, name string, def int64, usage string) {
	*p = def
	fs.Var(byteRate{byteSize{p}}, name, usage)
}

func (b byteRate) rule() string {
	return "must be bytes a second, plain or with a unit: 32768, 32KiB/s, 1MiB/s (KiB, MiB, GiB, TiB: powers of 1024)"
}

func (b byteRate) String() string { return b.byteSize.String() + "/s" }

func (b byteRate) Set(s string) error {
	return b.byteSize.Set(strings.TrimSuffix(strings.TrimSpace(s), "/s"))
}

// runFlags defines every flag of `relay run` (docs/operating.md#flags-and-environment) on fs, writing into cfg.
func runFlags(fs *flag.FlagSet, cfg *Config) {
	fs.StringVar(&cfg.ClusterID, "cluster-id", "", "the cluster this relay serves (a canonical identifier: a letter or digit, then up to 199 of A-Z a-z 0-9 : . _ -)")
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
	bytesVar(fs, &cfg.RegistryCacheMaxBytes, "registry-cache-max-bytes", defaultRegistryCacheMaxBytes,
		"bound of the registry digest cache; least recently used objects are evicted beyond it")
	fs.StringVar(&cfg.AdminListen, "admin-listen", relay.DefaultAdminListen, "admin listen address (/metrics, /healthz, /readyz)")
	fs.BoolVar(&cfg.AdminPprof, "admin-pprof", false, "serve net/http/pprof under /debug/pprof/ on the admin listener")
	bytesVar(fs, &cfg.MaxMessageBytes, "max-message-bytes", relay.DefaultMaxMessageBytes, "largest WebSocket message after registration")
	bytesVar(fs, &cfg.PeerMemoryBytes, "peer-memory-bytes", relay.DefaultPeerMemoryBytes,
		"budget of bytes held for downstream peers (queued answers, requests, stream frames, registrations)")
	fs.IntVar(&cfg.MaxUnregisteredPerSource, "max-unregistered-per-source", relay.DefaultMaxUnregisteredPerSource,
		"connections from one address that have not registered (0: no limit, where nodes share one translated address)")
	fs.DurationVar(&cfg.FirstFrameTimeout, "first-frame-timeout", relay.DefaultFirstFrameTimeout,
		"an unregistered connection's first message arrives whole within this of its start, or the connection is closed")
	rateVar(fs, &cfg.MinFrameRate, "min-frame-rate", relay.DefaultMinFrameRate,
		"every message of an unregistered connection arrives at this rate or faster, or the connection is closed")
	fs.Float64Var(&cfg.UpgradeRatePerSource, "upgrade-rate-per-source", relay.DefaultUpgradeRatePerSource,
		"under load, new connections admitted from one address a second; the rest are closed at accept")
	fs.IntVar(&cfg.UpgradeBurstPerSource, "upgrade-burst-per-source", relay.DefaultUpgradeBurstPerSource,
		"under load, new connections admitted from one address at once")
	fs.StringVar(&cfg.LogLevel, "log-level", "info", "debug, info, warn or error")
	fs.StringVar(&cfg.LogFormat, "log-format", "json", "json or console")
}
