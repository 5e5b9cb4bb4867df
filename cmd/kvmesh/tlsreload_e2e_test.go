package main

import (
	"crypto/tls"
	"crypto/x509"
	"math/big"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/transfer/certtest"
)

// TestServeTLSReload rotates a serving node's certificate as cert-manager
// would (new files in place) and sends SIGHUP: new connections, gRPC and
// data plane alike, get the new certificate; a broken key file then is
// logged and the node keeps serving the last good one.
func TestServeTLSReload(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the kvmesh binary")
	}
	dir := t.TempDir()
	ca := certtest.NewCA(t, dir, "kvmesh")
	certFile, keyFile := filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	install := func(name string) {
		c, k := ca.Issue(t, t.TempDir(), name, "127.0.0.1")
		for _, f := range [][2]string{{c, certFile}, {k, keyFile}} {
			b, err := os.ReadFile(f[0])
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(f[1], b, 0o600); err != nil {
				t.Fatal(err)
			}
		}
	}
	install("first")
	d := startDaemon(t, t.TempDir(), "--tls-cert", certFile, "--tls-key", keyFile, "--tls-ca", ca.File, "--dram", "32MiB")

	pem, err := os.ReadFile(ca.File)
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(pem)
	served := func(addr string) *big.Int {
		t.Helper()
		c, err := tls.Dial("tcp", addr, &tls.Config{RootCAs: roots, NextProtos: []string{"h2"}, MinVersion: tls.VersionTLS13})
		if err != nil {
			t.Fatalf("TLS to %s: %v\n%s", addr, err, d.stderr)
		}
		defer c.Close()
		return c.ConnectionState().PeerCertificates[0].SerialNumber
	}
	hup := func(log string) {
		t.Helper()
		before := strings.Count(d.stderr.String(), log)
		if err := d.cmd.Process.Signal(syscall.SIGHUP); err != nil {
			t.Fatal(err)
		}
		deadline := time.Now().Add(20 * time.Second)
		for strings.Count(d.stderr.String(), log) == before {
			if time.Now().After(deadline) {
				t.Fatalf("no %q 20s after SIGHUP:\n%s", log, d.stderr)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	first := served(d.grpcAddr)
	if got := served(d.dataAddr); got.Cmp(first) != 0 {
		t.Fatalf("the data plane serves another certificate than gRPC")
	}

	install("second")
	hup("TLS certificate reloaded")
	second := served(d.grpcAddr)
	if second.Cmp(first) == 0 {
		t.Fatalf("gRPC still serves the first certificate after SIGHUP")
	}
	if got := served(d.dataAddr); got.Cmp(second) != 0 {
		t.Errorf("the data plane serves %v after SIGHUP, want the new certificate %v", got, second)
	}

	if err := os.WriteFile(keyFile, []byte("not a key"), 0o600); err != nil {
		t.Fatal(err)
	}
	hup("TLS certificate not reloaded")
	if got := served(d.grpcAddr); got.Cmp(second) != 0 {
		t.Errorf("after a broken key file and SIGHUP the node serves %v, want the last good certificate %v", got, second)
	}
}
