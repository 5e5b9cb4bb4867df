package transfer

import (
	"context"
	"crypto/tls"
	"errors"
	"github.com/kvmesh/kvmesh/auth"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/internal/testkit"
	"github.com/kvmesh/kvmesh/prefixhash"
	"github.com/kvmesh/kvmesh/transfer/certtest"
)

// testPKI is a test's certificates, in a temp dir: CA "a" with a node
// certificate for 127.0.0.1, and a foreign CA "b" with a certificate of its
// own for the same address.
type testPKI struct {
	dir                     string
	a, b                    *certtest.CA
	nodeCert, nodeKey       string // signed by a
	foreignCert, foreignKey string // signed by b
	namedCert, namedKey     string // signed by a, for the DNS name "node-a" only
}

func newPKI(t testing.TB) *testPKI {
	t.Helper()
	p := &testPKI{dir: t.TempDir()}
	p.a = certtest.NewCA(t, p.dir, "a")
	p.b = certtest.NewCA(t, p.dir, "b")
	p.nodeCert, p.nodeKey = p.a.Issue(t, p.dir, "node", "127.0.0.1", "localhost")
	p.foreignCert, p.foreignKey = p.b.Issue(t, p.dir, "foreign", "127.0.0.1")
	p.namedCert, p.namedKey = p.a.Issue(t, p.dir, "named", "node-a")
	return p
}

func loadTLS(t testing.TB, f TLSFiles) (server, client *tls.Config) {
	t.Helper()
	server, client, err := LoadTLS(f)
	if err != nil {
		t.Fatal(err)
	}
	return server, client
}

// sniffListener counts accepted connections and records the first byte each
// client sent, so a test can tell TLS (22, a handshake record) from plain
// frames ('K').
type sniffListener struct {
	net.Listener
	accepted atomic.Int64
	mu       sync.Mutex
	first    []byte
}

func (l *sniffListener) Accept() (net.Conn, error) {
	nc, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	l.accepted.Add(1)
	return &sniffConn{Conn: nc, l: l}, nil
}

func (l *sniffListener) firstBytes() []byte {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]byte(nil), l.first...)
}

type sniffConn struct {
	net.Conn
	l    *sniffListener
	seen bool
}

func (c *sniffConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	if n > 0 && !c.seen {
		c.seen = true
		c.l.mu.Lock()
		c.l.first = append(c.l.first, b[0])
		c.l.mu.Unlock()
	}
	return n, err
}

// startSniffed starts a server on a sniffListener.
func startSniffed(t *testing.T, src *memSource, opts *ServerOptions) (*Server, *sniffListener) {
	t.Helper()
	s, err := NewServer(src, src, opts, quietLog)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	sl := &sniffListener{Listener: ln}
	done := make(chan struct{})
	go func() {
		defer close(done)
		s.Serve(sl)
	}()
	t.Cleanup(func() {
		s.Close()
		<-done
	})
	return s, sl
}

// Values round-trip over TLS, gets and puts alike, and a pooled TLS
// connection serves request after request.
func TestTLSRoundTrip(t *testing.T) {
	p := newPKI(t)
	srvTLS, cliTLS := loadTLS(t, TLSFiles{Cert: p.nodeCert, Key: p.nodeKey, CA: p.a.File})
	src := newMemSource()
	_, ln := startSniffed(t, src, &ServerOptions{TLS: srvTLS})
	addr := ln.Addr().String()
	c := newClient(t, addr, &ClientOptions{TLS: cliTLS, MaxConns: 1, Limits: Limits{MaxItems: 512}})
	for _, tc := range roundTripCases() {
		keys := fill(src, tc.sizes)
		r, err := c.Get(context.Background(), keys)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		checkResult(t, src, keys, r)
		r.Release()
	}
	keys := []prefixhash.Key{testKey(1000), testKey(1001), testKey(1002)}
	vals := [][]byte{testValue(1, 5), testValue(2, 3<<20+1), {}}
	st, err := c.Put(context.Background(), keys, vals)
	if err != nil {
		t.Fatal(err)
	}
	for i := range st {
		if got, _ := src.get(keys[i]); st[i] != StatusOK || string(got) != string(vals[i]) {
			t.Fatalf("put %d over TLS: status %s, stored %d bytes of %d", i, st[i], len(got), len(vals[i]))
		}
	}
	if n := ln.accepted.Load(); n != 1 {
		t.Fatalf("%d connections for %d requests over MaxConns 1, want 1 reused", n, len(roundTripCases())+1)
	}
	if first := ln.firstBytes(); len(first) != 1 || first[0] != 0x16 {
		t.Fatalf("the client opened with %v, want a TLS handshake record (22)", first)
	}
	// The caller's configuration is not modified.
	if cliTLS.ServerName != "" || cliTLS.DynamicRecordSizingDisabled {
		t.Fatal("NewClient modified the caller's tls.Config")
	}
}

// Mutual TLS: the server admits clients whose certificate its CA signed, and
// refuses, with ErrAuth on the client, one signed by another CA or none.
func TestMutualTLS(t *testing.T) {
	p := newPKI(t)
	srvTLS, goodTLS := loadTLS(t, TLSFiles{Cert: p.nodeCert, Key: p.nodeKey, CA: p.a.File, ClientAuth: true})
	_, foreignTLS := loadTLS(t, TLSFiles{Cert: p.foreignCert, Key: p.foreignKey, CA: p.a.File})
	_, noCertTLS := loadTLS(t, TLSFiles{CA: p.a.File})
	src := newMemSource()
	srv, addr := startServer(t, src, &ServerOptions{TLS: srvTLS})
	keys := fill(src, []int{100, 200})

	good := newClient(t, addr, &ClientOptions{TLS: goodTLS})
	r, err := good.Get(context.Background(), keys)
	if err != nil {
		t.Fatalf("client certificate from the server's CA: %v", err)
	}
	checkResult(t, src, keys, r)
	r.Release()

	for name, cfg := range map[string]*tls.Config{"certificate of another CA": foreignTLS, "no certificate": noCertTLS} {
		c := newClient(t, addr, &ClientOptions{TLS: cfg, RequestTimeout: 5 * time.Second})
		within(t, 10*time.Second, func() {
			_, err := c.Get(context.Background(), keys)
			if !errors.Is(err, ErrAuth) || errors.Is(err, context.DeadlineExceeded) {
				t.Errorf("%s: %v, want ErrAuth before the deadline", name, err)
			}
		})
	}
	testkit.WaitFor(t, "the server to count 2 refusals", func() bool { return srv.Stats().Unauthorized == 2 })
	// The refusals cost the good client nothing.
	if r, err = good.Get(context.Background(), keys); err != nil {
		t.Fatal(err)
	}
	r.Release()
}

// A client refuses a server whose certificate it cannot verify: another
// CA's, or one for another name.
func TestTLSServerVerified(t *testing.T) {
	p := newPKI(t)
	_, trustsB := loadTLS(t, TLSFiles{CA: p.b.File})
	_, trustsA := loadTLS(t, TLSFiles{CA: p.a.File})
	_, namedA := loadTLS(t, TLSFiles{CA: p.a.File, ServerName: "node-a"})
	nodeTLS, _ := loadTLS(t, TLSFiles{Cert: p.nodeCert, Key: p.nodeKey})
	namedTLS, _ := loadTLS(t, TLSFiles{Cert: p.namedCert, Key: p.namedKey})
	src := newMemSource()
	keys := fill(src, []int{10})
	_, nodeAddr := startServer(t, src, &ServerOptions{TLS: nodeTLS})
	_, namedAddr := startServer(t, src, &ServerOptions{TLS: namedTLS})
	for _, tc := range []struct {
		name string
		addr string
		cfg  *tls.Config
		ok   bool
	}{
		{"server of an untrusted CA", nodeAddr, trustsB, false},
		{"server certificate without the IP dialed", namedAddr, trustsA, false},
		{"server name set to the certificate's", namedAddr, namedA, true},
		{"IP SAN matches the address dialed", nodeAddr, trustsA, true},
	} {
		c := newClient(t, tc.addr, &ClientOptions{TLS: tc.cfg})
		within(t, 10*time.Second, func() {
			r, err := c.Get(context.Background(), keys)
			switch {
			case tc.ok && err != nil:
				t.Errorf("%s: %v", tc.name, err)
			case tc.ok:
				r.Release()
			case !errors.Is(err, ErrAuth) || !strings.Contains(err.Error(), "not trusted"):
				t.Errorf("%s: %v, want ErrAuth saying the certificate is not trusted", tc.name, err)
			}
		})
	}
}

// A plain client and a TLS server (and the other way round) fail at once
// with ErrAuth and a message that says what is wrong, not with a hang or a
// deadline.
func TestTLSMismatch(t *testing.T) {
	p := newPKI(t)
	srvTLS, cliTLS := loadTLS(t, TLSFiles{Cert: p.nodeCert, Key: p.nodeKey, CA: p.a.File})
	src := newMemSource()
	keys := fill(src, []int{10})
	tlsSrv, tlsAddr := startServer(t, src, &ServerOptions{TLS: srvTLS})
	_, plainAddr := startServer(t, src, nil)
	opts := ClientOptions{RequestTimeout: 5 * time.Second, DialTimeout: 5 * time.Second}

	plain := newClient(t, tlsAddr, &opts)
	opts.TLS = cliTLS
	tlsClient := newClient(t, plainAddr, &opts)
	for _, tc := range []struct {
		name   string
		c      *Client
		remote bool
		says   string
	}{
		{"plain client, TLS server", plain, true, "requires TLS"},
		{"TLS client, plain server", tlsClient, false, "plain TCP"},
	} {
		within(t, 10*time.Second, func() {
			_, err := tc.c.Get(context.Background(), keys)
			switch {
			case !errors.Is(err, ErrAuth) || errors.Is(err, context.DeadlineExceeded):
				t.Errorf("%s: %v, want ErrAuth before the deadline", tc.name, err)
			case errors.Is(err, ErrRemote) != tc.remote:
				t.Errorf("%s: %v: refused by the peer is %v, want %v", tc.name, err, !tc.remote, tc.remote)
			case !strings.Contains(err.Error(), tc.says):
				t.Errorf("%s: %v does not say %q", tc.name, err, tc.says)
			}
		})
	}
	if n := tlsSrv.Stats().Unauthorized; n != 1 {
		t.Fatalf("TLS server counted %d refusals, want 1", n)
	}
}

// A connection that never completes its opening (no TLS handshake, no
// hello) is closed after HandshakeTimeout: it cannot hold a slot.
func TestHandshakeTimeout(t *testing.T) {
	p := newPKI(t)
	srvTLS, _ := loadTLS(t, TLSFiles{Cert: p.nodeCert, Key: p.nodeKey})
	tokens, err := auth.NewTokens("t")
	if err != nil {
		t.Fatal(err)
	}
	for name, opts := range map[string]*ServerOptions{
		"TLS":   {TLS: srvTLS, HandshakeTimeout: 50 * time.Millisecond},
		"token": {Tokens: tokens, HandshakeTimeout: 50 * time.Millisecond},
	} {
		_, addr := startServer(t, newMemSource(), opts)
		nc, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		nc.SetDeadline(time.Now().Add(10 * time.Second))
		if _, err := io.ReadAll(nc); err != nil {
			t.Fatalf("%s: a silent connection was not closed by the server: %v", name, err)
		}
		nc.Close()
	}
}

// Bearer tokens: a good token is served; a wrong or missing one is refused
// before any request, with ErrAuth saying why; rotation (Tokens.Set) refuses
// the old token on new connections.
func TestTokens(t *testing.T) {
	tokens, err := auth.NewTokens("s3cret", "next")
	if err != nil {
		t.Fatal(err)
	}
	src := newMemSource()
	srv, addr := startServer(t, src, &ServerOptions{Tokens: tokens})
	keys := fill(src, []int{10, 20})
	get := func(c *Client) error {
		var err error
		within(t, 10*time.Second, func() {
			var r *Result
			if r, err = c.Get(context.Background(), keys); err == nil {
				checkResult(t, src, keys, r)
				r.Release()
			}
		})
		return err
	}
	old := newClient(t, addr, &ClientOptions{Token: "s3cret", MaxConns: 1})
	if err := get(old); err != nil {
		t.Fatalf("good token: %v", err)
	}
	if err := get(newClient(t, addr, &ClientOptions{Token: "next"})); err != nil {
		t.Fatalf("second token of the set: %v", err)
	}
	for _, tc := range []struct{ token, says string }{
		{"s3cre", "not accepted"},
		{"s3cret ", "not accepted"},
		{"", "sent none"},
	} {
		err := get(newClient(t, addr, &ClientOptions{Token: tc.token}))
		if !errors.Is(err, ErrAuth) || !errors.Is(err, ErrRemote) || !strings.Contains(err.Error(), tc.says) {
			t.Errorf("token %q: %v, want ErrAuth from the peer saying %q", tc.token, err, tc.says)
		}
	}
	// A client that skips the hello is refused too.
	var h header
	b := writeRaw(t, addr, getFrame(3, keys...))
	if h, err = parseHeader(b, &Limits{MaxItems: 1, MaxBatchBytes: 64}); err != nil || h.typ != typeError || h.class != classAuth {
		t.Fatalf("get without a hello: answered %+v (%v), want an authentication error frame", h, err)
	}
	// The server counts a request after answering it.
	testkit.WaitFor(t, "the 2 requests of the good tokens, and no other, to be served", func() bool { return srv.Stats().Requests == 2 })

	if err := tokens.Set("next"); err != nil {
		t.Fatal(err)
	}
	if err := get(newClient(t, addr, &ClientOptions{Token: "s3cret"})); !errors.Is(err, ErrAuth) {
		t.Fatalf("rotated-out token on a new connection: %v, want ErrAuth", err)
	}
	if err := get(old); err != nil {
		t.Fatalf("connection opened before the rotation: %v", err)
	}
}

// Token and TLS together: the token travels inside TLS.
func TestTokenOverTLS(t *testing.T) {
	p := newPKI(t)
	srvTLS, cliTLS := loadTLS(t, TLSFiles{Cert: p.nodeCert, Key: p.nodeKey, CA: p.a.File, ClientAuth: true})
	tokens, err := auth.NewTokens("tok")
	if err != nil {
		t.Fatal(err)
	}
	src := newMemSource()
	keys := fill(src, []int{1 << 20})
	_, ln := startSniffed(t, src, &ServerOptions{TLS: srvTLS, Tokens: tokens})
	addr := ln.Addr().String()
	r, err := newClient(t, addr, &ClientOptions{TLS: cliTLS, Token: "tok"}).Get(context.Background(), keys)
	if err != nil {
		t.Fatal(err)
	}
	checkResult(t, src, keys, r)
	r.Release()
	_, err = newClient(t, addr, &ClientOptions{TLS: cliTLS, Token: "bad"}).Get(context.Background(), keys)
	if !errors.Is(err, ErrAuth) || !errors.Is(err, ErrRemote) {
		t.Fatalf("bad token over TLS: %v, want ErrAuth from the peer", err)
	}
}

func TestLoadTLSErrors(t *testing.T) {
	p := newPKI(t)
	notPEM := filepath.Join(p.dir, "not.pem")
	os.WriteFile(notPEM, []byte("hello"), 0o600)
	for _, tc := range []struct {
		name string
		f    TLSFiles
		says string
	}{
		{"cert without key", TLSFiles{Cert: p.nodeCert}, "both"},
		{"client auth without CA", TLSFiles{Cert: p.nodeCert, Key: p.nodeKey, ClientAuth: true}, "CA file"},
		{"key of another certificate", TLSFiles{Cert: p.nodeCert, Key: p.foreignKey}, p.nodeCert},
		{"missing certificate file", TLSFiles{Cert: filepath.Join(p.dir, "nope.pem"), Key: p.nodeKey}, "nope.pem"},
		{"CA file without PEM", TLSFiles{CA: notPEM}, "not.pem"},
		{"missing CA file", TLSFiles{CA: filepath.Join(p.dir, "ca-nope.pem")}, "ca-nope.pem"},
	} {
		if _, _, err := LoadTLS(tc.f); err == nil || !strings.Contains(err.Error(), tc.says) {
			t.Errorf("%s: %v, want an error naming %q", tc.name, err, tc.says)
		}
	}
	srv, cli := loadTLS(t, TLSFiles{CA: p.a.File})
	if srv != nil || cli == nil || cli.RootCAs == nil || cli.MinVersion != tls.VersionTLS13 {
		t.Fatalf("client-only files: server %v, client %+v", srv, cli)
	}
	srv, _ = loadTLS(t, TLSFiles{Cert: p.nodeCert, Key: p.nodeKey, CA: p.a.File, ClientAuth: true})
	if srv.ClientAuth != tls.RequireAndVerifyClientCert || srv.ClientCAs == nil || srv.MinVersion != tls.VersionTLS13 {
		t.Fatalf("mutual TLS server config: %+v", srv)
	}
}

func TestTLSOptionsValidate(t *testing.T) {
	if _, err := NewServer(newMemSource(), nil, &ServerOptions{TLS: &tls.Config{}}, nil); err == nil || !strings.Contains(err.Error(), "ServerOptions.TLS") {
		t.Errorf("server TLS without a certificate: %v", err)
	}
	if _, err := NewClient("x:1", &ClientOptions{TLS: &tls.Config{MaxVersion: tls.VersionTLS12}}); err == nil || !strings.Contains(err.Error(), "MaxVersion") {
		t.Errorf("client TLS capped at 1.2: %v", err)
	}
	if _, err := NewClient("x:1", &ClientOptions{Token: strings.Repeat("x", MaxTokenLen+1)}); err == nil || !strings.Contains(err.Error(), "Token") {
		t.Errorf("token over MaxTokenLen: %v", err)
	}
}
