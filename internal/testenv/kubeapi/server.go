package kubeapi

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

// Start deadlines: generous, as the machine may be loaded; a healthy start takes about a second.
const (
	etcdReadyTimeout = 30 * time.Second
	apiReadyTimeout  = 60 * time.Second
)

// Server is one etcd and one kube-apiserver on loopback, owned by the test that started them.
// Its methods are called from the test's goroutine.
type Server struct {
	t        testing.TB     // owner: Start; the test the processes belong to
	bin      string         // owner: Start; the directory holding kube-apiserver and etcd
	dir      string         // owner: Start; the temporary directory of data, certificates and logs
	pki      *pki           // owner: Start; certificates, keys and tokens
	etcd     *proc          // owner: Start, then Stop
	etcdURL  string         // owner: Start; etcd's client URL
	port     int            // owner: Start; the API server's secure port, kept across restarts
	apiArgs  []string       // owner: Start; kube-apiserver's flags, the same for each restart
	caPool   *x509.CertPool // owner: Start; trusts the serving certificate, for /readyz
	apiLog   string         // owner: Start; kube-apiserver's log file, appended to on each restart
	etcdLog  string         // owner: Start; etcd's log file
	mu       sync.Mutex     // guards api
	api      *proc          // owner: StartAPIServer and StopAPIServer; nil while stopped
	stopOnce sync.Once      // owner: Stop
}

// Start starts etcd, then kube-apiserver, waits until the API server answers /readyz, and
// registers Stop with t.Cleanup. When t fails, the last lines of both logs are printed. It skips
// or fails like Require when the binaries are missing.
func Start(t testing.TB) *Server {
	t.Helper()
	s := &Server{t: t, bin: Require(t), dir: t.TempDir()}
	s.etcdLog, s.apiLog = filepath.Join(s.dir, "etcd.log"), filepath.Join(s.dir, "kube-apiserver.log")
	t.Cleanup(s.printLogsOnFailure) // registered before Stop, so it runs after it
	var err error
	if s.pki, err = writePKI(s.dir); err != nil {
		t.Fatalf("kubeapi: generate certificates and tokens: %v", err)
	}
	if s.port, err = freePort(); err != nil {
		t.Fatalf("kubeapi: %v", err)
	}
	s.caPool = x509.NewCertPool()
	if ca, err := os.ReadFile(s.pki.caFile); err != nil || !s.caPool.AppendCertsFromPEM(ca) {
		t.Fatalf("kubeapi: read CA %s: %v", s.pki.caFile, err)
	}
	for user := range users {
		if err := s.writeKubeconfig(user); err != nil {
			t.Fatalf("kubeapi: write kubeconfig: %v", err)
		}
	}
	t.Cleanup(s.Stop)
	began := time.Now()
	s.startEtcd()
	etcdReady := time.Since(began)
	s.apiArgs = s.apiServerArgs()
	s.StartAPIServer()
	t.Logf("kubeapi: etcd ready in %v, kube-apiserver ready %v later on https://127.0.0.1:%d (logs in %s)",
		etcdReady.Round(time.Millisecond), (time.Since(began) - etcdReady).Round(time.Millisecond), s.port, s.dir)
	return s
}

func (s *Server) startEtcd() {
	client, err1 := freePort()
	peer, err2 := freePort()
	if err1 != nil || err2 != nil {
		s.t.Fatalf("kubeapi: free ports for etcd: %v %v", err1, err2)
	}
	s.etcdURL = "http://127.0.0.1:" + strconv.Itoa(client)
	peerURL := "http://127.0.0.1:" + strconv.Itoa(peer)
	args := []string{
		"--name=kubeapi", "--data-dir=" + filepath.Join(s.dir, "etcd"),
		"--listen-client-urls=" + s.etcdURL, "--advertise-client-urls=" + s.etcdURL,
		"--listen-peer-urls=" + peerURL, "--initial-advertise-peer-urls=" + peerURL,
		"--initial-cluster=kubeapi=" + peerURL,
		"--unsafe-no-fsync", // test data: survives a killed process, not a lost machine
		// A single member elects itself after one election timeout (default 1 s): shorten it.
		"--heartbeat-interval=10", "--election-timeout=100",
	}
	if s.etcd, err1 = start("etcd", filepath.Join(s.bin, "etcd"), args, s.etcdLog); err1 != nil {
		s.t.Fatalf("kubeapi: %v", err1)
	}
	ctx, cancel := context.WithTimeout(context.Background(), etcdReadyTimeout)
	defer cancel()
	if err := s.etcd.waitReady(ctx, func(ctx context.Context) error {
		return get(ctx, http.DefaultClient, s.etcdURL+"/health", "")
	}); err != nil {
		s.t.Fatalf("kubeapi: %v", err)
	}
}

func (s *Server) apiServerArgs() []string {
	return []string{
		"--bind-address=127.0.0.1", "--advertise-address=127.0.0.1",
		"--secure-port=" + strconv.Itoa(s.port),
		"--etcd-servers=" + s.etcdURL,
		"--endpoint-reconciler-type=none", // no kubernetes Endpoints: nothing routes to it
		"--cert-dir=" + filepath.Join(s.dir, "certs"),
		"--tls-cert-file=" + s.pki.certFile, "--tls-private-key-file=" + s.pki.keyFile,
		"--token-auth-file=" + s.pki.tokenAuth,
		"--authorization-mode=RBAC",
		"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
		"--service-account-key-file=" + s.pki.saPubFile,
		"--service-account-signing-key-file=" + s.pki.saKeyFile,
		"--service-cluster-ip-range=10.96.0.0/24",
		// No controller manager creates the "default" ServiceAccount this plugin would require
		// of every Pod.
		"--disable-admission-plugins=ServiceAccount",
		"--profiling=false",
	}
}

// StartAPIServer starts kube-apiserver again after StopAPIServer, on the same port with the
// same etcd, and waits until it is ready. Start calls it once.
func (s *Server) StartAPIServer() {
	s.t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.api != nil {
		s.t.Fatalf("kubeapi: StartAPIServer: kube-apiserver is already running")
	}
	p, err := start("kube-apiserver", filepath.Join(s.bin, "kube-apiserver"), s.apiArgs, s.apiLog)
	if err != nil {
		s.t.Fatalf("kubeapi: %v", err)
	}
	s.api = p
	token, err := os.ReadFile(s.pki.tokenFiles[Admin])
	if err != nil {
		s.t.Fatalf("kubeapi: %v", err)
	}
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: s.caPool}}}
	defer hc.CloseIdleConnections()
	ctx, cancel := context.WithTimeout(context.Background(), apiReadyTimeout)
	defer cancel()
	if err := p.waitReady(ctx, func(ctx context.Context) error {
		return get(ctx, hc, fmt.Sprintf("https://127.0.0.1:%d/readyz", s.port), string(token))
	}); err != nil {
		s.t.Fatalf("kubeapi: %v", err)
	}
}

// StopAPIServer kills kube-apiserver alone; etcd and its data stay. Clients see connections
// refused until StartAPIServer.
func (s *Server) StopAPIServer() {
	s.t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.api == nil {
		return
	}
	if err := s.api.kill(); err != nil {
		s.t.Errorf("kubeapi: %v", err)
	}
	s.api = nil
}

// Stop kills kube-apiserver and etcd and reaps both. Start registers it with t.Cleanup; calling
// it earlier is allowed, and later calls do nothing.
func (s *Server) Stop() {
	s.stopOnce.Do(func() {
		s.StopAPIServer()
		if s.etcd != nil {
			if err := s.etcd.kill(); err != nil {
				s.t.Errorf("kubeapi: %v", err)
			}
		}
	})
}

// Kubeconfig returns the path of a kubeconfig file for user (Admin or Relay). It names the CA
// file and a file holding the user's token, so the token itself appears in no kubeconfig.
func (s *Server) Kubeconfig(user string) string {
	s.t.Helper()
	if _, ok := users[user]; !ok {
		s.t.Fatalf("kubeapi: no user %q: use kubeapi.Admin or kubeapi.Relay", user)
	}
	return filepath.Join(s.dir, "kubeconfig-"+user)
}

// RESTConfig returns a new client configuration for user, loaded from its Kubeconfig file as
// the relay's --kubeconfig flag would load it.
func (s *Server) RESTConfig(user string) *rest.Config {
	s.t.Helper()
	cfg, err := clientcmd.BuildConfigFromFlags("", s.Kubeconfig(user))
	if err != nil {
		s.t.Fatalf("kubeapi: load kubeconfig for %s: %v", user, err)
	}
	return cfg
}

// Client returns a clientset acting as user.
func (s *Server) Client(user string) kubernetes.Interface {
	s.t.Helper()
	c, err := kubernetes.NewForConfig(s.RESTConfig(user))
	if err != nil {
		s.t.Fatalf("kubeapi: clientset for %s: %v", user, err)
	}
	return c
}

func (s *Server) writeKubeconfig(user string) error {
	cfg := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: kubeapi
  cluster:
    server: https://127.0.0.1:%d
    certificate-authority: %s
users:
- name: %s
  user:
    tokenFile: %s
contexts:
- name: kubeapi
  context:
    cluster: kubeapi
    user: %s
current-context: kubeapi
`, s.port, s.pki.caFile, user, s.pki.tokenFiles[user], user)
	return os.WriteFile(filepath.Join(s.dir, "kubeconfig-"+user), []byte(cfg), 0o600)
}

func (s *Server) printLogsOnFailure() {
	if !s.t.Failed() {
		return
	}
	for _, log := range []string{s.etcdLog, s.apiLog} {
		s.t.Logf("kubeapi: last lines of %s:\n%s", log, tail(log, 30))
	}
}

// get succeeds when url answers 200, sending token as a bearer token if it is not empty.
func get(ctx context.Context, hc *http.Client, url, token string) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := hc.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: %s: %s", url, resp.Status, body)
	}
	return nil
}
