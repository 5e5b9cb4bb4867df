package bench

import (
	"testing"

	"github.com/kvmesh/kvmesh/prefill"
)

// TestSpeculateSuite: on a small model the suite measures both proposers
// against plain decoding on both workloads (its greedy rows checking, as it
// runs, that the tokens equal plain decoding's), reports acceptance where
// guesses were made, and checks prompt lookup against its targets.
func TestSpeculateSuite(t *testing.T) {
	cfg := prefill.Config{Layers: 2, Dim: 64, Heads: 2, KVHeads: 1, HeadDim: 32, FFNDim: 128, Vocab: 256, MaxContext: 512}
	s := &SpeculateSuite{Options: SpeculateOptions{Config: cfg, PromptTokens: 48, DecodeTokens: 24, Runs: 2}}
	res := runSuite(t, s, &Env{}, "speculate")
	rows := table[speculateRow](t, res, "speculate")
	if len(rows) != 6 {
		t.Fatalf("%d rows, want 2 workloads × 3 proposers: %+v", len(rows), rows)
	}
	for _, r := range rows {
		if r.DecodeTokS <= 0 || r.PlainTokS <= 0 || r.Runs != 2 || r.TokensPerPass < 1 {
			t.Errorf("row %+v", r)
		}
		if r.Proposer == prefill.SpeculateOff && (r.K != 0 || r.Acceptance != 0 || r.TokensPerPass != 1) {
			t.Errorf("plain decoding's row %+v", r)
		}
		if r.Proposer == prefill.SpeculateDraft && (r.K != 4 || r.Acceptance <= 0 || r.Acceptance > 1) {
			t.Errorf("the draft's row %+v: it proposes at every step", r)
		}
	}
	for _, figure := range []string{"speedup", "cpu_speedup"} {
		if c := check(t, res, figure); c.Value <= 0 {
			t.Errorf("check %+v", c)
		}
	}
}
