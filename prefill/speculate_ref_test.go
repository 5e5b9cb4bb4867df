package prefill

import (
	"context"
	"math"
	"path/filepath"
	"slices"
	"testing"

	"github.com/kvmesh/kvmesh/prefill/prefilltest"
)

// TestSpeculationMatchesPyTorch: on a small random checkpoint of each
// architecture, written by the independent PyTorch implementation, greedy
// decoding with prompt lookup and with a draft model generates the tokens
// that implementation's greedy choice makes: every generated token is the
// argmax of its float64 logits over the sequence before it, except where
// its two best logits are closer than float32 compute can tell apart.
func TestSpeculationMatchesPyTorch(t *testing.T) {
	const n, gen = 60, 24
	models := prefilltest.Archs(n)
	for i := range models {
		models[i].Prompt = repetitive(uint64(20+i), n, 512)
	}
	out := t.TempDir()
	prefilltest.Suite(t, out, models) // writes the checkpoints
	ctx := context.Background()
	answers := make([][]uint32, len(models))
	proposed := map[string]int{}
	for i, m := range models {
		dir := filepath.Join(out, m.Name)
		cfg, _, err := LoadConfigJSON(filepath.Join(dir, "config.json"))
		if err != nil {
			t.Fatal(err)
		}
		cfg.BlockTokens = 16
		draft := cfg
		draft.Layers = 1
		for _, spec := range []SpeculativeOptions{
			{Method: SpeculateNgram, Tokens: 3},
			{Method: SpeculateDraft, Tokens: 5, Draft: &Options{Config: draft, Weights: SeededWeights(draft, 5)}},
		} {
			e, err := New(newMemCache(), Options{Config: cfg, ModelDir: dir, Speculative: spec})
			if err != nil {
				t.Fatal(err)
			}
			g, err := e.Generate(ctx, m.Prompt, GenerateOptions{MaxTokens: gen})
			e.Close()
			if err != nil {
				t.Fatal(err)
			}
			proposed[spec.Method] += g.Proposed
			if answers[i] == nil {
				answers[i] = g.Tokens
			} else if !slices.Equal(g.Tokens, answers[i]) {
				t.Errorf("%s: %s generated %v, %s %v", m.Name, spec.Method, g.Tokens, SpeculateNgram, answers[i])
			}
		}
		// The reference's logits of the whole sequence but its last token.
		models[i].Prompt = slices.Concat(m.Prompt, answers[i][:gen-1])
	}
	if proposed[SpeculateNgram] == 0 || proposed[SpeculateDraft] == 0 {
		t.Errorf("proposed %v: each proposer must guess", proposed)
	}
	refs := prefilltest.Suite(t, t.TempDir(), models)
	for i, m := range models {
		ties := 0
		for j, tok := range answers[i] {
			row := refs[i][n-1+j]
			best, second, scale := 0, -1, 0.0
			for v, x := range row {
				scale = max(scale, math.Abs(x))
				if x > row[best] {
					best, second = v, best
				} else if v != best && (second < 0 || x > row[second]) {
					second = v
				}
			}
			if row[best]-row[second] < refTolerance*scale {
				ties++
				continue
			}
			if int(tok) != best {
				t.Errorf("%s: generated token %d is %d, the reference's greedy choice %d", m.Name, j, tok, best)
				break // the sequences part here
			}
		}
		if ties > gen/4 {
			t.Errorf("%s: %d of %d tokens were near ties: nothing was checked", m.Name, ties, gen)
		}
	}
}
