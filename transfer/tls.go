package transfer

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"time"
)

// TLSFiles names the PEM files of a process's TLS setup. LoadTLS turns them
// into the configurations of ServerOptions.TLS and ClientOptions.TLS; the
// same configurations suit a gRPC server and client
// (credentials.NewTLS), so one set of files serves both planes.
type TLSFiles struct {
	// Cert and Key are the PEM files of this process's certificate chain
	// (leaf first) and its private key: served to clients, and presented
	// to servers that ask for a client certificate (mutual TLS). Both or
	// neither; a process that only dials (an inference worker without a
	// client certificate) leaves them empty. With mutual TLS between
	// nodes, the certificate serves both roles: give it no extended key
	// usage, or both serverAuth and clientAuth.
	Cert, Key string
	// CA is the PEM file of the certificate authorities that sign the
	// peers' certificates: a client verifies servers against it, a server
	// with ClientAuth verifies clients against it. Empty: clients verify
	// servers against the system's roots.
	CA string
	// ClientAuth makes the server require a client certificate signed by
	// a CA of the CA file (mutual TLS); a client without one is refused
	// during the handshake. Needs CA.
	ClientAuth bool
	// ServerName is the name a client verifies in servers' certificates.
	// Empty: the host of the address dialed, so a peer dialed by IP
	// address must have that address among its certificate's IP SANs.
	// Set it when every node's certificate carries one common DNS name.
	ServerName string
}

// LoadTLS reads the files and returns the TLS configurations of a server
// (nil when f names no certificate) and of a client. Both speak TLS 1.3
// only. The certificate is read once: LoadReloadableTLS returns it as a
// KeyPair that can be read again under running servers. Errors name the
// file at fault.
func LoadTLS(f TLSFiles) (server, client *tls.Config, err error) {
	server, client, _, err = LoadReloadableTLS(f)
	return server, client, err
}

// LoadReloadableTLS is LoadTLS, and the certificate both configurations
// present (nil when f names none): KeyPair.Reload reads its files again
// and every later handshake presents the new one. The CA file is read
// once.
func LoadReloadableTLS(f TLSFiles) (server, client *tls.Config, pair *KeyPair, err error) {
	if (f.Cert == "") != (f.Key == "") {
		return nil, nil, nil, fmt.Errorf("transfer: TLS needs both a certificate and a key file (cert %q, key %q)", f.Cert, f.Key)
	}
	if f.ClientAuth && f.CA == "" {
		return nil, nil, nil, errors.New("transfer: TLS client authentication needs a CA file to verify client certificates against")
	}
	if f.Cert != "" {
		if pair, err = LoadKeyPair(f.Cert, f.Key); err != nil {
			return nil, nil, nil, err
		}
	}
	var pool *x509.CertPool
	if f.CA != "" {
		pem, err := os.ReadFile(f.CA)
		if err != nil {
			return nil, nil, nil, fmt.Errorf("transfer: TLS CA file: %w", err)
		}
		pool = x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, nil, nil, fmt.Errorf("transfer: TLS CA file %s holds no PEM certificate", f.CA)
		}
	}
	client = &tls.Config{
		MinVersion: tls.VersionTLS13,
		RootCAs:    pool,
		ServerName: f.ServerName,
	}
	if pair == nil {
		return nil, client, nil, nil
	}
	client.GetClientCertificate = pair.getClientCertificate
	server = &tls.Config{MinVersion: tls.VersionTLS13, GetCertificate: pair.getCertificate}
	if f.ClientAuth {
		server.ClientAuth = tls.RequireAndVerifyClientCert
		server.ClientCAs = pool
	}
	return server, client, pair, nil
}

// prepareTLS returns the configuration a connection uses: a copy of cfg
// (the caller's stays untouched) that speaks TLS 1.3 only and seals full
// 16 KiB records from the first byte (dynamic record sizing helps a web
// page's first paint, not a stream of megabyte values). A client's copy
// verifies the host of addr when cfg names no server.
func prepareTLS(cfg *tls.Config, addr string) *tls.Config {
	if cfg == nil {
		return nil
	}
	cfg = cfg.Clone()
	cfg.MinVersion = tls.VersionTLS13
	cfg.DynamicRecordSizingDisabled = true
	if addr != "" && cfg.ServerName == "" {
		if host, _, err := net.SplitHostPort(addr); err == nil {
			cfg.ServerName = host
		}
	}
	return cfg
}

// validateTLS checks what prepareTLS cannot fix.
func validateTLS(cfg *tls.Config, field string, server bool) error {
	switch {
	case cfg == nil:
		return nil
	case cfg.MaxVersion != 0 && cfg.MaxVersion < tls.VersionTLS13:
		return fmt.Errorf("transfer: %s.MaxVersion %#x is below TLS 1.3, the only version the data plane speaks", field, cfg.MaxVersion)
	case server && len(cfg.Certificates) == 0 && cfg.GetCertificate == nil && cfg.GetConfigForClient == nil:
		return fmt.Errorf("transfer: %s has no certificate (Certificates or GetCertificate)", field)
	}
	return nil
}

// looksLikeFrame reports whether the first bytes a TLS end received are a
// plain data-plane frame's: the peer does not speak TLS.
func looksLikeFrame(b []byte) bool {
	return len(b) >= 4 && b[0] == 'K' && b[1] == 'V' && b[2] == 'T' && b[3] == 'F'
}

// looksLikeTLS reports whether the first bytes a plain end received open a
// TLS handshake record (content type 22, version 3.x).
func looksLikeTLS(b []byte) bool { return len(b) >= 2 && b[0] == 0x16 && b[1] == 0x03 }

// tlsError turns an error met while opening a TLS connection into an ErrAuth
// error when TLS itself failed (a certificate refused on either side, a
// protocol mismatch), and returns err unchanged otherwise (a timeout, a
// connection reset): those are the network's, not the configuration's.
func tlsError(err error) error {
	var (
		rhe tls.RecordHeaderError
		cve *tls.CertificateVerificationError
		ae  tls.AlertError
		oe  *net.OpError
	)
	switch {
	case errors.As(err, &rhe) && looksLikeFrame(rhe.RecordHeader[:]):
		return &authError{reason: "the peer answered in plain TCP: it does not use TLS", err: err}
	case errors.As(err, &rhe):
		return &authError{reason: "the peer does not speak TLS", err: err}
	case errors.As(err, &cve):
		return &authError{reason: "TLS: the peer's certificate is not trusted", err: err}
	case errors.As(err, &ae):
		return &authError{reason: "TLS handshake failed", err: err}
	case errors.As(err, &oe) && oe.Op == "remote error":
		return &authError{reason: "TLS: the peer refused the handshake", err: err}
	}
	return err
}

// lingerTime bounds how long a server waits, after refusing a connection,
// for the client to read the refusal and hang up.
const lingerTime = time.Second

// lingerClose half-closes nc after a refusal was written to it and reads
// (and drops) what the client still sends until it hangs up or lingerTime
// passes, so that the refusal is read: closing a socket with unread input
// sends a reset, which can destroy the refusal in flight. The caller
// closes nc after.
func lingerClose(nc net.Conn) {
	if cw, ok := nc.(interface{ CloseWrite() error }); ok {
		cw.CloseWrite()
	}
	nc.SetReadDeadline(time.Now().Add(lingerTime))
	io.Copy(io.Discard, io.LimitReader(nc, 1<<20))
}
