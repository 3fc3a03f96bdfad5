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
	"syscall"
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

// Server is one etcd and one kube-apiserver on loopback, owned by the test that started them
// (Start) or by a process (StartProcess). Its methods are called from the owner's goroutine.
type Server struct {
	t        testing.TB     // owner: Start; the test the processes belong to; nil for a Process
	bin      string         // owner: newServer; the directory holding kube-apiserver and etcd
	dir      string         // owner: newServer; the temporary directory of data, certificates and logs
	pki      *pki           // owner: newServer; certificates, keys and tokens
	etcd     *proc          // owner: start, then stop
	etcdURL  string         // owner: start; etcd's client URL
	port     int            // owner: newServer; the API server's secure port, kept across restarts
	etcdPort [2]int         // owner: newServer; etcd's client and peer ports
	apiArgs  []string       // owner: start; kube-apiserver's flags, the same for each restart
	caPool   *x509.CertPool // owner: newServer; trusts the serving certificate, for /readyz
	apiLog   string         // owner: newServer; kube-apiserver's log file, appended to on each restart
	etcdLog  string         // owner: newServer; etcd's log file
	mu       sync.Mutex     // guards api
	api      *proc          // owner: startAPIServer and stopAPIServer; nil while stopped
	stopOnce sync.Once      // owner: stop
	stopErr  error          // owner: stop
}

// Start starts etcd, then kube-apiserver, waits until the API server answers /readyz, and
// registers Stop with t.Cleanup. When t fails, the last lines of both logs are printed. It skips
// or fails like Require when the binaries are missing.
func Start(t testing.TB) *Server {
	t.Helper()
	s, err := newServer(Require(t), t.TempDir())
	if err != nil {
		t.Fatalf("kubeapi: %v", err)
	}
	s.t = t
	t.Cleanup(s.printLogsOnFailure) // registered before Stop, so it runs after it
	t.Cleanup(s.Stop)
	etcdReady, apiReady, err := s.start()
	if err != nil {
		t.Fatalf("kubeapi: %v", err)
	}
	t.Logf("kubeapi: etcd ready in %v, kube-apiserver ready %v later on https://127.0.0.1:%d (logs in %s)",
		etcdReady.Round(time.Millisecond), apiReady.Round(time.Millisecond), s.port, s.dir)
	return s
}

// newServer prepares a Server of the binaries in bin, keeping its files in dir: certificates,
// tokens, a kubeconfig per user, a port. Nothing runs yet.
func newServer(bin, dir string) (*Server, error) {
	s := &Server{bin: bin, dir: dir}
	s.etcdLog, s.apiLog = filepath.Join(s.dir, "etcd.log"), filepath.Join(s.dir, "kube-apiserver.log")
	var err error
	if s.pki, err = writePKI(s.dir); err != nil {
		return nil, fmt.Errorf("generate certificates and tokens: %w", err)
	}
	ports, err := freePorts(3)
	if err != nil {
		return nil, err
	}
	s.port, s.etcdPort = ports[0], [2]int{ports[1], ports[2]}
	s.caPool = x509.NewCertPool()
	if ca, err := os.ReadFile(s.pki.caFile); err != nil || !s.caPool.AppendCertsFromPEM(ca) {
		return nil, fmt.Errorf("read CA %s: %v", s.pki.caFile, err)
	}
	for user := range users {
		if err := s.writeKubeconfig(user); err != nil {
			return nil, fmt.Errorf("write kubeconfig: %w", err)
		}
	}
	return s, nil
}

// start starts etcd, then kube-apiserver, and waits until both are ready; it returns how long
// each took.
func (s *Server) start() (etcdReady, apiReady time.Duration, err error) {
	began := time.Now()
	if err := s.startEtcd(); err != nil {
		return 0, 0, err
	}
	etcdReady = time.Since(began)
	s.apiArgs = s.apiServerArgs()
	if err := s.startAPIServer(); err != nil {
		return 0, 0, err
	}
	return etcdReady, time.Since(began) - etcdReady, nil
}

func (s *Server) startEtcd() error {
	client, peer := s.etcdPort[0], s.etcdPort[1]
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
	var err error
	if s.etcd, err = start("etcd", filepath.Join(s.bin, "etcd"), args, s.etcdLog); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), etcdReadyTimeout)
	defer cancel()
	return s.etcd.waitReady(ctx, func(ctx context.Context) error {
		return get(ctx, http.DefaultClient, s.etcdURL+"/health", "")
	})
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
	if err := s.startAPIServer(); err != nil {
		s.t.Fatalf("kubeapi: %v", err)
	}
}

func (s *Server) startAPIServer() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.api != nil {
		return fmt.Errorf("StartAPIServer: kube-apiserver is already running")
	}
	p, err := start("kube-apiserver", filepath.Join(s.bin, "kube-apiserver"), s.apiArgs, s.apiLog)
	if err != nil {
		return err
	}
	s.api = p
	token, err := os.ReadFile(s.pki.tokenFiles[Admin])
	if err != nil {
		return err
	}
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: s.caPool}}}
	defer hc.CloseIdleConnections()
	ctx, cancel := context.WithTimeout(context.Background(), apiReadyTimeout)
	defer cancel()
	return p.waitReady(ctx, func(ctx context.Context) error {
		return get(ctx, hc, fmt.Sprintf("https://127.0.0.1:%d/readyz", s.port), string(token))
	})
}

// StopAPIServer kills kube-apiserver alone; etcd and its data stay. Clients see connections
// refused until StartAPIServer.
func (s *Server) StopAPIServer() {
	s.t.Helper()
	if err := s.stopAPIServer(); err != nil {
		s.t.Errorf("kubeapi: %v", err)
	}
}

func (s *Server) stopAPIServer() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.api == nil {
		return nil
	}
	err := s.api.kill()
	s.api = nil
	return err
}

// PauseAPIServer stops kube-apiserver with SIGSTOP until ResumeAPIServer: an API brownout (a
// long pause, a frozen VM). Its port still accepts connections, as the kernel holds them, and
// nothing answers; requests sent meanwhile are served once it resumes.
func (s *Server) PauseAPIServer() {
	s.t.Helper()
	if err := s.signalAPIServer(syscall.SIGSTOP); err != nil {
		s.t.Fatalf("kubeapi: pause: %v", err)
	}
}

// ResumeAPIServer continues kube-apiserver after PauseAPIServer (SIGCONT).
func (s *Server) ResumeAPIServer() {
	s.t.Helper()
	if err := s.signalAPIServer(syscall.SIGCONT); err != nil {
		s.t.Fatalf("kubeapi: resume: %v", err)
	}
}

func (s *Server) signalAPIServer(sig syscall.Signal) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.api == nil {
		return fmt.Errorf("kube-apiserver is not running")
	}
	return s.api.signal(sig)
}

// Stop kills kube-apiserver and etcd and reaps both. Start registers it with t.Cleanup; calling
// it earlier is allowed, and later calls do nothing.
func (s *Server) Stop() {
	if err := s.stop(); err != nil {
		s.t.Errorf("kubeapi: %v", err)
	}
}

// stop is Stop's work, once; later calls return the first call's error.
func (s *Server) stop() error {
	s.stopOnce.Do(func() {
		s.stopErr = s.stopAPIServer()
		if s.etcd != nil {
			if err := s.etcd.kill(); err != nil && s.stopErr == nil {
				s.stopErr = err
			}
		}
	})
	return s.stopErr
}

// Kubeconfig returns the path of a kubeconfig file for user (Admin or Relay). It names the CA
// file and a file holding the user's token, so the token itself appears in no kubeconfig.
func (s *Server) Kubeconfig(user string) string {
	s.t.Helper()
	path, err := s.kubeconfig(user)
	if err != nil {
		s.t.Fatalf("kubeapi: %v", err)
	}
	return path
}

func (s *Server) kubeconfig(user string) (string, error) {
	if _, ok := users[user]; !ok {
		return "", fmt.Errorf("no user %q: use kubeapi.Admin or kubeapi.Relay", user)
	}
	return filepath.Join(s.dir, "kubeconfig-"+user), nil
}

// RESTConfig returns a new client configuration for user, loaded from its Kubeconfig file as
// the relay's --kubeconfig flag would load it.
func (s *Server) RESTConfig(user string) *rest.Config {
	s.t.Helper()
	cfg, err := s.restConfig(user)
	if err != nil {
		s.t.Fatalf("kubeapi: %v", err)
	}
	return cfg
}

func (s *Server) restConfig(user string) (*rest.Config, error) {
	path, err := s.kubeconfig(user)
	if err != nil {
		return nil, err
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", path)
	if err != nil {
		return nil, fmt.Errorf("load kubeconfig for %s: %w", user, err)
	}
	return cfg, nil
}

// Client returns a clientset acting as user.
func (s *Server) Client(user string) kubernetes.Interface {
	s.t.Helper()
	c, err := s.client(user)
	if err != nil {
		s.t.Fatalf("kubeapi: %v", err)
	}
	return c
}

func (s *Server) client(user string) (kubernetes.Interface, error) {
	cfg, err := s.restConfig(user)
	if err != nil {
		return nil, err
	}
	c, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("clientset for %s: %w", user, err)
	}
	return c, nil
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
