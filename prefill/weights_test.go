package prefill

import (
	"errors"
	"fmt"
	"math"
	"strings"
	"testing"
)

func TestConfigDefaults(t *testing.T) {
	c := DefaultConfig()
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	want := Config{Layers: 1, Dim: 768, Heads: 2, KVHeads: 1, HeadDim: 64, FFNDim: 1536, Vocab: 256,
		RopeTheta: 10000, NormEps: 1e-5, MaxContext: 16384, BlockTokens: 64}
	if c != want {
		t.Errorf("DefaultConfig() = %+v, want %+v", c, want)
	}
	if got := c.Namespace(0, "").BlockBytes(); got != 32<<10 {
		t.Errorf("a default block is %d bytes, want 32 KiB", got)
	}
	if got := c.ForwardFLOPs(0, 8192); got > 85e9 {
		t.Errorf("a cold 8k prefill costs %.0f GFLOP; the default is sized for about 80", got/1e9)
	}
	// The sizing argument of DefaultConfig, checked: the 90%-cached floor at
	// 8k tokens is well under 0.15.
	const n = 8192
	floor := c.ForwardFLOPs(n*9/10, n-n*9/10) / c.ForwardFLOPs(0, n)
	if floor > 0.125 {
		t.Errorf("arithmetic floor of 90%%-cached/cold at 8k: %.3f", floor)
	}
}

func TestConfigValidateNamesField(t *testing.T) {
	for field, edit := range map[string]func(*Config){
		"layers":       func(c *Config) { c.Layers = -1 },
		"dim":          func(c *Config) { c.Dim = 1 << 20 },
		"heads":        func(c *Config) { c.Heads = -2 },
		"kv_heads":     func(c *Config) { c.KVHeads = 3 },
		"head_dim":     func(c *Config) { c.HeadDim = 63 },
		"ffn_dim":      func(c *Config) { c.FFNDim = -1 },
		"vocab":        func(c *Config) { c.Vocab = 255 },
		"rope_theta":   func(c *Config) { c.RopeTheta = math.NaN() },
		"norm_eps":     func(c *Config) { c.NormEps = -1 },
		"max_context":  func(c *Config) { c.MaxContext = -5 },
		"block_tokens": func(c *Config) { c.BlockTokens = 1 << 17 },
	} {
		c := DefaultConfig()
		edit(&c)
		err := c.Validate()
		if !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), field+":") {
			t.Errorf("%s: Validate() = %v", field, err)
		}
	}
	var o Options
	o.EnsureDefaults()
	o.Concurrency = -1
	if err := o.Validate(); err == nil || !strings.Contains(err.Error(), "concurrency") {
		t.Errorf("Options.Validate() = %v", err)
	}
	if _, err := NewCPU(CPUOptions{Threads: -1}); err == nil || !strings.Contains(err.Error(), "threads") {
		t.Errorf("NewCPU(-1 threads) = %v", err)
	}
}

// Golden values. They pin the seeded weights and the namespace across
// machines, Go versions and runs: a change here means every cached block of
// the bundled model is invalidated, which must be on purpose.
const (
	goldenTinyDigest    = 0x4aae331231e7278d
	goldenDefaultDigest = 0x6062efd42607b5dc
	goldenDefaultNS     = 0x842662a406af71df // key format 3; Python: int.from_bytes(sha256(encoding)[:8], "little")
)

func TestSeededWeightsGolden(t *testing.T) {
	c := tinyConfig()
	w := SeededWeights(c, 7)
	if got := w.Digest(c); got != goldenTinyDigest {
		t.Errorf("tiny weights digest %#x, golden %#x", got, uint64(goldenTinyDigest))
	}
	if got := SeededWeights(c, 7).Digest(c); got != w.Digest(c) {
		t.Errorf("two generations differ: %#x and %#x", got, w.Digest(c))
	}
	if SeededWeights(c, 8).Digest(c) == w.Digest(c) {
		t.Error("seeds 7 and 8 give the same weights")
	}
	// The generator's first values, spelled out.
	if got := fmt.Sprintf("%.7g %.7g %.7g", w.Embed[0], w.Layers[0].Q[1], w.Norm[2]); got != goldenTinyValues {
		t.Errorf("first values %s, golden %s", got, goldenTinyValues)
	}
	d := DefaultConfig()
	dw := SeededWeights(d, 0)
	if got := dw.Digest(d); got != goldenDefaultDigest {
		t.Errorf("default weights digest %#x, golden %#x", got, uint64(goldenDefaultDigest))
	}
	ns := d.Namespace(dw.Digest(d), "")
	if got := ns.Digest(); got != goldenDefaultNS {
		t.Errorf("default namespace %s digest %#x, golden %#x", ns, got, uint64(goldenDefaultNS))
	}
}

// goldenTinyValues and goldenTinyDigest were also computed by an independent
// Python implementation (SplitMix64 seeded with seed ^ XXH64(name), the
// digest streamed through libxxhash).
const goldenTinyValues = "-0.3849367 0.1959653 1.030266"

func TestWeightsCheck(t *testing.T) {
	c := tinyConfig()
	w := SeededWeights(c, 1)
	w.Layers[1].Down = w.Layers[1].Down[1:]
	if err := w.Check(c); err == nil || !strings.Contains(err.Error(), "model.layers.1.mlp.down_proj.weight") {
		t.Errorf("Check() = %v", err)
	}
	w.Layers = w.Layers[:1]
	if err := w.Check(c); err == nil {
		t.Error("Check() accepts a missing layer")
	}
}
