package main

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/kvmesh/kvmesh/internal/testkit"
)

// TestServeTenants runs kvmesh serve with a tokens file as an operator
// would and drives it with the CLI: a tenant's second prefill of a prompt
// hits its first, another tenant's does not and sees none of its
// namespaces; a read-only token cannot prefill; a bad file is refused at
// start with one line; SIGHUP reloads the file (a new token works, and a
// broken file leaves the old set in force).
func TestServeTenants(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the kvmesh binary")
	}
	dir := t.TempDir()
	write := func(name, content string) string {
		t.Helper()
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	const file = `secret: "an example secret of more than 32 characters"
tokens:
  - {token: acme-rw, tenant: acme, scopes: [read, write]}
  - {token: acme-r, tenant: acme, scopes: [read]}
  - {token: beta-rw, tenant: beta, scopes: [read, write]}
  - {token: node, scopes: [cluster, read, write, admin]}
`
	tokensFile := write("tokens.yaml", file)
	gossipKey := write("gossip.key", "MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY=\n")
	for name, tok := range map[string]string{"acme-rw": "acme-rw", "acme-r": "acme-r", "beta-rw": "beta-rw", "acme-new": "acme-new"} {
		write(name, tok+"\n")
	}

	// A broken tokens file stops the start with one line.
	bad := write("bad.yaml", "tokens:\n  - {token: x, tenant: t, scopes: [read]}\n")
	out, err := exec.Command(binary(t), "serve", "--data-dir", t.TempDir(), "--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0",
		"--data-addr", "127.0.0.1:0", "--gossip-addr", "127.0.0.1:0", "--tokens-file", bad).CombinedOutput()
	if err == nil || !strings.Contains(string(out), "--tokens-file") {
		t.Fatalf("serve with a broken tokens file: %v\n%s", err, out)
	}

	d := startDaemon(t, t.TempDir(), "--tokens-file", tokensFile, "--gossip-key-file", gossipKey, "--dram", "64MiB")
	prefill := func(token string) (usage struct{ PromptTokens, CachedTokens int }, err error) {
		t.Helper()
		cmd := exec.Command(binary(t), "prefill", "--addr", d.grpcAddr, "--auth-token-file", filepath.Join(dir, token),
			"--text", strings.Repeat("The tenants never meet. ", 4), "-o", "json")
		out, err := cmd.CombinedOutput()
		if err != nil {
			return usage, &cmdError{err, string(out)}
		}
		var res struct {
			Usage struct {
				PromptTokens int `json:"prompt_tokens"`
				CachedTokens int `json:"cached_tokens"`
			} `json:"usage"`
		}
		if err := json.Unmarshal(out, &res); err != nil {
			t.Fatalf("prefill -o json: %v\n%s", err, out)
		}
		usage.PromptTokens, usage.CachedTokens = res.Usage.PromptTokens, res.Usage.CachedTokens
		return usage, nil
	}
	first, err := prefill("acme-rw")
	if err != nil || first.CachedTokens != 0 {
		t.Fatalf("acme's first prefill: %+v, %v", first, err)
	}
	// The engine publishes asynchronously: wait for acme's second to hit.
	testkit.WaitFor(t, "acme's second prefill to hit its first", func() bool {
		u, err := prefill("acme-rw")
		return err == nil && u.CachedTokens > 0
	})
	if u, err := prefill("beta-rw"); err != nil || u.CachedTokens != 0 {
		t.Errorf("beta's prefill of acme's prompt: %+v, %v; want nothing cached", u, err)
	}
	if _, err := prefill("acme-r"); err == nil || !strings.Contains(err.Error(), "write scope") {
		t.Errorf("a read-only token's prefill: %v, want a refusal naming the write scope", err)
	}
	stats := func(token string) (string, error) {
		out, err := exec.Command(binary(t), "inspect", "--addr", d.grpcAddr, "--auth-token-file", filepath.Join(dir, token), "stats").CombinedOutput()
		return string(out), err
	}
	if out, err := stats("beta-rw"); err != nil || strings.Contains(out, "NAMESPACE") && strings.Count(strings.SplitN(out, "NAMESPACE", 2)[1], "\n") > 2 {
		t.Errorf("beta's stats show namespaces (beta stored one, acme's must not show):\n%s %v", out, err)
	}

	// Reload: a new token for acme works after SIGHUP; a broken file then
	// leaves the set as it was.
	if _, err := stats("acme-new"); err == nil {
		t.Fatal("a token not in the file was accepted")
	}
	write("tokens.yaml", file+"  - {token: acme-new, tenant: acme, scopes: [read]}\n")
	if err := d.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	testkit.WaitFor(t, "the new token to be accepted", func() bool {
		_, err := stats("acme-new")
		return err == nil
	})
	write("tokens.yaml", "not: [a tokens file")
	if err := d.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	testkit.WaitFor(t, "the broken reload to be logged", func() bool {
		return strings.Contains(d.stderr.String(), "tokens not reloaded")
	})
	if _, err := stats("acme-new"); err != nil {
		t.Errorf("a broken reload dropped the tokens in force: %v", err)
	}
}

type cmdError struct {
	err error
	out string
}

func (e *cmdError) Error() string { return e.err.Error() + ": " + e.out }
