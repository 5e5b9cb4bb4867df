package node

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/client"
	"github.com/kvmesh/kvmesh/internal/testkit"
	"github.com/kvmesh/kvmesh/prefill"
	"github.com/kvmesh/kvmesh/prefixhash"
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
	for i := range 3 {
		from, to := nodes[i], nodes[(i+1)%3]
		n := 2*b + r.IntN(200)
		tokens := randPrompt(r, n, c.Vocab)
		split := b + r.IntN(n-b)
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		if _, err := from.client.Prefill(ctx, client.PrefillRequest{Tokens: tokens[:split]}); err != nil {
			t.Fatal(err)
		}
		if err := from.Node.prefill.engine.Flush(ctx); err != nil {
			t.Fatal(err)
		}
		cancel()
		seen(to, tokens[:split], split/b*b)
		got := prefillLogits(t, to.client, tokens)
		want, err := cold.Prefill(context.Background(), tokens, "")
		if err != nil {
			t.Fatal(err)
		}
		// The linear layer's state: the last position is computed from the
		// state before it, so the hit stops at the last boundary before it.
		hit := min(split/b, (n-1)/b) * b
		if got.Usage != (client.Usage{PromptTokens: n, CachedTokens: hit}) {
			t.Errorf("case %d (n=%d, split=%d, node %s to %s): usage %+v, want %d cached", i, n, split, from.ID(), to.ID(), got.Usage, hit)
		}
		if e := relErr(got.Logits, want.Logits); e > 1e-4 {
			t.Errorf("case %d (n=%d, split=%d, node %s to %s): logits differ from cold by %.2g", i, n, split, from.ID(), to.ID(), e)
		}
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
