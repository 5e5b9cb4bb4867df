package node

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/auth"
	"github.com/kvmesh/kvmesh/client"
	"github.com/kvmesh/kvmesh/internal/testkit"
	"github.com/kvmesh/kvmesh/prefill"
	"github.com/kvmesh/kvmesh/prefixhash"
	"github.com/kvmesh/kvmesh/tokenizer"
	"github.com/kvmesh/kvmesh/tokenizer/tokenizertest"
)

// hybridModel is tinyModel as a hybrid: full and sliding-window layers
// interleaved (a 24-token window over 16-token blocks, so hits end inside
// a window) and one gated linear-attention layer, whose state is a group.
func hybridModel() prefill.Config {
	c := tinyModel()
	c.Layers, c.LayerTypes, c.SlidingWindow = 5, "fslfs", 24
	return c
}

// TestPrefillHybridAcrossTheCluster: in a cluster of three real nodes, a
// hybrid model's prefix prefilled on one member resumes on another — its
// full blocks, the window before the hit and the state at it all written
// by the first, read through the cluster — at the hit rule's prefix, with
// the cold logits within 1e-4 relative; through the OpenAI API the third
// member reports the prefix as cached_tokens and generates the cold text.
func TestPrefillHybridAcrossTheCluster(t *testing.T) {
	c := hybridModel()
	b := c.BlockTokens
	// Each group's records are a size class of their own: the DRAM tier
	// needs a slab (16 MiB) for each.
	nodes := startClusterNodes(t, 3, func(_ int, o *Options) {
		o.Prefill.Model = c
		o.Tiers.DRAMBytes = 4 * 17 * MiB
	})
	eng, err := nodes[0].client.Engine(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if gs := eng.Namespace.Groups; gs.Len() != 3 || gs.At(2).Kind != prefixhash.GroupState {
		t.Fatalf("the engine's namespace has groups %v", gs)
	}
	cold, err := prefill.New(nil, prefill.Options{Config: c, Weights: seededWeights(c, 0)})
	if err != nil {
		t.Fatal(err)
	}
	defer cold.Close()
	seen := func(n *clusterNode, tokens []uint32, hit int) {
		t.Helper()
		testkit.WaitFor(t, fmt.Sprintf("node %s to see a %d-token prefix", n.ID(), hit), func() bool {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			l, err := n.client.Lookup(ctx, eng.Namespace, client.Prompt{Tokens: tokens})
			return err == nil && l.CachedTokens == hit
		})
	}
	r := rand.New(rand.NewPCG(61, 62))
	elsewhere := 0 // cases whose state the resuming node did not hold
	for i := range 3 {
		from := nodes[i]
		n := 2*b + r.IntN(200)
		tokens := randPrompt(r, n, c.Vocab)
		split := b + r.IntN(n-b)
		// The linear layer's state: the last position is computed from the
		// state before it, so the hit stops at the last boundary before it.
		hit := min(split/b, (n-1)/b) * b
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		if _, err := from.client.Prefill(ctx, client.PrefillRequest{Tokens: tokens[:split]}); err != nil {
			t.Fatal(err)
		}
		if err := from.Node.prefill.engine.Flush(ctx); err != nil {
			t.Fatal(err)
		}
		cancel()
		for _, m := range nodes {
			seen(m, tokens[:split], split/b*b)
		}
		// Resume on a member that holds neither the prefix's writer's copy
		// nor, when there is one, the state at the hit (its chunk's owner
		// does): the state then comes from another node.
		state := prefixhash.GroupKey(prefixhash.Keys(eng.Namespace, tokens)[hit/b-1], 2)
		to := nodes[(i+1)%3]
		for _, m := range nodes {
			if _, held := m.Node.cache.Info(auth.Access{}, state); m != from && !held {
				to = m
			}
		}
		if _, held := to.Node.cache.Info(auth.Access{}, state); !held {
			elsewhere++
		}
		got := prefillLogits(t, to.client, tokens)
		want, err := cold.Prefill(context.Background(), tokens, "")
		if err != nil {
			t.Fatal(err)
		}
		if got.Usage != (client.Usage{PromptTokens: n, CachedTokens: hit}) {
			t.Errorf("case %d (n=%d, split=%d, node %s to %s): usage %+v, want %d cached", i, n, split, from.ID(), to.ID(), got.Usage, hit)
		}
		if e := relErr(got.Logits, want.Logits); e > 1e-4 {
			t.Errorf("case %d (n=%d, split=%d, node %s to %s): logits differ from cold by %.2g", i, n, split, from.ID(), to.ID(), e)
		}
	}

	t.Logf("%d of 3 cases resumed with the state held by another node", elsewhere)
	if elsewhere == 0 {
		t.Error("every case resumed on a node that held the state itself")
	}

	prompt := longText(r, 300)
	head := prompt[:190]
	req := map[string]any{"model": "kvmesh", "prompt": head, "max_tokens": 8, "temperature": 0}
	parseCompletion(t, callAPI(t, "POST", apiURL(nodes[0].Node, "/v1/completions"), "", req), false)
	if err := nodes[0].Node.prefill.engine.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	hit := len(head) / b * b
	seen(nodes[2], prefill.TokenizeBytes(head), hit)
	req["prompt"] = prompt
	got := parseCompletion(t, callAPI(t, "POST", apiURL(nodes[2].Node, "/v1/completions"), "", req), false)
	if want := coldText(t, c, prompt, prefill.GenerateOptions{MaxTokens: 8}); got.Text != want || got.Cached != hit {
		t.Errorf("the API on another node: %+v, want text %q and %d cached tokens", got, want, hit)
	}
}

// prefillLogits prefills tokens through c and returns the result with its
// logits.
func prefillLogits(t testing.TB, c *client.Client, tokens []uint32) client.PrefillResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	r, err := c.Prefill(ctx, client.PrefillRequest{Tokens: tokens, ReturnLogits: true})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// TestOpenAIModelDirHybrid: a model directory whose config.json declares
// a hybrid layer plan (layer_types) is served: a repeated prompt resumes
// from its groups' records, reports them as cached_tokens and generates
// what a cold engine of those weights does; a layer kind the engine does
// not run is refused by name when the node starts.
func TestOpenAIModelDirHybrid(t *testing.T) {
	cfg := hybridModel()
	cfg.Vocab = tokenizertest.Vocab
	types := map[string]any{"layer_types": []string{"full_attention", "sliding_attention", "linear_attention", "full_attention", "sliding_attention"},
		"sliding_window": cfg.SlidingWindow}
	dir, cfg, w := writeModelDirOf(t, cfg, types)
	pn := startPrefillNode(t, "", nil, func(o *Options) {
		o.Prefill = PrefillOptions{ModelDir: dir, Model: prefill.Config{BlockTokens: 16}}
	}, nil)
	if gs := pn.ns.Groups; gs.Len() != 3 {
		t.Fatalf("the served namespace has groups %v", gs)
	}
	tok, err := tokenizer.Load(filepath.Join(dir, "tokenizer.json"))
	if err != nil {
		t.Fatal(err)
	}
	prompt := strings.Repeat("hello world, ", 12)
	ids := tok.Encode(prompt)
	cold := coldGenerate(t, cfg, w, ids, prefill.GenerateOptions{MaxTokens: 12, Stop: [][]uint32{{266}}})
	want := string([]rune(string(tok.Decode(cold))))
	req := map[string]any{"model": "kvmesh", "prompt": prompt, "max_tokens": 12, "temperature": 0}
	first := parseCompletion(t, callAPI(t, "POST", apiURL(pn.Node, "/v1/completions"), "", req), false)
	if first.Cached != 0 || first.Text != want {
		t.Errorf("completion %+v, want text %q and nothing cached", first, want)
	}
	if err := pn.Node.prefill.engine.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	again := parseCompletion(t, callAPI(t, "POST", apiURL(pn.Node, "/v1/completions"), "", req), false)
	if hit := (len(ids) - 1) / 16 * 16; again.Text != want || again.Cached != hit {
		t.Errorf("repeat %+v, want text %q and %d cached", again, want, hit)
	}

	types["layer_types"] = []string{"full_attention", "sliding_attention", "mamba", "full_attention", "sliding_attention"}
	bad, _, _ := writeModelDirOf(t, cfg, types)
	o := Options{DataDir: t.TempDir(), Listen: ListenOptions{GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0"},
		Logger: slog.New(slog.DiscardHandler), Prefill: PrefillOptions{ModelDir: bad, Model: prefill.Config{BlockTokens: 16}}}
	if n, err := New(o, newFakeCache(1<<20)); err == nil || !strings.Contains(err.Error(), `layer_types[2]: "mamba"`) {
		t.Errorf("a model directory with a mamba layer: %v", err)
		if n != nil {
			n.Close()
		}
	}
}

// coldGenerate is what a cold engine of weights w generates for prompt.
func coldGenerate(t testing.TB, c prefill.Config, w *prefill.Weights, prompt []uint32, o prefill.GenerateOptions) []uint32 {
	t.Helper()
	e, err := prefill.New(nil, prefill.Options{Config: c, Weights: w})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	g, err := e.Generate(context.Background(), prompt, o)
	if err != nil {
		t.Fatal(err)
	}
	return g.Tokens
}
