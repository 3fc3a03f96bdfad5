package wire

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"math/big"
	"time"

	"code.foss.global/serve.zone/relay/contracts"
)

// QUIC's TLS carries no trust here (docs/protocol.md#vpn-hub): the hub presents a throwaway self-signed
// certificate and the client does not verify it. The Noise handshake authenticates both sides.

// HubTLSConfig returns the hub's TLS configuration with a fresh self-signed certificate.
func HubTLSConfig() (*tls.Config, error) {
	priv, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(now.UnixNano()),
		Subject:      pkix.Name{CommonName: "servezone-vpnhub"},
		NotBefore:    now.Add(-time.Hour), NotAfter: now.Add(10 * 365 * 24 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &priv.PublicKey, priv)
	if err != nil {
		return nil, err
	}
	return &tls.Config{
		MinVersion:   tls.VersionTLS13,
		Certificates: []tls.Certificate{{Certificate: [][]byte{der}, PrivateKey: priv}},
		NextProtos:   []string{contracts.VPNHubALPN},
	}, nil
}

// ClientTLSConfig dials on the address alone and verifies nothing.
func ClientTLSConfig() *tls.Config {
	return &tls.Config{
		MinVersion:         tls.VersionTLS13,
		InsecureSkipVerify: true, // docs/protocol.md#vpn-hub: Noise authenticates the hub, not TLS
		NextProtos:         []string{contracts.VPNHubALPN},
	}
}
