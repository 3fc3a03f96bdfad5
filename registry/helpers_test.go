package registry_test

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"go.uber.org/goleak"

	"code.foss.global/serve.zone/relay/registry"
	"code.foss.global/serve.zone/relay/relay"
	"code.foss.global/serve.zone/relay/testenv/relaytest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// relayEnv is a real relay (testenv/relaytest: relay.New, its downstream listener, a simulated
// Cloudly) whose /v2/ is served by registry.New, wired as cmd/relay's build() wires it.
type relayEnv struct {
	*relaytest.Env
	addr     string // the downstream listener, host:port
	cacheDir string
	reg      *registry.Registry
}

// startRelay starts a relay forwarding to up. cacheDir "" makes a fresh one; tune may change the
// registry options. Close stops the relay, which closes the registry; it also runs at cleanup.
func startRelay(t testing.TB, upstreamURL, cacheDir string, tune func(*registry.Options)) *relayEnv {
	t.Helper()
	if cacheDir == "" {
		cacheDir = filepath.Join(t.TempDir(), "cache")
	}
	e := &relayEnv{cacheDir: cacheDir}
	e.Env = relaytest.Start(t, relaytest.Options{
		Configure: func(cfg *relay.Config) { cfg.RegistryUpstream = upstreamURL },
		Build: func(cfg relay.Config, o relay.Options) (*relay.Relay, error) {
			opts := registry.Options{Upstream: cfg.RegistryUpstream, CacheDir: cacheDir,
				CacheMaxBytes: 10 << 30, Registerer: o.Registry, Logger: o.Logger}
			if tune != nil {
				tune(&opts)
			}
			var err error
			if e.reg, err = registry.New(opts); err != nil {
				return nil, err
			}
			return relay.New(cfg, relay.Features{Registry: e.reg}, o)
		},
	})
	e.addr = e.Relay.DownstreamAddr().String()
	return e
}

// settle waits until no fill is in progress: a caller has its last byte once the object is
// verified, a moment before the object is published.
func (e *relayEnv) settle() {
	e.T.Helper()
	e.Eventually("no fill in flight", func() bool { return e.Metric("relay_registry_cache_fills_in_flight") == 0 })
}

// client is a ggcr remote client with its own transport, closed at the end of the test.
type client struct {
	opts []remote.Option
}

func newClient(t testing.TB, user, password string) client {
	return newClientFrom(t, "", user, password)
}

// newClientFrom is newClient whose connections leave from the loopback address source ("": any),
// so that the relay sees another caller.
func newClientFrom(t testing.TB, source, user, password string, extra ...remote.Option) client {
	tr := &http.Transport{MaxIdleConnsPerHost: 64, DialContext: dialerFrom(source).DialContext}
	t.Cleanup(tr.CloseIdleConnections)
	opts := append([]remote.Option{remote.WithTransport(tr), remote.WithRetryBackoff(remote.Backoff{Steps: 1})}, extra...)
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

// dialerFrom dials from the loopback address source ("": any). The relay tells callers apart
// by their TCP peer address, and every 127.0.0.0/8 address reaches its loopback listener.
func dialerFrom(source string) *net.Dialer {
	d := &net.Dialer{Timeout: 5 * time.Second}
	if source != "" {
		d.LocalAddr = &net.TCPAddr{IP: net.ParseIP(source)}
	}
	return d
}

// rawGet sends one request to the relay with a fresh connection and reads the whole answer.
func rawGet(t testing.TB, e *relayEnv, method, path, token string, hdr map[string]string) (*http.Response, []byte, error) {
	t.Helper()
	return rawGetFrom(t, e, "", method, path, token, hdr)
}

// rawGetFrom is rawGet from the loopback address source.
func rawGetFrom(t testing.TB, e *relayEnv, source, method, path, token string, hdr map[string]string) (*http.Response, []byte, error) {
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
	tr := &http.Transport{DisableKeepAlives: true, DialContext: dialerFrom(source).DialContext}
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
