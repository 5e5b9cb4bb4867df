package main

import (
	"bytes"
	"context"
	"encoding/json"
	"math"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/client"
	"github.com/kvmesh/kvmesh/internal/testkit"
	"github.com/kvmesh/kvmesh/prefill"
)

// kvmesh runs the built binary and returns its stdout; it fails the test
// when the command fails.
func kvmesh(t *testing.T, args ...string) []byte {
	t.Helper()
	cmd := exec.Command(binary(t), args...)
	cmd.Env = append(cmd.Environ(), "KVMESH_CONFIG=")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("kvmesh %s: %v\n%s", strings.Join(args, " "), err, stderr.String())
	}
	return stdout.Bytes()
}

// prefillShape checks the JSON kvmesh prefill -o json prints, as a script
// reads it, and returns its usage.
func prefillShape(t *testing.T, out []byte, promptTokens int) (cached int, top []uint32) {
	t.Helper()
	var v struct {
		Usage *struct {
			PromptTokens *int `json:"prompt_tokens"`
			CachedTokens *int `json:"cached_tokens"`
		} `json:"usage"`
		TTFTMs    *float64 `json:"ttft_ms"`
		TopTokens []uint32 `json:"top_tokens"`
		State     string   `json:"state"`
	}
	if err := json.Unmarshal(out, &v); err != nil {
		t.Fatalf("prefill -o json printed %q: %v", out, err)
	}
	if v.Usage == nil || v.Usage.PromptTokens == nil || v.Usage.CachedTokens == nil || v.TTFTMs == nil || len(v.TopTokens) != 5 {
		t.Fatalf("prefill -o json printed %s; want usage.prompt_tokens, usage.cached_tokens, ttft_ms and 5 top_tokens", out)
	}
	if *v.Usage.PromptTokens != promptTokens || *v.TTFTMs <= 0 || v.State != "done" {
		t.Fatalf("prefill -o json printed %s for a %d-token prompt", out, promptTokens)
	}
	return *v.Usage.CachedTokens, v.TopTokens
}

// TestPrefillCLI drives kvmesh prefill and inspect against a running node
// as a user would: the JSON shape, a repeated prompt mostly cached, a queued
// request waited for and fetched by id, cached tokens per namespace, and the
// engine's namespace as inspect lookup's default. Then a second node
// process joins the first; a prefix prefilled on the first is a hit on the
// second, which answers the whole prompt with the cold logits.
func TestPrefillCLI(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the kvmesh binary")
	}
	d1 := startDaemon(t, t.TempDir())
	addr := []string{"--addr", d1.grpcAddr}
	text := strings.Repeat("The quick brown fox jumps over the lazy dog. ", 3) // 135 bytes: 2 blocks of 64 and 7
	n := len(text)
	cached, top := prefillShape(t, kvmesh(t, append([]string{"prefill", "--text", text, "--session", "cli", "-o", "json"}, addr...)...), n)
	if cached != 0 {
		t.Errorf("first prefill: %d cached tokens on an empty node", cached)
	}
	c1, err := client.Dial(d1.grpcAddr, client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer c1.Close()
	ctx := context.Background()
	eng, err := c1.Engine(ctx)
	if err != nil {
		t.Fatal(err)
	}
	tokens := prefill.TokenizeBytes(text)
	testkit.WaitFor(t, "the first prefill's blocks are published", func() bool {
		l, err := c1.Lookup(ctx, eng.Namespace, client.Prompt{Tokens: tokens})
		return err == nil && l.CachedTokens == 128
	})
	cached, top2 := prefillShape(t, kvmesh(t, append([]string{"prefill", "--text", text, "-o", "json"}, addr...)...), n)
	if cached != 128 || top2[0] != top[0] {
		t.Errorf("repeated prefill: %d cached tokens, top %v (first %v); want 128 and the same answer", cached, top2, top)
	}

	// Queued, waited for.
	cached, _ = prefillShape(t, kvmesh(t, append([]string{"prefill", "--text", text + "?", "--queue", "--wait", "-o", "json"}, addr...)...), n+1)
	if cached != 128 {
		t.Errorf("queued prefill: %d cached tokens, want 128", cached)
	}
	// Queued, fetched by id.
	var queued struct {
		RequestID string `json:"request_id"`
		State     string `json:"state"`
	}
	out := kvmesh(t, append([]string{"prefill", "--text", text + "!", "--queue", "-o", "json"}, addr...)...)
	if err := json.Unmarshal(out, &queued); err != nil || queued.RequestID == "" || (queued.State != "queued" && queued.State != "running" && queued.State != "done") {
		t.Fatalf("prefill --queue -o json printed %s (%v)", out, err)
	}
	prefillShape(t, kvmesh(t, append([]string{"prefill", "result", queued.RequestID, "--wait", "-o", "json"}, addr...)...), n+1)

	// Stats: cached tokens per namespace, with the engine's model named.
	var stats statsJSON
	if err := json.Unmarshal(kvmesh(t, append([]string{"inspect", "stats", "-o", "json"}, addr...)...), &stats); err != nil {
		t.Fatal(err)
	}
	found := false
	for _, ns := range stats.Namespaces {
		if ns.Model == eng.Namespace.Model && ns.Tokens >= 128 {
			found = true
		}
	}
	if !found {
		t.Errorf("inspect stats namespaces %+v lack the engine's model %s with its cached tokens", stats.Namespaces, eng.Namespace.Model)
	}
	if table := string(kvmesh(t, append([]string{"inspect", "stats"}, addr...)...)); !strings.Contains(table, eng.Namespace.Model) {
		t.Errorf("inspect stats does not name the engine's model:\n%s", table)
	}
	// Lookup defaults to the engine's namespace; --model names another.
	var l lookupJSON
	if err := json.Unmarshal(kvmesh(t, append([]string{"inspect", "lookup", "--text", text, "-o", "json"}, addr...)...), &l); err != nil {
		t.Fatal(err)
	}
	if l.CachedTokens != 128 || !strings.HasPrefix(l.Namespace, eng.Namespace.Model) {
		t.Errorf("inspect lookup of the prompt: %+v; want the engine's namespace and 128 cached tokens", l)
	}
	if err := json.Unmarshal(kvmesh(t, append([]string{"inspect", "lookup", "--text", text, "--model", "kvmesh/demo", "-o", "json"}, addr...)...), &l); err != nil {
		t.Fatal(err)
	}
	if l.CachedTokens != 0 || !strings.HasPrefix(l.Namespace, "kvmesh/demo/") {
		t.Errorf("inspect lookup --model kvmesh/demo: %+v", l)
	}

	// A second node process, joined to the first, hits a prefix the first
	// one computed: through the cluster, not through its own tiers.
	d2 := startDaemon(t, t.TempDir(), "--join", d1.gossip)
	c2, err := client.Dial(d2.grpcAddr, client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	waitMembers(t, c2, 2, d1, d2)
	prompt := prefill.TokenizeBytes(strings.Repeat("Pack my box with five dozen liquor jugs. ", 4)) // 164 tokens
	prefix := prompt[:150]
	if _, err := c1.Prefill(ctx, client.PrefillRequest{Tokens: prefix}); err != nil {
		t.Fatal(err)
	}
	testkit.WaitFor(t, "the second node sees the prefix the first computed", func() bool {
		l, err := c2.Lookup(ctx, eng.Namespace, client.Prompt{Tokens: prefix})
		return err == nil && l.CachedTokens == 128
	})
	got, err := c2.Prefill(ctx, client.PrefillRequest{Tokens: prompt, ReturnLogits: true})
	if err != nil {
		t.Fatal(err)
	}
	if got.Usage != (client.Usage{PromptTokens: len(prompt), CachedTokens: 128}) {
		t.Errorf("second node: usage %+v; want 128 of %d tokens from the blocks the first node computed", got.Usage, len(prompt))
	}
	cold, err := prefill.New(nil, prefill.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer cold.Close()
	want, err := cold.Prefill(ctx, prompt, "")
	if err != nil {
		t.Fatal(err)
	}
	var diff, scale float64
	for i := range want.Logits {
		diff = max(diff, math.Abs(float64(got.Logits[i]-want.Logits[i])))
		scale = max(scale, math.Abs(float64(want.Logits[i])))
	}
	if diff/scale > 1e-4 {
		t.Errorf("second node's logits with the first node's prefix differ from cold by %.2g", diff/scale)
	}
	for _, d := range []*daemon{d1, d2} {
		if _, exitErr := d.stop(t); exitErr != nil {
			t.Errorf("stop: %v\n%s", exitErr, d.stderr)
		}
	}
}

func TestServePrefillFlags(t *testing.T) {
	o, err := serveOptions(t, map[string]string{"KVMESH_PREFILL_SEED": "7"},
		"--prefill-queue", "8", "--prefill-result-ttl", "10m", "--prefill-max-context", "4096", "--prefill-concurrency", "2")
	if err != nil {
		t.Fatal(err)
	}
	p := o.Prefill
	if p.Disabled || p.Seed != 7 || p.QueueSize != 8 || p.ResultTTL != 10*time.Minute || p.Model.MaxContext != 4096 ||
		p.Concurrency != 2 || p.Model.Dim != prefill.DefaultDim || p.MaxResults != 4096 {
		t.Errorf("prefill options %+v", p)
	}
	if o, err := serveOptions(t, nil, "--prefill=false"); err != nil || !o.Prefill.Disabled {
		t.Errorf("--prefill=false: %+v, %v", o.Prefill, err)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--prefill-queue", "-1"}, "--prefill-queue (or KVMESH_PREFILL_QUEUE)"},
		{[]string{"--prefill-result-ttl", "10ms"}, "--prefill-result-ttl"},
		{[]string{"--prefill-max-context", "-5"}, "--prefill-max-context"},
	} {
		if _, err := serveOptions(t, nil, tc.args...); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("serve %v: %v; want an error naming %s", tc.args, err, tc.want)
		}
	}
}

func TestPrefillRunErrors(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"prefill"}, "--text T or as --tokens"},
		{[]string{"prefill", "--text", "hi", "--wait"}, "add --queue"},
		{[]string{"prefill", "--tokens", "1,x"}, "not a token id"},
		{[]string{"prefill", "--text", "hi", "--addr", "127.0.0.1:1", "--timeout", "3s"}, "no kvmesh node answers at 127.0.0.1:1"},
		{[]string{"prefill", "result"}, "accepts 1 arg"},
	} {
		var stdout, stderr bytes.Buffer
		code := run(tc.args, &stdout, &stderr)
		lines := strings.Split(strings.TrimSpace(stderr.String()), "\n")
		if code != 1 || len(lines) != 1 || !strings.Contains(lines[0], tc.want) {
			t.Errorf("kvmesh %v: exit %d, stderr %q; want exit 1 and one line with %q", tc.args, code, stderr.String(), tc.want)
		}
	}
}
