package main

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestOpenAISDK runs test/openai/sdk.mjs, which drives a real kvmesh serve
// with the official openai npm package (pinned in its package-lock.json):
// chat and completion, streamed and not, cached_tokens on a repeated
// prompt, errors as the SDK's APIError classes, a bearer token. It skips
// only where node is not installed, and never under CI.
func TestOpenAISDK(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: the SDK test runs a kvmesh serve and node")
	}
	nodeBin, err := exec.LookPath("node")
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatal("node is not installed, and CI must run the openai SDK test: install Node 20 or later")
		}
		t.Skip("node is not installed: the openai SDK test needs Node 20 or later (and npm ci in test/openai)")
	}
	dir, err := filepath.Abs(filepath.Join("..", "..", "test", "openai"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "node_modules", "openai", "package.json")); err != nil {
		npm, lerr := exec.LookPath("npm")
		if lerr != nil {
			t.Fatalf("test/openai has no node_modules and npm is missing: run npm ci in %s", dir)
		}
		cmd := exec.Command(npm, "ci", "--no-audit", "--no-fund")
		cmd.Dir = dir
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("npm ci in %s: %v\n%s", dir, err, out)
		}
	}
	tokenFile := filepath.Join(t.TempDir(), "tokens")
	if err := os.WriteFile(tokenFile, []byte("sdk-secret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	d := startDaemon(t, t.TempDir(), "--auth-token-file", tokenFile)
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, nodeBin, "sdk.mjs")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "KVMESH_BASE_URL=http://"+d.http+"/v1", "KVMESH_API_KEY=sdk-secret")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("node sdk.mjs: %v\n%s\nkvmesh serve's log:\n%s", err, out, d.stderr)
	}
	if !strings.Contains(string(out), `"ok":true`) {
		t.Fatalf("node sdk.mjs printed no result:\n%s", out)
	}
	t.Logf("openai SDK: %s", strings.TrimSpace(string(out)))
	if err, _ := d.stop(t); err != nil {
		t.Errorf("kvmesh serve: %v\n%s", err, d.stderr)
	}
}
