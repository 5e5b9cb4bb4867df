package main

import (
	"os"
	"path/filepath"
	"testing"
)

// writeTenantTokens writes a tokens file with two tenants, acme (token
// "acme") and beta (token "beta"), and a node-wide token "node"; it
// returns its path.
func writeTenantTokens(t *testing.T) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "tokens.yaml")
	const file = `secret: "a tenant secret of more than thirty-two characters"
tokens:
  - {token: acme, tenant: acme, scopes: [read, write]}
  - {token: beta, tenant: beta, scopes: [read, write]}
  - {token: node, scopes: [cluster, read, write, admin]}
`
	if err := os.WriteFile(path, []byte(file), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestOpenAISDKQueue runs test/openai/queue.mjs, which drives the
// asynchronous API (/v1/queue) with the official openai package's generic
// post/get/delete helpers, against a real kvmesh serve and then through a
// real kvmesh route in front of two nodes: submit, poll, completion equal
// to the synchronous answers, cancel, another tenant's id 404, bad inputs
// as OpenAI error objects.
func TestOpenAISDKQueue(t *testing.T) {
	nodeBin, dir := sdkSetup(t)
	tokens := writeTenantTokens(t)
	key := writeGossipKey(t)
	flags := []string{"--tokens-file", tokens, "--gossip-key-file", key, "--gossip-profile", "local", "--peer-backoff", "500ms", "--get-timeout", "2s"}
	env := func(base string) []string {
		return []string{"KVMESH_BASE_URL=" + base, "KVMESH_API_KEY=acme", "KVMESH_OTHER_API_KEY=beta"}
	}
	a := startDaemon(t, t.TempDir(), flags...)
	runScript(t, nodeBin, dir, "queue.mjs", env("http://"+a.http+"/v1"), a)

	b := startDaemon(t, t.TempDir(), append(flags, "--join", a.gossip)...)
	router := startRouteProcess(t, "--join", a.gossip, "--gossip-profile", "local", "--gossip-key-file", key)
	waitUntilHTTP(t, "http://"+router+"/healthz", "ok 2 nodes", a, b)
	runScript(t, nodeBin, dir, "queue.mjs", env("http://"+router+"/v1"), a, b)
}
