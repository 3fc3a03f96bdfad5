package daemon

import (
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/netip"
	"strings"

	"github.com/rs/zerolog"
	"k8s.io/client-go/tools/clientcmd"

	"code.foss.global/serve.zone/relay/relay"
	"code.foss.global/serve.zone/relay/vpnhub/vpnkey"
)

// cmdCheck is `relay check`: the flags of `relay run`, judged as `relay run` judges them, and
// every file they name read as `relay run` would read it — and nothing dialled, bound or
// written (a missing hub key file is reported as one `relay run` creates). Exit 0 and one line
// naming the parts on and off, or 2 and the first problem.
func cmdCheck(version string, args []string, stdout, stderr io.Writer) error {
	rc, err := configure("check", version, args)
	if err != nil {
		return err
	}
	log := NewLogger(rc.cfg.LogLevel, rc.cfg.LogFormat, stderr) // a key file open to others is warned about, as at start
	if err := rc.verify(log); err != nil {
		return rc.src.explain(err)
	}
	on, off := rc.parts()
	fmt.Fprintf(stdout, "relay check: configuration valid (nothing dialled or bound); on: %s; off: %s\n",
		strings.Join(on, ", "), strings.Join(off, ", "))
	return nil
}

// verify reads what BuildParts would: CA files, the TLS pair, the hub's address and key, the
// replication key and the kubeconfig.
func (rc *runConfig) verify(log zerolog.Logger) error {
	cfg := rc.cfg
	for flag, file := range map[string]string{"cloudly-ca-file": cfg.CloudlyCAFile, "corestore-ca-file": cfg.CorestoreCAFile,
		"registry-ca-file": cfg.RegistryCAFile} {
		if _, err := caPool(file, flag); err != nil {
			return err
		}
	}
	if !cfg.InsecurePlaintext {
		if _, err := tls.LoadX509KeyPair(cfg.TLSCertFile, cfg.TLSKeyFile); err != nil {
			return &relay.ConfigError{Flag: "tls-cert-file", Reason: "cannot load the pair with --tls-key-file " + cfg.TLSKeyFile + ": " + tlsReason(err)}
		}
	}
	if cfg.HubListen != "" {
		var report netip.Addr
		if cfg.HubAdvertiseAddress != "" {
			report = netip.MustParseAddr(cfg.HubAdvertiseAddress) // Complete checked it
		}
		if err := checkHubListen(cfg.HubListen, report); err != nil {
			return err
		}
		if _, err := vpnkey.LoadFile(cfg.HubKeyFile, log); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return &relay.ConfigError{Flag: "hub-key-file", Reason: err.Error()}
		}
	}
	if rc.ha.on() {
		if _, err := vpnkey.ReadSecretFile(rc.ha.replicationKeyFile, log); err != nil {
			return Usagef("--ha-replication-key-file: %v", err)
		}
		if rc.ha.kubeconfig != "" {
			if _, err := clientcmd.BuildConfigFromFlags("", rc.ha.kubeconfig); err != nil {
				return Usagef("--kubeconfig: %v", err)
			}
		}
	}
	return nil
}

// tlsReason is a TLS loading error without anything of the files' content.
func tlsReason(err error) string {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return pe.Err.Error()
	}
	return "not a PEM certificate and its private key"
}
