package relay

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	"code.foss.global/serve.zone/relay/contracts"
)

// Config is what the relay core is told: every field is read by this package. Field comments
// name the flag; every flag also reads SERVEZONE_RELAY_<FLAG_IN_UPPER_SNAKE>. Secrets are never
// values here, only files. What `relay run` wires beside the core — the parts' CA files, the
// hub's key, the registry cache, the log — is the daemon's own configuration (cmd/relay).
type Config struct {
	ClusterID         string // --cluster-id
	NodeID            string // --node-id: the cluster node the relay runs on
	CloudlyURL        string // --cloudly-url: wss://… (ws:// only with --insecure-plaintext)
	CloudlyTokenFile  string // --cloudly-token-file: the machine JWT, re-read at every attach
	Listen            string // --listen: the downstream listener (default :8443)
	AdvertiseAddress  string // --advertise-address: the IPv4 literal nodes reach the relay on
	TLSCertFile       string // --tls-cert-file
	TLSKeyFile        string // --tls-key-file
	InsecurePlaintext bool   // --insecure-plaintext: ws:// and http:// everywhere (development only)
	HubListen         string // --hub-listen: the VPN hub's UDP address; empty: hub off (shown on the status page)
	// HubAdvertiseAddress is --hub-advertise-address: the IPv4 address the hub report names when
	// it is not the one the hub binds (several relays behind one Service: each binds its own,
	// every one reports the Service's). Empty: the bound address.
	HubAdvertiseAddress string
	RegistryUpstream    string // --registry-upstream: where /v2/ is forwarded; empty: off
	AdminListen         string // --admin-listen (default 127.0.0.1:9464)
	AdminPprof          bool   // --admin-pprof: net/http/pprof under /debug/pprof/ on the admin listener
	MaxMessageBytes     int64  // --max-message-bytes (default 8 MiB)
	PeerMemoryBytes     int64  // --peer-memory-bytes: the budget of bytes held for downstream peers (default 256 MiB)
	// MaxUnregisteredPerSource is --max-unregistered-per-source: unregistered connections from one
	// source address (the flag's default is 64). Zero turns the limit off — where every node
	// arrives from one translated address, and in `relay dev` — so here, unlike elsewhere in
	// Config, the zero value is not the default.
	MaxUnregisteredPerSource int

	// FirstFrameTimeout is --first-frame-timeout: an unregistered connection's first message
	// arrives whole within it of its start (default 2s). MinFrameRate is --min-frame-rate: every
	// message of an unregistered connection arrives at this many bytes a second or faster
	// (default 32KiB/s). Past either the connection is closed and its charge freed.
	FirstFrameTimeout time.Duration
	MinFrameRate      int64
	// UpgradeRatePerSource is --upgrade-rate-per-source and UpgradeBurstPerSource
	// --upgrade-burst-per-source: under load, new connections from one address are admitted at
	// this rate a second (default 4) with this burst (default 16); the rest are closed at accept.
	UpgradeRatePerSource  float64
	UpgradeBurstPerSource int

	// BuildVersion is the relay build reported as relay.version; set by the binary.
	BuildVersion string
}

// Defaults of docs/operating.md#flags-and-environment and docs/protocol.md#limits-at-a-glance.
const (
	DefaultListen          = ":8443"
	DefaultAdminListen     = "127.0.0.1:9464"
	DefaultMaxMessageBytes = 8 << 20
	DefaultBuildVersion    = "0.1.0"
)

// ConfigError is a configuration value that is wrong; Flag names it as the command line spells it.
type ConfigError struct {
	Flag   string
	Reason string
}

func (e *ConfigError) Error() string { return "--" + e.Flag + ": " + e.Reason }

// Complete fills defaults and validates the configuration: the one place both happen. The first
// problem is returned as a *ConfigError naming its flag. Files that must exist are opened to
// check they are readable; nothing is read from them here.
func (c *Config) Complete() error {
	if c.Listen == "" {
		c.Listen = DefaultListen
	}
	if c.AdminListen == "" {
		c.AdminListen = DefaultAdminListen
	}
	if c.MaxMessageBytes == 0 {
		c.MaxMessageBytes = DefaultMaxMessageBytes
	}
	if c.PeerMemoryBytes == 0 {
		c.PeerMemoryBytes = DefaultPeerMemoryBytes
	}
	if c.FirstFrameTimeout == 0 {
		c.FirstFrameTimeout = DefaultFirstFrameTimeout
	}
	if c.MinFrameRate == 0 {
		c.MinFrameRate = DefaultMinFrameRate
	}
	if c.UpgradeRatePerSource == 0 {
		c.UpgradeRatePerSource = DefaultUpgradeRatePerSource
	}
	if c.UpgradeBurstPerSource == 0 {
		c.UpgradeBurstPerSource = DefaultUpgradeBurstPerSource
	}
	if c.BuildVersion == "" {
		c.BuildVersion = DefaultBuildVersion
	}
	bad := func(flag, format string, args ...any) error {
		return &ConfigError{Flag: flag, Reason: fmt.Sprintf(format, args...)}
	}
	switch {
	case c.ClusterID == "":
		return bad("cluster-id", "is required")
	case !contracts.IsCanonicalID(c.ClusterID):
		return bad("cluster-id", "must be a canonical identifier: a letter or digit, then up to 199 of A-Z a-z 0-9 : . _ -")
	case c.NodeID == "":
		return bad("node-id", "is required")
	case !contracts.IsClusterNodeID(c.NodeID):
		return bad("node-id", "must be a cluster node id (A-Z a-z 0-9 _ -, at most 128)")
	case c.CloudlyURL == "":
		return bad("cloudly-url", "is required")
	case c.CloudlyTokenFile == "":
		return bad("cloudly-token-file", "is required")
	case c.AdvertiseAddress == "":
		return bad("advertise-address", "is required")
	case !contracts.IsPlausibleUnicastIPv4(c.AdvertiseAddress):
		return bad("advertise-address", "must be a unicast IPv4 literal that is neither loopback nor link-local")
	case c.MaxMessageBytes < 64<<10 || c.MaxMessageBytes > 1<<30:
		return bad("max-message-bytes", "must be from 65536 (64KiB) to 1073741824 (1GiB)")
	case c.PeerMemoryBytes < 16<<20:
		return bad("peer-memory-bytes", "must be at least 16777216 (16MiB)")
	case c.MaxUnregisteredPerSource < 0:
		return bad("max-unregistered-per-source", "must not be negative (0: no limit)")
	case c.FirstFrameTimeout < 100*time.Millisecond || c.FirstFrameTimeout > RegisterDeadline:
		return bad("first-frame-timeout", "must be from 100ms to %s", RegisterDeadline)
	case c.MinFrameRate < 1<<10:
		return bad("min-frame-rate", "must be at least 1KiB/s")
	case c.UpgradeRatePerSource < 0.01:
		return bad("upgrade-rate-per-source", "must be at least 0.01 (upgrades a second)")
	case c.UpgradeBurstPerSource < 1:
		return bad("upgrade-burst-per-source", "must be at least 1")
	case !contracts.IsReleaseVersion(c.BuildVersion):
		return bad("version", "build version %q is not MAJOR.MINOR.PATCH", c.BuildVersion)
	}
	u, err := url.Parse(c.CloudlyURL)
	switch {
	case err != nil || u.Host == "" || u.User != nil || u.Fragment != "":
		return bad("cloudly-url", "must be a wss:// URL")
	case u.Scheme == "ws" && !c.InsecurePlaintext:
		return bad("cloudly-url", "ws:// needs --insecure-plaintext; use wss://")
	case u.Scheme != "wss" && u.Scheme != "ws":
		return bad("cloudly-url", "must be a wss:// URL")
	}
	if _, err := listenPort(c.Listen); err != nil {
		return bad("listen", "%v", err)
	}
	if _, err := listenPort(c.AdminListen); err != nil {
		return bad("admin-listen", "%v", err)
	}
	if c.HubListen != "" {
		if _, err := net.ResolveUDPAddr("udp", c.HubListen); err != nil {
			return bad("hub-listen", "must be host:port")
		}
	}
	if c.HubAdvertiseAddress != "" {
		switch {
		case c.HubListen == "":
			return bad("hub-advertise-address", "needs --hub-listen")
		case !contracts.IsPlausibleUnicastIPv4(c.HubAdvertiseAddress):
			return bad("hub-advertise-address", "must be a unicast IPv4 literal that is neither loopback nor link-local")
		}
	}
	if c.RegistryUpstream != "" {
		ru, err := url.Parse(c.RegistryUpstream)
		if err != nil || ru.Host == "" || !(ru.Scheme == "https" || ru.Scheme == "http" && c.InsecurePlaintext) {
			return bad("registry-upstream", "must be an https:// URL (http:// only with --insecure-plaintext)")
		}
		if ru.User != nil || ru.RawQuery != "" || ru.Fragment != "" {
			// Credentials in the URL would be sent for every caller, anonymous ones included.
			return bad("registry-upstream", "must carry no credentials, query or fragment")
		}
	}
	if !c.InsecurePlaintext && (c.TLSCertFile == "" || c.TLSKeyFile == "") {
		return bad("tls-cert-file", "--tls-cert-file and --tls-key-file are required unless --insecure-plaintext")
	}
	return ReadableFiles(map[string]string{"cloudly-token-file": c.CloudlyTokenFile, "tls-cert-file": c.TLSCertFile, "tls-key-file": c.TLSKeyFile})
}

// ReadableFiles checks that each file, by the flag naming it, can be opened and is no directory
// (empty paths are skipped); the first that cannot is a *ConfigError naming its flag. Nothing is
// read.
func ReadableFiles(byFlag map[string]string) error {
	for flag, path := range byFlag {
		if err := readable(path); err != nil {
			return &ConfigError{Flag: flag, Reason: err.Error()}
		}
	}
	return nil
}

func listenPort(addr string) (int, error) {
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		return 0, errors.New("must be host:port or :port")
	}
	n, err := strconv.Atoi(port)
	if err != nil || n < 0 || n > 65535 {
		return 0, errors.New("port must be from 0 (any) to 65535")
	}
	return n, nil
}

func readable(path string) error {
	if path == "" {
		return nil
	}
	f, err := os.Open(path)
	if err != nil {
		var pe *os.PathError
		if errors.As(err, &pe) {
			return fmt.Errorf("cannot read %s: %v", path, pe.Err)
		}
		return fmt.Errorf("cannot read %s", path)
	}
	defer f.Close()
	// A directory opens but cannot be read as a file: a secret mounted one level too high.
	if st, err := f.Stat(); err != nil || st.IsDir() {
		return fmt.Errorf("cannot read %s: is a directory, not a file", path)
	}
	return nil
}

// ReadToken reads the machine JWT from the token file, trimmed. Errors name the file, never its
// content.
func ReadToken(path string) (contracts.Secret, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return contracts.Secret{}, fmt.Errorf("read cloudly token file %s: %w", path, errors.Unwrap(err))
	}
	tok := strings.TrimSpace(string(b))
	if tok == "" {
		return contracts.Secret{}, fmt.Errorf("cloudly token file %s is empty", path)
	}
	return contracts.NewSecret(tok), nil
}
