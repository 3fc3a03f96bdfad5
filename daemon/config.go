package daemon

import (
	"fmt"

	"code.foss.global/serve.zone/relay/relay"
)

// Config is everything `relay run` is told: the relay core's Config, and what the daemon
// wires beside the core — the parts' CA files, the hub's key, the registry cache and the log.
// Field comments name the flag.
type Config struct {
	relay.Config

	CloudlyCAFile   string // --cloudly-ca-file: extra roots for Cloudly's certificate
	CorestoreCAFile string // --corestore-ca-file: extra roots for node Corestores' certificates
	RegistryCAFile  string // --registry-ca-file: extra roots for the registry upstream's certificate
	HubKeyFile      string // --hub-key-file: the hub's static Noise key, created 0600 when missing
	// RegistryCacheDir is --registry-cache-dir: the digest cache; empty: no cache.
	RegistryCacheDir string
	// RegistryCacheMaxBytes is --registry-cache-max-bytes: the bound of the registry digest
	// cache, least recently used objects evicted beyond it (default 10 GiB).
	RegistryCacheMaxBytes int64
	LogLevel              string // --log-level: debug, info, warn, error (default info)
	LogFormat             string // --log-format: json or console (default json)
}

// defaultRegistryCacheMaxBytes is --registry-cache-max-bytes's default.
const defaultRegistryCacheMaxBytes = 10 << 30

// Complete fills defaults and validates: the core's Config first (relay.Config.Complete), then
// the daemon's own fields. The first problem is a *relay.ConfigError naming its flag.
func (c *Config) Complete() error {
	if c.LogLevel == "" {
		c.LogLevel = "info"
	}
	if c.LogFormat == "" {
		c.LogFormat = "json"
	}
	if c.RegistryCacheMaxBytes == 0 {
		c.RegistryCacheMaxBytes = defaultRegistryCacheMaxBytes
	}
	if err := c.Config.Complete(); err != nil {
		return err
	}
	bad := func(flag, format string, args ...any) error {
		return &relay.ConfigError{Flag: flag, Reason: fmt.Sprintf(format, args...)}
	}
	switch c.LogLevel {
	case "debug", "info", "warn", "error":
	default:
		return bad("log-level", "must be debug, info, warn or error")
	}
	switch {
	case c.LogFormat != "json" && c.LogFormat != "console":
		return bad("log-format", "must be json or console")
	case c.RegistryCacheMaxBytes < 1<<20:
		return bad("registry-cache-max-bytes", "must be at least 1048576 (1MiB)")
	case c.HubListen != "" && c.HubKeyFile == "":
		return bad("hub-key-file", "is required with --hub-listen")
	}
	return relay.ReadableFiles(map[string]string{"cloudly-ca-file": c.CloudlyCAFile, "corestore-ca-file": c.CorestoreCAFile,
		"registry-ca-file": c.RegistryCAFile})
}
