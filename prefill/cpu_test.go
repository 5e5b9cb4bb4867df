package prefill

import (
	"context"
	"math"
	"math/rand/v2"
	"testing"
)

// tinyConfig is small enough for -race and has every feature on: several
// layers, grouped-query attention (2 query heads per KV head), and prompts
// that cross attention tile boundaries (128 query tokens, 256 keys per tile).
func tinyConfig() Config {
	c := Config{Layers: 2, Dim: 64, Heads: 4, KVHeads: 2, HeadDim: 16, FFNDim: 96, Vocab: 260,
		MaxContext: 1024, BlockTokens: 16, RopeTheta: 10000}
	c.EnsureDefaults()
	return c
}

func newRand(seed uint64) *rand.Rand { return rand.New(rand.NewPCG(seed, seed)) }

func randTokens(r *rand.Rand, n, vocab int) []uint32 {
	t := make([]uint32, n)
	for i := range t {
		t[i] = uint32(r.IntN(vocab))
	}
	return t
}

// refForward is the reference model: the decoder written out directly from
// its definition, in float64, one position at a time, no tiling, no
// stacking. It returns the logits of every position p in at: by causality,
// those are the last-position logits of the prompt tokens[:p+1].
func refForward(c Config, w *Weights, tokens []uint32, at []int) [][]float64 {
	d, hd, g := c.Dim, c.HeadDim, c.Heads/c.KVHeads
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
	ropeAt := func(v []float64, heads, pos int) {
		half := hd / 2
		for h := range heads {
			x := v[h*hd : (h+1)*hd]
			for i := range half {
				ang := float64(pos) / math.Pow(c.RopeTheta, float64(2*i)/float64(hd))
				a, b := x[i], x[i+half]
				x[i] = a*math.Cos(ang) - b*math.Sin(ang)
				x[i+half] = b*math.Cos(ang) + a*math.Sin(ang)
			}
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
		qs, ks, vs := make([][]float64, n), make([][]float64, n), make([][]float64, n)
		for p := range n {
			xn := norm(xs[p], L.AttnNorm)
			qs[p] = matvec(L.Q, c.QDim(), d, xn)
			ks[p] = matvec(L.K, c.KVDim(), d, xn)
			vs[p] = matvec(L.V, c.KVDim(), d, xn)
			ropeAt(qs[p], c.Heads, p)
			ropeAt(ks[p], c.KVHeads, p)
		}
		for p := range n {
			att := make([]float64, c.QDim())
			for h := range c.Heads {
				kvh := h / g
				q := qs[p][h*hd : (h+1)*hd]
				scores := make([]float64, p+1)
				mx := math.Inf(-1)
				for j := 0; j <= p; j++ {
					var s float64
					for i := range hd {
						s += q[i] * ks[j][kvh*hd+i]
					}
					scores[j] = s / math.Sqrt(float64(hd))
					mx = max(mx, scores[j])
				}
				var sum float64
				for j := range scores {
					scores[j] = math.Exp(scores[j] - mx)
					sum += scores[j]
				}
				for j := range scores {
					for i := range hd {
						att[h*hd+i] += scores[j] / sum * vs[j][kvh*hd+i]
					}
				}
			}
			o := matvec(L.O, d, c.QDim(), att)
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

// relErr returns max|a−b| / max|b|: the error relative to the logits' scale
// (element-wise relative error is meaningless for logits near zero).
func relErr[T float32 | float64](a []float32, b []T) float64 {
	var diff, scale float64
	for i := range b {
		diff = max(diff, math.Abs(float64(a[i])-float64(b[i])))
		scale = max(scale, math.Abs(float64(b[i])))
	}
	return diff / scale
}

func loadTiny(t testing.TB, threads int) (Config, *Weights, Model) {
	t.Helper()
	c := tinyConfig()
	w := SeededWeights(c, 7)
	cpu, err := NewCPU(CPUOptions{Threads: threads})
	if err != nil {
		t.Fatal(err)
	}
	m, err := cpu.Load(c, w)
	if err != nil {
		t.Fatal(err)
	}
	return c, w, m
}

func forward(t testing.TB, m Model, c Config, kv *KV, start int, tokens []uint32) []float32 {
	t.Helper()
	logits := make([]float32, c.Vocab)
	if err := m.Forward(context.Background(), kv, start, tokens, logits); err != nil {
		t.Fatal(err)
	}
	return logits
}

// TestForwardMatchesReference checks the tiled, stacked, float32 CPU model
// against the reference at lengths around every tile boundary.
func TestForwardMatchesReference(t *testing.T) {
	c, w, m := loadTiny(t, 2)
	tokens := randTokens(newRand(1), 300, c.Vocab)
	matchesRef(t, m, c, tokens, []int{1, 2, 15, 16, 127, 128, 129, 255, 256, 257, 300}, func(at []int) [][]float64 {
		return refForward(c, w, tokens, at)
	})
}

// TestForwardSplitEqualsCold is the engine's core promise at the model
// level: computing a suffix over cached K/V gives the cold logits, for any
// split point, not only block boundaries.
func TestForwardSplitEqualsCold(t *testing.T) {
	for _, threads := range []int{1, 3} {
		c, _, m := loadTiny(t, threads)
		r := rand.New(rand.NewPCG(3, uint64(threads)))
		for range 12 {
			n := 1 + r.IntN(400)
			tokens := randTokens(r, n, c.Vocab)
			cold := forward(t, m, c, NewKV(c, n), 0, tokens)
			split := r.IntN(n) // the suffix is never empty
			kv := NewKV(c, n)
			if split > 0 {
				forward(t, m, c, kv, 0, tokens[:split])
			}
			warm := forward(t, m, c, kv, split, tokens[split:])
			if e := relErr(warm, cold); e > 1e-4 {
				t.Errorf("threads=%d n=%d split=%d: warm logits differ from cold by %.2g", threads, n, split, e)
			}
		}
	}
}

// TestForwardKVIsChunkingInvariant checks that the K/V a prefill leaves
// behind do not depend on how the sequence was cut: those are the bytes
// that get cached and served to other requests.
func TestForwardKVIsChunkingInvariant(t *testing.T) {
	c, _, m := loadTiny(t, 2)
	r := rand.New(rand.NewPCG(5, 6))
	n := 200
	tokens := randTokens(r, n, c.Vocab)
	cold := NewKV(c, n)
	forward(t, m, c, cold, 0, tokens)
	warm := NewKV(c, n)
	forward(t, m, c, warm, 0, tokens[:77])
	forward(t, m, c, warm, 77, tokens[77:150])
	forward(t, m, c, warm, 150, tokens[150:])
	for l := range c.Layers {
		if e := relErr(warm.K(l)[:n*c.KVDim()], cold.K(l)[:n*c.KVDim()]); e > 1e-5 {
			t.Errorf("layer %d K differs by %.2g", l, e)
		}
		if e := relErr(warm.V(l)[:n*c.KVDim()], cold.V(l)[:n*c.KVDim()]); e > 1e-5 {
			t.Errorf("layer %d V differs by %.2g", l, e)
		}
	}
}

func TestForwardRejectsMisuse(t *testing.T) {
	c, _, m := loadTiny(t, 1)
	logits := make([]float32, c.Vocab)
	ctx := context.Background()
	for name, f := range map[string]func() error{
		"no tokens":      func() error { return m.Forward(ctx, NewKV(c, 4), 0, nil, logits) },
		"kv too small":   func() error { return m.Forward(ctx, NewKV(c, 4), 2, []uint32{1, 2, 3}, logits) },
		"beyond context": func() error { return m.Forward(ctx, NewKV(c, 1025), 1024, []uint32{1}, logits) },
		"bad token":      func() error { return m.Forward(ctx, NewKV(c, 4), 0, []uint32{1, 260}, logits) },
		"short logits":   func() error { return m.Forward(ctx, NewKV(c, 4), 0, []uint32{1}, logits[:3]) },
	} {
		if err := f(); err == nil {
			t.Errorf("%s: Forward returned nil", name)
		}
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if err := m.Forward(cctx, NewKV(c, 4), 0, []uint32{1}, logits); err != context.Canceled {
		t.Errorf("cancelled context: got %v", err)
	}
}

func TestExpf(t *testing.T) {
	var worst float64
	for x := -87.0; x <= 88; x += 0.001 {
		got := float64(expf(float32(x)))
		want := math.Exp(float64(float32(x)))
		worst = max(worst, math.Abs(got-want)/want)
	}
	if worst > 4e-7 {
		t.Errorf("expf: worst relative error %.2g, want ≤ 4e-7", worst)
	}
	for x, want := range map[float32]float32{-1000: 0, float32(math.Inf(-1)): 0, 0: 1} {
		if got := expf(x); got != want {
			t.Errorf("expf(%v) = %v, want %v", x, got, want)
		}
	}
	if got := expf(89); !math.IsInf(float64(got), 1) {
		t.Errorf("expf(89) = %v, want +Inf", got)
	}
	if got := expf(float32(math.NaN())); got == got {
		t.Errorf("expf(NaN) = %v", got)
	}
}

func TestTopK(t *testing.T) {
	for _, tc := range []struct {
		v    []float32
		k    int
		want []uint32
	}{
		{[]float32{1, 5, 3, 5, 2, 9}, 3, []uint32{5, 1, 3}},
		{[]float32{0, 0, 0, 0}, 2, []uint32{0, 1}},
		{[]float32{4, 3}, 5, []uint32{0, 1}},
		{[]float32{-1, -2, 7, -3, 6, 6, 8}, 5, []uint32{6, 2, 4, 5, 0}},
	} {
		got := topK(tc.v, tc.k)
		if len(got) != len(tc.want) {
			t.Errorf("topK(%v, %d) = %v, want %v", tc.v, tc.k, got, tc.want)
			continue
		}
		for i := range got {
			if got[i] != tc.want[i] {
				t.Errorf("topK(%v, %d) = %v, want %v", tc.v, tc.k, got, tc.want)
				break
			}
		}
	}
}
