package transfer

import (
	"crypto/tls"
	"fmt"
	"sync/atomic"
)

// KeyPair is a certificate chain and its key read from PEM files, served
// through tls.Config callbacks so that Reload swaps it under running
// servers and clients: a handshake after Reload presents the new
// certificate, connections already open keep theirs. cert-manager and
// similar rotate the files in place; the process reloads on a signal.
type KeyPair struct {
	certFile, keyFile string
	cur               atomic.Pointer[tls.Certificate]
}

// LoadKeyPair reads the certificate chain and key files.
func LoadKeyPair(certFile, keyFile string) (*KeyPair, error) {
	k := &KeyPair{certFile: certFile, keyFile: keyFile}
	if err := k.Reload(); err != nil {
		return nil, err
	}
	return k, nil
}

// Reload reads the files again. On error the pair keeps the certificate it
// had, and the error names the files.
func (k *KeyPair) Reload() error {
	cert, err := tls.LoadX509KeyPair(k.certFile, k.keyFile)
	if err != nil {
		return fmt.Errorf("transfer: TLS certificate %s, key %s: %w", k.certFile, k.keyFile, err)
	}
	k.cur.Store(&cert)
	return nil
}

// Certificate returns the certificate in force.
func (k *KeyPair) Certificate() *tls.Certificate { return k.cur.Load() }

// getCertificate is tls.Config.GetCertificate.
func (k *KeyPair) getCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	return k.cur.Load(), nil
}

// getClientCertificate is tls.Config.GetClientCertificate.
func (k *KeyPair) getClientCertificate(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
	return k.cur.Load(), nil
}
