package kubeapi

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// The two users of the static token file. Admin is in system:masters and passes every
// authorization; Relay is the user the relays run as, allowed only what SetupNamespace grants.
const (
	Admin = "admin"
	Relay = "relay"
)

// users maps each user to its groups in the token file.
var users = map[string]string{Admin: "system:masters", Relay: ""}

// pki is the files an API server is started with, all in one temporary directory.
type pki struct {
	caFile     string            // owner: writePKI; the CA that signed the serving certificate
	certFile   string            // owner: writePKI; the serving certificate, for 127.0.0.1
	keyFile    string            // owner: writePKI; its private key
	saKeyFile  string            // owner: writePKI; the service-account token signing key
	saPubFile  string            // owner: writePKI; its public half, to verify those tokens
	tokenAuth  string            // owner: writePKI; --token-auth-file: token,user,uid,"groups"
	tokenFiles map[string]string // owner: writePKI; user → a file holding only its token
}

// writePKI generates a CA, a serving certificate, a service-account key pair and a token for
// each user, and writes them (mode 0600) under dir. Tokens exist only in these files.
func writePKI(dir string) (*pki, error) {
	p := &pki{
		caFile: filepath.Join(dir, "ca.crt"), certFile: filepath.Join(dir, "serving.crt"),
		keyFile: filepath.Join(dir, "serving.key"), saKeyFile: filepath.Join(dir, "sa.key"),
		saPubFile: filepath.Join(dir, "sa.pub"), tokenAuth: filepath.Join(dir, "tokens.csv"),
		tokenFiles: map[string]string{},
	}
	caKey, caDER, err := certificate(nil, nil, true)
	if err != nil {
		return nil, err
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		return nil, err
	}
	key, der, err := certificate(ca, caKey, false)
	if err != nil {
		return nil, err
	}
	saKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	saPub, err := x509.MarshalPKIXPublicKey(&saKey.PublicKey)
	if err != nil {
		return nil, err
	}
	files := map[string][]byte{
		p.caFile: pemBlock("CERTIFICATE", caDER), p.certFile: pemBlock("CERTIFICATE", der),
		p.saPubFile: pemBlock("PUBLIC KEY", saPub),
	}
	for path, k := range map[string]*ecdsa.PrivateKey{p.keyFile: key, p.saKeyFile: saKey} {
		der, err := x509.MarshalECPrivateKey(k)
		if err != nil {
			return nil, err
		}
		files[path] = pemBlock("EC PRIVATE KEY", der)
	}
	var csv strings.Builder
	for user, groups := range users {
		secret := make([]byte, 32)
		if _, err := rand.Read(secret); err != nil {
			return nil, err
		}
		token := hex.EncodeToString(secret)
		fmt.Fprintf(&csv, "%s,%s,%s", token, user, user)
		if groups != "" {
			fmt.Fprintf(&csv, ",%q", groups)
		}
		csv.WriteString("\n")
		p.tokenFiles[user] = filepath.Join(dir, "token-"+user)
		files[p.tokenFiles[user]] = []byte(token)
	}
	files[p.tokenAuth] = []byte(csv.String())
	for path, data := range files {
		if err := os.WriteFile(path, data, 0o600); err != nil {
			return nil, err
		}
	}
	return p, nil
}

// certificate makes a P-256 key and a certificate for it: a CA when isCA (self-signed), else a
// serving certificate for 127.0.0.1 and localhost signed by parent.
func certificate(parent *x509.Certificate, parentKey *ecdsa.PrivateKey, isCA bool) (*ecdsa.PrivateKey, []byte, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	if err != nil {
		return nil, nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial, Subject: pkix.Name{CommonName: "kubeapi test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		KeyUsage: x509.KeyUsageCertSign, BasicConstraintsValid: true, IsCA: true,
	}
	if !isCA {
		tmpl.Subject.CommonName, tmpl.IsCA = "kube-apiserver", false
		tmpl.KeyUsage = x509.KeyUsageDigitalSignature
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
		tmpl.IPAddresses, tmpl.DNSNames = []net.IP{net.IPv4(127, 0, 0, 1)}, []string{"localhost"}
	} else {
		parent, parentKey = tmpl, key
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, &key.PublicKey, parentKey)
	return key, der, err
}

func pemBlock(kind string, der []byte) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: kind, Bytes: der})
}
