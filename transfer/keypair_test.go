package transfer_test

import (
	"crypto/tls"
	"math/big"
	"os"
	"path/filepath"
	"testing"

	"github.com/kvmesh/kvmesh/transfer"
	"github.com/kvmesh/kvmesh/transfer/certtest"
)

// TestKeyPairReload: a server running on LoadReloadableTLS's configuration
// presents the rotated certificate after Reload, and keeps the old one
// when the new files do not load.
func TestKeyPairReload(t *testing.T) {
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
	server, client, pair, err := transfer.LoadReloadableTLS(transfer.TLSFiles{Cert: certFile, Key: keyFile, CA: ca.File, ClientAuth: true})
	if err != nil {
		t.Fatal(err)
	}
	lis, err := tls.Listen("tcp", "127.0.0.1:0", server)
	if err != nil {
		t.Fatal(err)
	}
	defer lis.Close()
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := lis.Accept()
			if err != nil {
				return
			}
			_ = c.(*tls.Conn).Handshake() // the client's certificate is the pair too
			c.Close()
		}
	}()
	defer func() { lis.Close(); <-done }()
	served := func() *big.Int {
		t.Helper()
		c, err := tls.Dial("tcp", lis.Addr().String(), client)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		return c.ConnectionState().PeerCertificates[0].SerialNumber
	}
	first := served()

	install("second")
	if got := served(); got.Cmp(first) != 0 {
		t.Fatalf("certificate changed before Reload")
	}
	if err := pair.Reload(); err != nil {
		t.Fatal(err)
	}
	second := served()
	if second.Cmp(first) == 0 {
		t.Fatalf("Reload: the server still presents the first certificate")
	}

	os.WriteFile(keyFile, []byte("not a key"), 0o600)
	if err := pair.Reload(); err == nil {
		t.Fatal("Reload of a broken key file succeeded")
	}
	if got := served(); got.Cmp(second) != 0 {
		t.Errorf("after a failed Reload the server presents another certificate than the last good one")
	}
}
