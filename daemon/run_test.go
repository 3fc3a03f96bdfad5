package daemon

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"io"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"code.foss.global/serve.zone/relay/contracts"
	"code.foss.global/serve.zone/relay/relay"
	"code.foss.global/serve.zone/relay/testenv/await"
	"code.foss.global/serve.zone/relay/testenv/relaytest"
)

// TestRunServesDownstreamTLS runs `relay run` with --tls-cert-file and --tls-key-file (no
// --insecure-plaintext) and completes a TLS handshake with the downstream listener, checking the
// relay serves the certificate in the files.
func TestRunServesDownstreamTLS(t *testing.T) {
	dir := t.TempDir()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(7), Subject: pkix.Name{CommonName: "relay.test"},
		DNSNames: []string{"relay.test"}, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour)}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile, token := filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key"), filepath.Join(dir, "token")
	os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600)
	os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}), 0o600)
	os.WriteFile(token, []byte("jwt\n"), 0o600)

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	_, port, _ := net.SplitHostPort(addr)
	if _, err := strconv.Atoi(port); err != nil {
		t.Fatal(err)
	}

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan int, 1)
	var stderr relaytest.Buffer // log lines come from several goroutines
	go func() {
		done <- realMain(ctx, []string{"run", "--cluster-id", "c1", "--node-id", "n1", "--cloudly-url", "wss://127.0.0.1:1/",
			"--cloudly-token-file", token, "--advertise-address", "192.0.2.10", "--listen", addr, "--admin-listen", "127.0.0.1:0",
			"--tls-cert-file", certFile, "--tls-key-file", keyFile}, &bytes.Buffer{}, &stderr)
	}()
	defer func() {
		cancel()
		if code := <-done; code != 0 {
			t.Errorf("relay run exited %d: %s", code, stderr.String())
		}
	}()

	roots := x509.NewCertPool()
	roots.AddCert(mustParse(t, der))
	var conn *tls.Conn
	await.Within(10*time.Second, func() bool {
		conn, err = tls.DialWithDialer(&net.Dialer{Timeout: time.Second}, "tcp", addr, &tls.Config{RootCAs: roots, ServerName: "relay.test"})
		return err == nil
	})
	if err != nil {
		t.Fatalf("TLS handshake with the downstream listener: %v", err)
	}
	defer conn.Close()
	if got := conn.ConnectionState().PeerCertificates[0].Raw; !bytes.Equal(got, der) {
		t.Fatal("the relay served another certificate than --tls-cert-file")
	}
}

func mustParse(t *testing.T, der []byte) *x509.Certificate {
	t.Helper()
	c, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// lineWaiter is a log writer that hands over the first line containing each of its patterns.
type lineWaiter struct {
	mu    sync.Mutex
	buf   []byte
	wants map[string]chan string
}

func (w *lineWaiter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf = append(w.buf, p...)
	for {
		i := bytes.IndexByte(w.buf, '\n')
		if i < 0 {
			return len(p), nil
		}
		line := string(w.buf[:i])
		w.buf = w.buf[i+1:]
		for pat, ch := range w.wants {
			if strings.Contains(line, pat) {
				ch <- line
				delete(w.wants, pat)
			}
		}
	}
}

// `relay run` logs one start-up line with the build, the protocol, the bound addresses and the
// parts on and off; every duration field carries its unit (here the re-dial wait, as a Go
// duration string).
func TestRunLogsItsStartAndDurationsWithUnits(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	w := &lineWaiter{wants: map[string]chan string{`"relay starting"`: make(chan string, 1), `"re-dialling Cloudly"`: make(chan string, 1)}}
	starting, redial := w.wants[`"relay starting"`], w.wants[`"re-dialling Cloudly"`]
	done := make(chan int, 1)
	go func() { done <- realMain(ctx, runArgs(t, "run"), io.Discard, w) }()
	var start struct {
		Component, Version, Protocol, Listen, Admin, Advertise string
		MinPeer                                                string   `json:"min_peer_protocol"`
		On                                                     []string `json:"on"`
		Off                                                    []string `json:"off"`
	}
	select {
	case line := <-starting:
		if err := json.Unmarshal([]byte(line), &start); err != nil {
			t.Fatalf("%v: %s", err, line)
		}
	case code := <-done:
		t.Fatalf("run exited %d before logging its start", code)
	}
	if start.Component != "relay" || start.Version != relay.DefaultBuildVersion || start.Protocol != contracts.InterfacesVersion ||
		start.MinPeer != contracts.MinimumPeerVersion || !strings.HasPrefix(start.Listen, "127.0.0.1:") || strings.HasSuffix(start.Listen, ":0") ||
		!strings.HasPrefix(start.Admin, "127.0.0.1:") || start.Advertise != "192.0.2.10" ||
		strings.Join(start.On, ",") != "escrow,ingress,restore,platform" || strings.Join(start.Off, ",") != "tls,vpnhub,registry,registry-cache,ha" {
		t.Fatalf("start-up line: %+v", start)
	}
	select {
	case line := <-redial:
		var ev struct{ Wait any }
		json.Unmarshal([]byte(line), &ev)
		s, ok := ev.Wait.(string)
		if _, err := time.ParseDuration(s); !ok || err != nil {
			t.Fatalf("wait %#v is not a duration with its unit: %s", ev.Wait, line)
		}
	case code := <-done:
		t.Fatalf("run exited %d before re-dialling", code)
	}
	cancel()
	if code := <-done; code != 0 {
		t.Fatalf("run exited %d after its context ended", code)
	}
}
