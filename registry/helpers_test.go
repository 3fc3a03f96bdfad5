package registry_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"go.uber.org/goleak"

	"code.foss.global/serve.zone/relay/internal/sim"
	"code.foss.global/serve.zone/relay/registry"
	"code.foss.global/serve.zone/relay/relay"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// syncBuffer collects log lines from many goroutines.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// relayEnv is a real relay (relay.New, its downstream listener, a simulated Cloudly) whose /v2/
// is served by registry.New, wired as cmd/relay's build() wires it.
type relayEnv struct {
	addr     string // the downstream listener, host:port
	cacheDir string
	prom     *prometheus.Registry
	reg      *registry.Registry
	logs     *syncBuffer
	stop     func() // stops the relay and closes the registry; also run at cleanup
}

// startRelay starts a relay forwarding to up. cacheDir "" makes a fresh one; tune may change the
// registry options.
func startRelay(t testing.TB, upstreamURL, cacheDir string, tune func(*registry.Options)) *relayEnv {
	t.Helper()
	logs := &syncBuffer{}
	log := zerolog.New(logs).Level(zerolog.DebugLevel)
	cloudly, err := sim.NewCloudly(zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if cacheDir == "" {
		cacheDir = filepath.Join(dir, "cache")
	}
	tokenFile := filepath.Join(dir, "cloudly.jwt")
	if err := os.WriteFile(tokenFile, []byte(cloudly.Token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := relay.Config{
		ClusterID: cloudly.ClusterID, NodeID: "relay-node", CloudlyURL: cloudly.URL(), CloudlyTokenFile: tokenFile,
		Listen: "127.0.0.1:0", AdvertiseAddress: "192.0.2.1", InsecurePlaintext: true, AdminListen: "127.0.0.1:0",
		RegistryUpstream: upstreamURL, RegistryCacheDir: cacheDir,
	}
	if err := cfg.Complete(); err != nil {
		t.Fatal(err)
	}
	prom := relay.NewRegistry()
	opts := registry.Options{Upstream: cfg.RegistryUpstream, CacheDir: cfg.RegistryCacheDir,
		CacheMaxBytes: cfg.RegistryCacheMaxBytes, Metrics: prom, Log: log.With().Str("component", "registry").Logger()}
	if tune != nil {
		tune(&opts)
	}
	reg, err := registry.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	r, err := relay.New(cfg, relay.Features{Registry: reg}, log, relay.Options{Registry: prom})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Listen(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Serve(ctx) }()
	var once sync.Once
	stop := func() {
		once.Do(func() {
			cancel()
			<-done
			reg.Close()
			cloudly.Close()
		})
	}
	t.Cleanup(stop)
	return &relayEnv{addr: r.DownstreamAddr().String(), cacheDir: cacheDir, prom: prom, reg: reg, logs: logs, stop: stop}
}

// metric reads one series from the relay's metrics registry; 0 when absent.
func (e *relayEnv) metric(t testing.TB, fullName string, labels ...string) float64 {
	t.Helper()
	mfs, err := e.prom.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != fullName {
			continue
		}
	series:
		for _, m := range mf.GetMetric() {
			want := map[string]string{}
			for i := 0; i+1 < len(labels); i += 2 {
				want[labels[i]] = labels[i+1]
			}
			for _, lp := range m.GetLabel() {
				if v, ok := want[lp.GetName()]; ok && v != lp.GetValue() {
					continue series
				}
			}
			if c := m.GetCounter(); c != nil {
				return c.GetValue()
			}
			return m.GetGauge().GetValue()
		}
	}
	return 0
}

// settle waits until no fill is in progress: a caller has its last byte once the object is
// verified, a moment before the object is published.
func (e *relayEnv) settle(t testing.TB) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for e.metric(t, "relay_registry_cache_fills_in_flight") != 0 {
		if time.Now().After(deadline) {
			t.Fatal("fills still in flight after 10s")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// client is a ggcr remote client with its own transport, closed at the end of the test.
type client struct {
	opts []remote.Option
}

func newClient(t testing.TB, user, password string) client {
	tr := &http.Transport{MaxIdleConnsPerHost: 64}
	t.Cleanup(tr.CloseIdleConnections)
	opts := []remote.Option{remote.WithTransport(tr), remote.WithRetryBackoff(remote.Backoff{Steps: 1})}
	if user != "" {
		opts = append(opts, remote.WithAuth(&authn.Basic{Username: user, Password: password}))
	}
	return client{opts: opts}
}

// pushImage pushes a random image of the given layers to up as alice and returns it.
func pushImage(t testing.TB, up *testUpstream, repo string, layerBytes, layers int64) v1.Image {
	t.Helper()
	img, err := random.Image(layerBytes, layers)
	if err != nil {
		t.Fatal(err)
	}
	ref, err := name.ParseReference(up.Host()+"/"+repo+":v1", name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	c := newClient(t, "alice", "alice-secret-pw")
	if err := remote.Write(ref, img, c.opts...); err != nil {
		t.Fatalf("push: %v", err)
	}
	return img
}

// pullImage pulls img by digest through the relay with a real client and reads every blob;
// ggcr verifies each against its digest.
func pullImage(t testing.TB, e *relayEnv, c client, repo string, img v1.Image) error {
	t.Helper()
	d, err := img.Digest()
	if err != nil {
		t.Fatal(err)
	}
	ref, err := name.NewDigest(e.addr+"/"+repo+"@"+d.String(), name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	got, err := remote.Image(ref, c.opts...)
	if err != nil {
		return err
	}
	if _, err := got.RawConfigFile(); err != nil {
		return err
	}
	layers, err := got.Layers()
	if err != nil {
		return err
	}
	for _, l := range layers {
		rc, err := l.Compressed()
		if err != nil {
			return err
		}
		_, err = io.Copy(io.Discard, rc)
		if cerr := rc.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// token fetches a Bearer token for user straight from the upstream's token endpoint.
func (u *testUpstream) tokenFor(t testing.TB, user, password string) string {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, u.URL()+"/token?service="+testService, nil)
	if user != "" {
		req.SetBasicAuth(user, password)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var body struct{ Token string }
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		t.Fatal(err)
	}
	return body.Token
}

// rawGet sends one request to the relay with a fresh connection and reads the whole answer.
func rawGet(t testing.TB, e *relayEnv, method, path, token string, hdr map[string]string) (*http.Response, []byte, error) {
	t.Helper()
	req, err := http.NewRequest(method, "http://"+e.addr+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	tr := &http.Transport{DisableKeepAlives: true}
	defer tr.CloseIdleConnections()
	c := &http.Client{Transport: tr, Timeout: 30 * time.Second}
	resp, err := c.Do(req)
	if err != nil {
		return nil, nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return resp, body, err
}

func sha256Of(b []byte) string {
	s := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(s[:])
}

// blobPath is where the cache publishes a digest.
func blobPath(cacheDir, digest string) string {
	h := digest[len("sha256:"):]
	return filepath.Join(cacheDir, "sha256", h[:2], h)
}

func layerDigests(t testing.TB, img v1.Image) []v1.Hash {
	t.Helper()
	ls, err := img.Layers()
	if err != nil {
		t.Fatal(err)
	}
	var ds []v1.Hash
	for _, l := range ls {
		d, err := l.Digest()
		if err != nil {
			t.Fatal(err)
		}
		ds = append(ds, d)
	}
	return ds
}

func blobBytesOf(t testing.TB, img v1.Image) int64 {
	t.Helper()
	m, err := img.Manifest()
	if err != nil {
		t.Fatal(err)
	}
	n := m.Config.Size
	for _, l := range m.Layers {
		n += l.Size
	}
	return n
}
