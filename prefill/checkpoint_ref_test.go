package prefill

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/kvmesh/kvmesh/prefill/prefilltest"
)

// refTolerance bounds the logits' error against the PyTorch reference,
// relative to their largest magnitude: float32 compute against float64, on
// the same 16-bit weights.
const refTolerance = 1e-3

// TestCheckpointsMatchPyTorch: a small random checkpoint of each
// architecture, written by an independent PyTorch implementation (bf16 or
// f16, sharded or not, tied or not, each family's attention features and
// RoPE scaling), loads and computes that implementation's logits at every
// position: decoded one position at a time over the K/V of those before,
// as a whole cold prompt, and over a cached prefix.
func TestCheckpointsMatchPyTorch(t *testing.T) {
	const n = 150
	out := t.TempDir()
	models := prefilltest.Archs(n)
	refs := prefilltest.Suite(t, out, models)
	ctx := context.Background()
	for i, m := range models {
		t.Run(m.Name, func(t *testing.T) {
			dir := filepath.Join(out, m.Name)
			cfg, _, err := LoadConfigJSON(filepath.Join(dir, "config.json"))
			if err != nil {
				t.Fatal(err)
			}
			cfg.BlockTokens = 16
			cache := newMemCache()
			e, err := New(cache, Options{Config: cfg, ModelDir: dir})
			if err != nil {
				t.Fatal(err)
			}
			defer e.Close()
			ref := refs[i]
			worst := 0.0
			defer func() { t.Logf("largest error: %.2g of the logits' scale", worst) }()
			check := func(what string, got []float32, p int) {
				t.Helper()
				err := prefilltest.MaxRelErr(got, ref[p])
				worst = max(worst, err)
				if err > refTolerance {
					t.Errorf("%s: position %d: logits off the reference by %.2g of their scale", what, p, err)
				}
			}
			kv := NewKV(cfg, n)
			logits := make([]float32, cfg.Vocab)
			for p := range n {
				if err := e.model.Forward(ctx, kv, p, m.Prompt[p:p+1], logits); err != nil {
					t.Fatal(err)
				}
				check("decoded", logits, p)
			}
			cold := run(t, e, m.Prompt)
			check("cold", cold.Logits, n-1)
			flush(t, e)
			for _, k := range []int{n, 100, 33} {
				hit := run(t, e, m.Prompt[:k])
				if want := min((k/16)*16, 144); hit.Usage.CachedTokens != want {
					t.Errorf("prefix of %d: %d tokens cached, want %d", k, hit.Usage.CachedTokens, want)
				}
				check("over a cached prefix", hit.Logits, k-1)
				if k == n && relErr(hit.Logits, cold.Logits) > 1e-5 {
					t.Errorf("the prefix hit's logits differ from the cold prefill's by %.2g", relErr(hit.Logits, cold.Logits))
				}
			}
		})
	}
}
