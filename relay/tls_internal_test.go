package relay

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"os"
	"path/filepath"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// writePair writes a self-signed certificate valid until notAfter and its key to certFile and
// keyFile, and stamps the certificate file with mtime.
func writePair(t *testing.T, certFile, keyFile string, notAfter, mtime time.Time) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(notAfter.Unix()), Subject: pkix.Name{CommonName: "relay.test"},
		DNSNames: []string{"relay.test"}, NotBefore: notAfter.Add(-90 * 24 * time.Hour), NotAfter: notAfter}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chtimes(certFile, mtime, mtime); err != nil {
		t.Fatal(err)
	}
}

// expiryOf gathers reg and returns the certificate expiry metric's value, and whether it had one.
func expiryOf(t *testing.T, reg *prometheus.Registry) (float64, bool) {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() == certExpiryName {
			if f.GetType().String() != "GAUGE" || len(f.Metric) != 1 {
				t.Fatalf("%s is a %s with %d series: want one gauge", certExpiryName, f.GetType(), len(f.Metric))
			}
			return f.Metric[0].GetGauge().GetValue(), true
		}
	}
	return 0, false
}

// TestCertificateExpiryMetricFollowsTheServedCertificate: the metric is the expiry of the
// certificate the downstream listener serves, from the files at start, and from a renewed pair
// on the next scrape after the reload interval, without any handshake in between; the handshake
// after it is served the same renewed certificate.
func TestCertificateExpiryMetricFollowsTheServedCertificate(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		dir := t.TempDir()
		certFile, keyFile := filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
		first := time.Date(2027, 3, 1, 12, 0, 0, 0, time.UTC)
		renewed := first.Add(60 * 24 * time.Hour)
		writePair(t, certFile, keyFile, first, time.Unix(1_000_000, 0))
		certs, err := newCertReloader(certFile, keyFile)
		if err != nil {
			t.Fatal(err)
		}
		reg := prometheus.NewRegistry()
		reg.MustRegister(newCertExpiry(certs))
		if got, ok := expiryOf(t, reg); !ok || got != float64(first.Unix()) {
			t.Fatalf("%s = %v (present %v), want %d", certExpiryName, got, ok, first.Unix())
		}

		writePair(t, certFile, keyFile, renewed, time.Unix(2_000_000, 0))
		advance(11 * time.Second) // past the reload interval
		if got, ok := expiryOf(t, reg); !ok || got != float64(renewed.Unix()) {
			t.Fatalf("after renewing the files, %s = %v (present %v), want %d", certExpiryName, got, ok, renewed.Unix())
		}
		served, err := certs.get(nil)
		if err != nil {
			t.Fatal(err)
		}
		if !served.Leaf.NotAfter.Equal(renewed) {
			t.Fatalf("the handshake is served a certificate expiring %v, the metric says %v", served.Leaf.NotAfter, renewed)
		}
	})
}

// TestCertificateExpiryMetricAbsentInPlaintext: with --insecure-plaintext there is no certificate,
// so no sample (not a 0 an expiry alert would read as long past), yet the metric is described.
func TestCertificateExpiryMetricAbsentInPlaintext(t *testing.T) {
	reg := prometheus.NewRegistry()
	e := newCertExpiry(nil)
	reg.MustRegister(e)
	if got, ok := expiryOf(t, reg); ok {
		t.Fatalf("%s = %v without a certificate: want no sample", certExpiryName, got)
	}
	ch := make(chan *prometheus.Desc, 1)
	e.Describe(ch)
	if d := <-ch; d != e.desc {
		t.Fatalf("described %v, want the metric's own description", d)
	}
}
