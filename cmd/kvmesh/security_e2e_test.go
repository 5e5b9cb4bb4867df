package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/client"
	"github.com/kvmesh/kvmesh/transfer"
	"github.com/kvmesh/kvmesh/transfer/certtest"
)

// TestServeTLS runs kvmesh serve with mutual TLS and bearer tokens as an
// operator would, and talks to it with the CLI and the Go client: each
// missing piece (TLS, a client certificate, a token, the right token) is
// refused with one line that says what to pass; with all of them the node
// serves, over gRPC and the data plane. SIGHUP re-reads the token file.
func TestServeTLS(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the kvmesh binary")
	}
	dir := t.TempDir()
	ca := certtest.NewCA(t, dir, "kvmesh")
	cert, key := ca.Issue(t, dir, "node", "127.0.0.1")
	ccert, ckey := ca.Issue(t, dir, "worker", "worker")
	tokens := filepath.Join(dir, "tokens")
	wrong := filepath.Join(dir, "wrong")
	for path, content := range map[string]string{tokens: "old-token\n", wrong: "guess\n"} {
		if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	d := startDaemon(t, t.TempDir(), "--tls-cert", cert, "--tls-key", key, "--tls-ca", ca.File, "--tls-client-auth",
		"--auth-token-file", tokens, "--gossip-key-file", writeGossipKey(t), "--dram", "32MiB", "--max-block-bytes", "1MiB")

	inspect := func(env []string, args ...string) (string, error) {
		cmd := exec.Command(binary(t), append([]string{"inspect", "--addr", d.grpcAddr, "--timeout", "5s"}, args...)...)
		cmd.Env = append(os.Environ(), env...)
		out, err := cmd.CombinedOutput()
		return strings.TrimSpace(string(out)), err
	}
	all := []string{"--tls-ca", ca.File, "--tls-cert", ccert, "--tls-key", ckey}
	for _, tc := range []struct {
		name string
		args []string
		says string
	}{
		{"plain", nil, "if it is a node's gRPC port with TLS, pass --tls-ca"},
		{"no client certificate", []string{"--tls-ca", ca.File}, "--tls-cert/--tls-key"},
		{"no token", all, "asks for a bearer token: pass --auth-token-file"},
		{"wrong token", append(all, "--auth-token-file", wrong), "refused the token of " + wrong},
	} {
		out, err := inspect(nil, append(tc.args, "stats")...)
		if err == nil || strings.Count(out, "\n") > 0 || !strings.Contains(out, tc.says) {
			t.Errorf("%s: kvmesh inspect stats: %v, %q; want a failure of one line saying %q", tc.name, err, out, tc.says)
		}
	}
	// Everything from the environment.
	env := []string{"KVMESH_TLS_CA=" + ca.File, "KVMESH_TLS_CERT=" + ccert, "KVMESH_TLS_KEY=" + ckey, "KVMESH_AUTH_TOKEN_FILE=" + tokens}
	if out, err := inspect(env, "stats"); err != nil || !strings.Contains(out, "hit ratio") {
		t.Fatalf("kvmesh inspect stats with TLS and the token: %v\n%s", err, out)
	}

	// The Go client, both planes: gRPC and the data plane (shared memory
	// on this host, TCP over TLS), with the token.
	_, ctls, err := transfer.LoadTLS(transfer.TLSFiles{CA: ca.File, Cert: ccert, Key: ckey})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for _, transport := range []string{client.TransportAuto, client.TransportTCP} {
		c, err := client.Dial(d.grpcAddr, client.Options{TLS: ctls, Token: "old-token", Transport: transport})
		if err != nil {
			t.Fatal(err)
		}
		toks, payloads := e2ePrompt(7, 4)
		if _, err := c.Put(ctx, e2eNS, client.Prompt{Tokens: toks}, payloads); err != nil {
			t.Fatalf("%s: Put: %v", transport, err)
		}
		got, err := c.Get(ctx, e2eNS, client.Prompt{Tokens: toks})
		if err != nil || len(got) != len(payloads) || !bytes.Equal(got[3].Payload, payloads[3]) {
			t.Fatalf("%s: Get = %d blocks, %v", transport, len(got), err)
		}
		c.Close()
	}
	out, err := inspect(env, "quotas", "-o", "json")
	var q quotasJSON
	if err != nil || json.Unmarshal([]byte(out), &q) != nil || len(q.Namespaces) != 1 || q.Namespaces[0].Blocks != 4 {
		t.Fatalf("kvmesh inspect quotas -o json: %v\n%s", err, out)
	}

	// Rotation: a new token file, SIGHUP; the old token is refused from
	// then on and the new one accepted, without a restart.
	if err := os.WriteFile(tokens, []byte("new-token\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := d.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		_, errOld := inspect(append(env[:3:3], "KVMESH_AUTH_TOKEN_FILE="+wrong), "stats")
		if strings.Contains(d.stderr.String(), "tokens reloaded") && errOld != nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no reload 20s after SIGHUP:\n%s", d.stderr)
		}
		time.Sleep(50 * time.Millisecond)
	}
	old := filepath.Join(dir, "old")
	os.WriteFile(old, []byte("old-token\n"), 0o600)
	if out, err := inspect(append(env[:3:3], "KVMESH_AUTH_TOKEN_FILE="+old), "stats"); err == nil || !strings.Contains(out, "refused the token") {
		t.Errorf("the rotated-out token after SIGHUP: %v, %q", err, out)
	}
	if out, err := inspect(env, "stats"); err != nil {
		t.Errorf("the new token after SIGHUP: %v, %q", err, out)
	}

	// Refusals are counted; a plain TLS client of a TLS node is too.
	conn, err := tls.Dial("tcp", d.grpcAddr, &tls.Config{InsecureSkipVerify: true, NextProtos: []string{"h2"}})
	if err == nil {
		conn.Close()
	}
	body := scrapeMetrics(t, d.http, ctls)
	for _, want := range []string{`kvmesh_grpc_refused_requests_total{reason="no_token"}`, `kvmesh_grpc_refused_requests_total{reason="bad_token"}`,
		"kvmesh_grpc_tls_handshake_failures_total"} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
	if _, err := d.stop(t); err != nil {
		t.Fatalf("exit %v\n%s", err, d.stderr)
	}
}

// scrapeMetrics returns the /metrics text served at httpAddr.
func scrapeMetrics(t *testing.T, httpAddr string, tlsCfg ...*tls.Config) string {
	t.Helper()
	get, url := http.Get, "http://"+httpAddr+"/metrics"
	if len(tlsCfg) > 0 { // a node with TLS serves its HTTP address over TLS
		get, url = (&http.Client{Transport: &http.Transport{TLSClientConfig: tlsCfg[0]}}).Get, "https://"+httpAddr+"/metrics"
	}
	resp, err := get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
