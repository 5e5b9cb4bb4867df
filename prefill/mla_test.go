package prefill

import (
	"math"
	"math/rand/v2"
	"sync"
	"testing"

	"github.com/kvmesh/kvmesh/block"
	"github.com/kvmesh/kvmesh/prefixhash"
)

// tinyMLAConfig is a small DeepSeek-style MLA model: 4 heads of 16 + 8
// rotary, a 32-wide latent (40 cached per token and layer), two layers.
func tinyMLAConfig() Config {
	c := Config{Layers: 2, Dim: 64, Heads: 4, HeadDim: 16, FFNDim: 96, Vocab: 260, MaxContext: 1024, BlockTokens: 16,
		Attention: AttentionMLA, KVLoraRank: 32, RopeDim: 8}
	c.EnsureDefaults()
	return c
}

var tinyMLAWeights = sync.OnceValue(func() *Weights { return SeededWeights(tinyMLAConfig(), 9) })

// refForwardMLA is MLA written out from its definition (mla.go's comment),
// in float64, one position at a time: the latent is computed and cached,
// then every key and value is expanded from it.
func refForwardMLA(c Config, w *Weights, tokens []uint32, at []int) [][]float64 {
	d, hd, rd, r, H := c.Dim, c.HeadDim, c.RopeDim, c.KVLoraRank, c.Heads
	qh := hd + rd
	n := len(tokens)
	matvec := func(m []float32, rows, cols int, x []float64) []float64 {
		y := make([]float64, rows)
		for i := range rows {
			for j := range cols {
				y[i] += float64(m[i*cols+j]) * x[j]
			}
		}
		return y
	}
	norm := func(x []float64, wt []float32) []float64 {
		var ss float64
		for _, v := range x {
			ss += v * v
		}
		inv := 1 / math.Sqrt(ss/float64(len(x))+c.NormEps)
		y := make([]float64, len(x))
		for i, v := range x {
			y[i] = v * inv * float64(wt[i])
		}
		return y
	}
	ropeAt := func(x []float64, pos int) {
		half := rd / 2
		for i := range half {
			ang := float64(pos) / math.Pow(c.RopeTheta, float64(2*i)/float64(rd))
			a, b := x[i], x[i+half]
			x[i] = a*math.Cos(ang) - b*math.Sin(ang)
			x[i+half] = b*math.Cos(ang) + a*math.Sin(ang)
		}
	}
	xs := make([][]float64, n)
	for p, t := range tokens {
		xs[p] = make([]float64, d)
		for j := range d {
			xs[p][j] = float64(w.Embed[int(t)*d+j])
		}
	}
	for _, L := range w.Layers {
		qs, lat := make([][]float64, n), make([][]float64, n)
		for p := range n {
			xn := norm(xs[p], L.AttnNorm)
			qs[p] = matvec(L.Q, H*qh, d, xn)
			for h := range H {
				ropeAt(qs[p][h*qh+hd:(h+1)*qh], p)
			}
			a := matvec(L.KVA, r+rd, d, xn)
			lat[p] = append(norm(a[:r], L.KVANorm), a[r:]...)
			ropeAt(lat[p][r:], p)
		}
		// Every position's keys and values expanded from its cached latent.
		kvs := make([][]float64, n)
		for j := range n {
			kvs[j] = matvec(L.KVB, 2*H*hd, r, lat[j][:r])
		}
		for p := range n {
			att := make([]float64, H*hd)
			for h := range H {
				q := qs[p][h*qh : (h+1)*qh]
				scores := make([]float64, p+1)
				vals := make([][]float64, p+1)
				mx := math.Inf(-1)
				for j := 0; j <= p; j++ {
					kv := kvs[j]
					k := append(append([]float64{}, kv[h*2*hd:h*2*hd+hd]...), lat[j][r:]...)
					vals[j] = kv[h*2*hd+hd : (h+1)*2*hd]
					var s float64
					for i := range qh {
						s += q[i] * k[i]
					}
					scores[j] = s / math.Sqrt(float64(qh))
					mx = max(mx, scores[j])
				}
				var sum float64
				for j := range scores {
					scores[j] = math.Exp(scores[j] - mx)
					sum += scores[j]
				}
				for j := range scores {
					for i := range hd {
						att[h*hd+i] += scores[j] / sum * vals[j][i]
					}
				}
			}
			o := matvec(L.O, d, H*hd, att)
			for j := range d {
				xs[p][j] += o[j]
			}
			xn := norm(xs[p], L.MLPNorm)
			gate := matvec(L.Gate, c.FFNDim, d, xn)
			up := matvec(L.Up, c.FFNDim, d, xn)
			for i := range gate {
				gate[i] = gate[i] / (1 + math.Exp(-gate[i])) * up[i]
			}
			down := matvec(L.Down, d, c.FFNDim, gate)
			for j := range d {
				xs[p][j] += down[j]
			}
		}
	}
	out := make([][]float64, len(at))
	for i, p := range at {
		out[i] = matvec(w.LMHead, c.Vocab, d, norm(xs[p], w.Norm))
	}
	return out
}

func loadTinyMLA(t testing.TB, threads int) (Config, Model) {
	t.Helper()
	c := tinyMLAConfig()
	cpu, err := NewCPU(CPUOptions{Threads: threads})
	if err != nil {
		t.Fatal(err)
	}
	m, err := cpu.Load(c, tinyMLAWeights())
	if err != nil {
		t.Fatal(err)
	}
	return c, m
}

// TestMLAForwardMatchesReference checks the CPU backend's MLA against the
// float64 reference, across the attention tile boundary (256 rows).
func TestMLAForwardMatchesReference(t *testing.T) {
	c, m := loadTinyMLA(t, 2)
	tokens := randTokens(newRand(21), 260, c.Vocab)
	lengths := []int{1, 2, 17, 255, 256, 257, 260}
	at := make([]int, len(lengths))
	for i, n := range lengths {
		at[i] = n - 1
	}
	ref := refForwardMLA(c, tinyMLAWeights(), tokens, at)
	for i, n := range lengths {
		got := forward(t, m, c, NewKV(c, n), 0, tokens[:n])
		if e := relErr(got, ref[i]); e > 1e-4 {
			t.Errorf("n=%d: MLA logits differ from the reference by %.2g (relative)", n, e)
		}
	}
}

// TestMLASplitEqualsCold: a suffix computed over cached latents gives the
// cold logits, and the latents do not depend on how the sequence was cut.
func TestMLASplitEqualsCold(t *testing.T) {
	for _, threads := range []int{1, 3} {
		c, m := loadTinyMLA(t, threads)
		r := rand.New(rand.NewPCG(23, uint64(threads)))
		for range 5 {
			n := 2 + r.IntN(300)
			tokens := randTokens(r, n, c.Vocab)
			coldKV := NewKV(c, n)
			cold := forward(t, m, c, coldKV, 0, tokens)
			split := 1 + r.IntN(n-1)
			kv := NewKV(c, n)
			forward(t, m, c, kv, 0, tokens[:split])
			warm := forward(t, m, c, kv, split, tokens[split:])
			if e := relErr(warm, cold); e > 1e-4 {
				t.Errorf("threads=%d n=%d split=%d: warm logits differ from cold by %.2g", threads, n, split, e)
			}
			for l := range c.Layers {
				if e := relErr(kv.Latent(l)[:n*c.CacheDim()], coldKV.Latent(l)[:n*c.CacheDim()]); e > 1e-5 {
					t.Errorf("threads=%d n=%d split=%d: layer %d latents differ by %.2g", threads, n, split, l, e)
				}
			}
		}
	}
}

// TestMLANamespace: the MLA model caches the latent layout, one vector of
// KVLoraRank+RopeDim per token and layer, and shares no key with the GQA
// model.
func TestMLANamespace(t *testing.T) {
	c := tinyMLAConfig()
	ns := c.Namespace(tinyMLAWeights().Digest(c), "")
	if err := ns.Validate(); err != nil {
		t.Fatal(err)
	}
	if ns.Layout != prefixhash.LatentKV || ns.LatentDim != 40 || ns.BlockBytes() != 2*16*40*4 {
		t.Errorf("namespace %s: layout %s, latent %d, %d bytes a block", ns, ns.Layout, ns.LatentDim, ns.BlockBytes())
	}
	if g := tinyConfig(); g.Namespace(0, "").Root() == ns.Root() {
		t.Error("MLA and GQA namespaces share a root")
	}
	bad := c
	bad.RopeDim = 7
	if err := bad.Validate(); err == nil {
		t.Error("an odd rope_dim is accepted")
	}
	gqa := tinyConfig()
	gqa.KVLoraRank = 8
	if err := gqa.Validate(); err == nil {
		t.Error("kv_lora_rank on a GQA model is accepted")
	}
}

// TestMLAPrefixHitEqualsCold is TestPrefixHitEqualsCold for the MLA model:
// the blocks it publishes are latent-layout blocks (one latent per token
// and layer), and a request that loads them computes the cold logits.
func TestMLAPrefixHitEqualsCold(t *testing.T) {
	mla := func(o *Options) { o.Config, o.Weights = tinyMLAConfig(), tinyMLAWeights() }
	cold := newTinyEngine(t, nil, mla)
	if ns := cold.Namespace(); ns.Layout != prefixhash.LatentKV {
		t.Fatalf("MLA engine namespace %s is not latent", ns)
	}
	r := rand.New(rand.NewPCG(31, 32))
	c := tinyMLAConfig()
	for i := range 6 {
		cache := newMemCache()
		e := newTinyEngine(t, cache, mla)
		n := 2 + r.IntN(400)
		tokens := randTokens(r, n, c.Vocab)
		split := 1 + r.IntN(n-1)
		run(t, e, tokens[:split])
		flush(t, e)
		if got, want := cache.len(), split/c.BlockTokens; got != want {
			t.Fatalf("case %d: %d blocks published for a %d-token prompt, want %d", i, got, split, want)
		}
		for _, b := range cache.blocks {
			if len(b) != encodedBlockLen(e) {
				t.Fatalf("case %d: a published block is %d bytes, a latent block %d", i, len(b), encodedBlockLen(e))
			}
		}
		warm := run(t, e, tokens)
		want := run(t, cold, tokens)
		if got, want := warm.Usage, (Usage{PromptTokens: n, CachedTokens: split / c.BlockTokens * c.BlockTokens}); got != want {
			t.Errorf("case %d (n=%d, split=%d): usage %+v, want %+v", i, n, split, got, want)
		}
		if e := relErr(warm.Logits, want.Logits); e > 1e-4 {
			t.Errorf("case %d (n=%d, split=%d): warm logits differ from cold by %.2g", i, n, split, e)
		}
	}
}

// encodedBlockLen is the encoded size of one of e's blocks.
func encodedBlockLen(e *Engine) int {
	ns := e.Namespace()
	return block.NamespaceHeaderLen(ns) + ns.BlockBytes()
}
