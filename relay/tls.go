package relay

import (
	"crypto/tls"
	"fmt"
	"log"
	"os"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"code.foss.global/serve.zone/relay/status"
)

// certReloader serves the downstream certificate and picks up a renewed one from its files
// without a restart (Cloudly re-issues the relay certificate; the published documents leave delivery to the
// operator, who replaces the files).
type certReloader struct {
	certFile, keyFile string
	now               func() time.Time // set at construction: time.Now, or the relay's clock (New)

	mu      sync.Mutex
	cert    *tls.Certificate // guarded by mu
	modTime time.Time        // guarded by mu: of the certificate file when loaded
	checked time.Time        // guarded by mu: last stat
}

func newCertReloader(certFile, keyFile string) (*certReloader, error) {
	c := &certReloader{certFile: certFile, keyFile: keyFile, now: time.Now}
	if err := c.load(); err != nil {
		return nil, err
	}
	return c, nil
}

func (c *certReloader) load() error {
	st, err := os.Stat(c.certFile)
	if err != nil {
		return fmt.Errorf("tls certificate: %w", err)
	}
	cert, err := tls.LoadX509KeyPair(c.certFile, c.keyFile)
	if err != nil {
		return fmt.Errorf("tls certificate %s: %w", c.certFile, err)
	}
	c.cert, c.modTime = &cert, st.ModTime()
	return nil
}

// info is the certificate served now: its names and expiry.
func (c *certReloader) info() *status.CertInfo {
	c.mu.Lock()
	defer c.mu.Unlock()
	return status.CertOf(c.cert.Leaf)
}

func (c *certReloader) get(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.currentLocked(), nil
}

// currentLocked is the certificate the next handshake is served, reloaded first when its file has
// changed since the last look (at most every 10 s).
func (c *certReloader) currentLocked() *tls.Certificate {
	if now := c.now(); now.Sub(c.checked) > 10*time.Second {
		c.checked = now
		if st, err := os.Stat(c.certFile); err == nil && !st.ModTime().Equal(c.modTime) {
			_ = c.load() // on a half-written pair keep serving the old certificate
		}
	}
	return c.cert
}

// certExpiryName is the downstream certificate's expiry metric.
const certExpiryName = "relay_downstream_certificate_expiry_timestamp_seconds"

// certExpiry exports when the downstream certificate expires, as Unix seconds: the certificate
// the next handshake is served, so a scrape picks up a renewed file as a handshake would. With
// --insecure-plaintext there is none, and no sample: an alert on it stays silent rather than
// reading 0 as long expired. It is always described, so the metric is listed either way.
type certExpiry struct {
	certs *certReloader // set at construction; nil with --insecure-plaintext
	desc  *prometheus.Desc
}

func newCertExpiry(certs *certReloader) *certExpiry {
	return &certExpiry{certs: certs, desc: prometheus.NewDesc(certExpiryName,
		"When the downstream certificate (--tls-cert-file) expires, in Unix seconds; read from the file on a scrape when it has changed. Absent with --insecure-plaintext.",
		nil, nil)}
}

func (e *certExpiry) Describe(ch chan<- *prometheus.Desc) { ch <- e.desc }

func (e *certExpiry) Collect(ch chan<- prometheus.Metric) {
	if e.certs == nil {
		return
	}
	e.certs.mu.Lock()
	leaf := e.certs.currentLocked().Leaf
	e.certs.mu.Unlock()
	if leaf == nil {
		return
	}
	ch <- prometheus.MustNewConstMetric(e.desc, prometheus.GaugeValue, float64(leaf.NotAfter.Unix()))
}

// newStdLogger routes net/http's internal log lines (TLS handshake errors and the like) to a
// component logger at debug level.
func newStdLogger(l zerolog.Logger) *log.Logger {
	return log.New(levelWriter{l}, "", 0)
}

type levelWriter struct{ l zerolog.Logger }

func (w levelWriter) Write(p []byte) (int, error) {
	n := len(p)
	for n > 0 && p[n-1] == '\n' {
		n--
	}
	w.l.Debug().Msg(string(p[:n]))
	return len(p), nil
}
