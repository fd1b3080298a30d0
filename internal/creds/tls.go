package creds

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// ensureTLS makes a CA (kept in keys/, reused) and a server certificate for
// c.Hosts signed by it, usable for client connections and, with client
// authentication, for routes. Bring your own by replacing
// server/tls/{server.pem,server-key.pem,ca.pem} and creds/ca.pem.
func ensureTLS(c Config) error {
	caKey, caCert, err := loadOrCreateCA(c.Dir)
	if err != nil {
		return err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: "warden-nats", Organization: []string{"Warden"}},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().AddDate(2, 0, 0),
		KeyUsage:     x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	}
	for _, h := range c.Hosts {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, caCert, &key.PublicKey, caKey)
	if err != nil {
		return fmt.Errorf("server certificate: %w", err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return err
	}
	caPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caCert.Raw})
	server := filepath.Join(c.Dir, "server")
	for path, b := range map[string][]byte{
		filepath.Join(server, tlsCert): pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		filepath.Join(server, tlsKey):  pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}),
		filepath.Join(server, tlsCA):   caPEM,
		CAPath(c.Dir):                  caPEM,
	} {
		if err := writeSecret(path, b); err != nil {
			return err
		}
	}
	return nil
}

func serial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		panic("crypto/rand: " + err.Error())
	}
	return n
}

func loadOrCreateCA(dir string) (*ecdsa.PrivateKey, *x509.Certificate, error) {
	keyFile, certFile := filepath.Join(dir, "keys", "ca-key.pem"), filepath.Join(dir, "keys", "ca.pem")
	kb, kerr := os.ReadFile(keyFile)
	cb, cerr := os.ReadFile(certFile)
	if kerr == nil && cerr == nil {
		kp, _ := pem.Decode(kb)
		cp, _ := pem.Decode(cb)
		if kp == nil || cp == nil {
			return nil, nil, errors.New("unreadable CA in keys/")
		}
		key, err := x509.ParseECPrivateKey(kp.Bytes)
		if err != nil {
			return nil, nil, err
		}
		cert, err := x509.ParseCertificate(cp.Bytes)
		return key, cert, err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: "Warden CA", Organization: []string{"Warden"}},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().AddDate(10, 0, 0),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, nil, err
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, nil, err
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, nil, err
	}
	if err := writeSecret(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER})); err != nil {
		return nil, nil, err
	}
	return key, cert, writeSecret(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}))
}
