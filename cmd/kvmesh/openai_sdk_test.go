package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// TestOpenAISDK runs test/openai/sdk.mjs, which drives a real kvmesh serve
// with the official openai npm package (pinned in its package-lock.json):
// chat and completion, streamed and not, cached_tokens on a repeated
// prompt, errors as the SDK's APIError classes, a bearer token. It skips
// only where node is not installed, and never under CI.
func TestOpenAISDK(t *testing.T) {
	nodeBin, dir := sdkSetup(t)
	tokenFile := writeTokenFile(t)
	// A node with tokens needs a gossip key (or mutual TLS, or --insecure-gossip).
	d := startDaemon(t, t.TempDir(), "--auth-token-file", tokenFile, "--gossip-key-file", writeGossipKey(t))
	runSDK(t, nodeBin, dir, "http://"+d.http+"/v1", d)
	if _, err := d.stop(t); err != nil {
		t.Errorf("kvmesh serve: %v\n%s", err, d.stderr)
	}
}

// TestOpenAISDKThroughRouter runs the same script against a real kvmesh
// route in front of three kvmesh serve processes (repeats land on any node
// and still report cached tokens), then kills a node with SIGKILL: requests
// sent after it died all succeed on the others.
func TestOpenAISDKThroughRouter(t *testing.T) {
	nodeBin, dir := sdkSetup(t)
	tokenFile := writeTokenFile(t)
	key := writeGossipKey(t)
	flags := []string{"--auth-token-file", tokenFile, "--gossip-key-file", key, "--gossip-profile", "local", "--peer-backoff", "500ms", "--get-timeout", "2s"}
	a := startDaemon(t, t.TempDir(), flags...)
	b := startDaemon(t, t.TempDir(), append(flags, "--join", a.gossip)...)
	c := startDaemon(t, t.TempDir(), append(flags, "--join", a.gossip)...)
	router := startRouteProcess(t, "--join", a.gossip, "--gossip-profile", "local", "--gossip-key-file", key)
	waitUntilHTTP(t, "http://"+router+"/healthz", "ok 3 nodes", a, b, c)
	runSDK(t, nodeBin, dir, "http://"+router+"/v1", a, b, c)

	c.cmd.Process.Kill() // kill -9: no leave; the router learns it by failing
	<-c.exited
	for i := range 6 {
		body := fmt.Sprintf(`{"model": "kvmesh", "prompt": "after the crash %d", "max_tokens": 2}`, i)
		req, _ := http.NewRequest("POST", "http://"+router+"/v1/completions", strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer sdk-secret")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatalf("request %d after a node died: %v", i, err)
		}
		out, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Errorf("request %d after a node died: %d %s", i, resp.StatusCode, out)
		}
	}
}

// sdkSetup returns node's path and test/openai with its packages
// installed (npm ci when they are not), or skips where node is missing
// outside CI.
func sdkSetup(t *testing.T) (nodeBin, dir string) {
	t.Helper()
	if testing.Short() {
		t.Skip("-short: the SDK test runs kvmesh processes and node")
	}
	nodeBin, err := exec.LookPath("node")
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatal("node is not installed, and CI must run the openai SDK test: install Node 20 or later")
		}
		t.Skip("node is not installed: the openai SDK test needs Node 20 or later (and npm ci in test/openai)")
	}
	dir, err = filepath.Abs(filepath.Join("..", "..", "test", "openai"))
	if err != nil {
		t.Fatal(err)
	}
	installOnce.Do(func() {
		if _, err := os.Stat(filepath.Join(dir, "node_modules", "openai", "package.json")); err == nil {
			return
		}
		npm, err := exec.LookPath("npm")
		if err != nil {
			installErr = fmt.Errorf("test/openai has no node_modules and npm is missing: run npm ci in %s", dir)
			return
		}
		cmd := exec.Command(npm, "ci", "--no-audit", "--no-fund")
		cmd.Dir = dir
		if out, err := cmd.CombinedOutput(); err != nil {
			installErr = fmt.Errorf("npm ci in %s: %v\n%s", dir, err, out)
		}
	})
	if installErr != nil {
		t.Fatal(installErr)
	}
	return nodeBin, dir
}

var (
	installOnce sync.Once
	installErr  error
)

func writeTokenFile(t *testing.T) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "tokens")
	if err := os.WriteFile(path, []byte("sdk-secret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// runSDK runs sdk.mjs against baseURL with the token sdk-secret.
func runSDK(t *testing.T, nodeBin, dir, baseURL string, logs ...*daemon) {
	t.Helper()
	runScript(t, nodeBin, dir, "sdk.mjs", []string{"KVMESH_BASE_URL=" + baseURL, "KVMESH_API_KEY=sdk-secret"}, logs...)
}

// runScript runs a script of test/openai with env added to the test's;
// it must print a JSON line with "ok":true.
func runScript(t *testing.T, nodeBin, dir, script string, env []string, logs ...*daemon) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, nodeBin, script)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		var b strings.Builder
		for _, d := range logs {
			fmt.Fprintf(&b, "--- %s:\n%s\n", d.id, d.stderr)
		}
		t.Fatalf("node %s: %v\n%s\nkvmesh logs:\n%s", script, err, out, b.String())
	}
	if !strings.Contains(string(out), `"ok":true`) {
		t.Fatalf("node %s printed no result:\n%s", script, out)
	}
	t.Logf("openai SDK (%s): %s", script, strings.TrimSpace(string(out)))
}

// startRouteProcess runs kvmesh route on a free port and returns the
// address it serves on; the test's cleanup stops it.
func startRouteProcess(t *testing.T, args ...string) string {
	t.Helper()
	cmd := exec.Command(binary(t), append([]string{"route", "--http-addr", "127.0.0.1:0"}, args...)...)
	cmd.Env = append(os.Environ(), "KVMESH_CONFIG=")
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	stderr := &lockedBuffer{}
	cmd.Stderr = stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() {
		cmd.Wait()
		close(exited)
	}()
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(20 * time.Second):
			cmd.Process.Kill()
			<-exited
			t.Errorf("kvmesh route still ran 20s after SIGTERM:\n%s", stderr)
		}
	})
	addr := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if f := strings.Fields(sc.Text()); len(f) >= 2 && f[0] == "openai" {
				addr <- strings.TrimSuffix(strings.TrimPrefix(f[1], "http://"), "/v1")
			}
		}
	}()
	select {
	case a := <-addr:
		return a
	case <-exited:
		t.Fatalf("kvmesh route exited:\n%s", stderr)
	case <-time.After(60 * time.Second):
		t.Fatalf("kvmesh route did not say where it serves within 60s:\n%s", stderr)
	}
	return ""
}

// waitUntilHTTP waits until GET url answers 200 with want in its body.
func waitUntilHTTP(t *testing.T, url, want string, logs ...*daemon) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	var last string
	for time.Now().Before(deadline) {
		if resp, err := http.Get(url); err == nil {
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			last = fmt.Sprintf("%d %s", resp.StatusCode, b)
			if resp.StatusCode == http.StatusOK && strings.Contains(string(b), want) {
				return
			}
		} else {
			last = err.Error()
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("%s did not answer %q within 60s (last: %s)", url, want, last)
}

// writeGossipKey writes a gossip key file (32 bytes, base64) and returns its
// path.
func writeGossipKey(t testing.TB) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "gossip.key")
	if err := os.WriteFile(path, []byte("MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY=\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}
