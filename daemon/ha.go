package daemon

import (
	"crypto/rand"
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"net"
	"os"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"code.foss.global/serve.zone/relay/ha"
	"code.foss.global/serve.zone/relay/relay"
	"code.foss.global/serve.zone/relay/vpnhub/vpnkey"
)

// Several relays per cluster (docs/ha.md): the election's flags, and the Elector they build. Without
// --ha-lease-name nothing here runs, and client-go is never touched.

// serviceAccountNamespace is where Kubernetes mounts the Pod's own namespace.
const serviceAccountNamespace = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"

// haConfig is what the HA flags say.
type haConfig struct {
	leaseName, leaseNamespace, identity string
	leaseDuration, renewDeadline        time.Duration
	retryPeriod                         time.Duration
	kubeconfig                          string
	replicationListen                   string
	replicationKeyFile                  string
	replicationAck                      time.Duration
}

func haFlags(fs *flag.FlagSet, h *haConfig) {
	fs.StringVar(&h.leaseName, "ha-lease-name", "", "the Lease the cluster's relays compete for (empty: one relay, no election)")
	fs.StringVar(&h.leaseNamespace, "ha-lease-namespace", "", "the Lease's namespace (default: the Pod's own, from its service account)")
	fs.StringVar(&h.identity, "ha-identity", "", "this relay in the Lease (default: $POD_NAME, else the host name)")
	fs.DurationVar(&h.leaseDuration, "ha-lease-duration", ha.DefaultLeaseDuration, "how long a Lease holds without renewal")
	fs.DurationVar(&h.renewDeadline, "ha-renew-deadline", ha.DefaultRenewDeadline, "the leader steps down when it cannot renew within it")
	fs.DurationVar(&h.retryPeriod, "ha-retry-period", ha.DefaultRetryPeriod, "how often the Lease is tried")
	fs.StringVar(&h.kubeconfig, "kubeconfig", "", "kubeconfig for the Kubernetes API (default: the in-cluster service account)")
	fs.StringVar(&h.replicationListen, "ha-replication-listen", ":8444", "where standbys copy the leader's escrow from")
	fs.StringVar(&h.replicationKeyFile, "ha-replication-key-file", "", "the replicas' shared 32-byte key (relay keygen --replication-key-file); required with --ha-lease-name")
	fs.DurationVar(&h.replicationAck, "ha-replication-ack", ha.DefaultAckTimeout, "how long a hold waits for every standby's acknowledgement; a standby that misses it is closed and copies again")
}

// on reports whether HA is on.
func (h *haConfig) on() bool { return h.leaseName != "" }

// complete fills the defaults the environment gives and checks the flags, naming the first wrong
// one.
func (h *haConfig) complete() error {
	if !h.on() {
		return nil
	}
	if h.leaseNamespace == "" {
		if b, err := os.ReadFile(serviceAccountNamespace); err == nil {
			h.leaseNamespace = strings.TrimSpace(string(b))
		}
	}
	if h.leaseNamespace == "" {
		h.leaseNamespace = os.Getenv("POD_NAMESPACE")
	}
	if h.identity == "" {
		h.identity = os.Getenv("POD_NAME")
	}
	if h.identity == "" {
		h.identity, _ = os.Hostname()
	}
	switch {
	case h.leaseNamespace == "":
		return &relay.ConfigError{Flag: "ha-lease-namespace", Reason: "is required outside a Pod (no service account namespace, no $POD_NAMESPACE)"}
	case h.identity == "":
		return &relay.ConfigError{Flag: "ha-identity", Reason: "is required where neither $POD_NAME nor the host name is set"}
	case h.retryPeriod <= 0 || h.renewDeadline <= h.retryPeriod || h.leaseDuration <= h.renewDeadline:
		return &relay.ConfigError{Flag: "ha-renew-deadline", Reason: "must be longer than --ha-retry-period and shorter than --ha-lease-duration"}
	case h.replicationKeyFile == "":
		return &relay.ConfigError{Flag: "ha-replication-key-file", Reason: "is required with --ha-lease-name"}
	case h.replicationAck <= 0:
		return &relay.ConfigError{Flag: "ha-replication-ack", Reason: "must be a positive duration"}
	}
	if _, _, err := net.SplitHostPort(h.replicationListen); err != nil {
		return &relay.ConfigError{Flag: "ha-replication-listen", Reason: "must be host:port or :port"}
	}
	return podEnvironment()
}

// podEnvironment checks what an elected relay needs of its Pod, from the downward API: its name
// (the Pod it labels, and its identity in the Lease), its namespace, and its address (what
// standbys dial for replication). Without them it could neither label nor replicate, so it does
// not start; the error names every one missing.
func podEnvironment() error {
	var missing []string
	for _, v := range []string{"POD_NAME", "POD_NAMESPACE", "POD_IP"} {
		if os.Getenv(v) == "" {
			missing = append(missing, v)
		}
	}
	if len(missing) == 0 {
		return nil
	}
	return Usagef("--ha-lease-name needs the Pod's POD_NAME, POD_NAMESPACE and POD_IP from the downward API (the chart sets them); missing: %s",
		strings.Join(missing, ", "))
}

// elector builds the Elector that copies parts: the API client, the replication listener and key.
func (h *haConfig) elector(log zerolog.Logger, reg prometheus.Registerer, parts []ha.Part) (*ha.Elector, error) {
	key, err := vpnkey.ReadSecretFile(h.replicationKeyFile, log)
	if err != nil {
		return nil, Usagef("--ha-replication-key-file: %v", err)
	}
	var rc *rest.Config
	if h.kubeconfig != "" {
		rc, err = clientcmd.BuildConfigFromFlags("", h.kubeconfig)
	} else {
		rc, err = rest.InClusterConfig()
	}
	if err != nil {
		return nil, Usagef("--kubeconfig: %v", err)
	}
	client, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return nil, Usagef("--kubeconfig: %v", err)
	}
	ln, err := net.Listen("tcp", h.replicationListen)
	if err != nil {
		return nil, Usagef("--ha-replication-listen: %v", err)
	}
	el, err := ha.New(ha.Config{LeaseName: h.leaseName, Namespace: h.leaseNamespace, Identity: h.identity,
		PodName: os.Getenv("POD_NAME"), PodIP: os.Getenv("POD_IP"),
		LeaseDuration: h.leaseDuration, RenewDeadline: h.renewDeadline, RetryPeriod: h.retryPeriod, Client: client,
		Replication: ln, ReplicationKey: key[:], Parts: parts, AckTimeout: h.replicationAck, Logger: log, Registerer: reg})
	if err != nil {
		ln.Close()
		return nil, err
	}
	return el, nil
}

// WriteReplicationKey is `relay keygen --replication-key-file F`: a new shared key, 0600, never
// overwriting; nothing of it is printed.
func WriteReplicationKey(path string) error {
	var k [32]byte
	if _, err := rand.Read(k[:]); err != nil {
		return err
	}
	if err := vpnkey.WriteSecretFile(path, k); err != nil {
		if errors.Is(err, fs.ErrExist) {
			return Usagef("--replication-key-file: %v", err)
		}
		return fmt.Errorf("replication key: %w", err)
	}
	return nil
}

// electorOf is BuildParts' election step: nil without HA.
func electorOf(h *haConfig) Elect {
	if h == nil || !h.on() {
		return nil
	}
	return func(log zerolog.Logger, reg prometheus.Registerer, parts []ha.Part) (relay.Elector, error) {
		return h.elector(log, reg, parts)
	}
}
