package prefill

import (
	"context"
	"errors"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/kvmesh/kvmesh/prefixhash"
)

// hybridConfig is tinyConfig with full and sliding layers interleaved and
// one gated linear-attention layer; the window (24 tokens) is not a whole
// number of blocks (16 tokens), so hits end inside a window.
func hybridConfig() Config {
	c := tinyConfig()
	c.Layers = 5
	c.LayerTypes = "fslfs"
	c.SlidingWindow = 24
	return c
}

func loadHybrid(t testing.TB, threads int) (Config, *Weights, Model) {
	t.Helper()
	c := hybridConfig()
	w := SeededWeights(c, 11)
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

// refHybrid is the reference of a hybrid model: refForward's decoder, in
// float64, one position at a time, with each layer of its kind: causal
// attention, attention over the window, or gated linear attention written
// out from its definition (hybrid.go).
func refHybrid(c Config, w *Weights, tokens []uint32, at []int) [][]float64 {
	d := c.Dim
	n := len(tokens)
	xs := make([][]float64, n)
	for p, t := range tokens {
		xs[p] = make([]float64, d)
		for j := range d {
			xs[p][j] = float64(w.Embed[int(t)*d+j])
		}
	}
	for li, L := range w.Layers {
		xn := make([][]float64, n)
		for p := range n {
			xn[p] = refNorm(xs[p], L.AttnNorm, c.NormEps)
		}
		var att [][]float64
		if c.layerType(li) == LayerLinear {
			att = refLinear(c, L, xn)
		} else {
			att = refAttention(c, L, xn, c.window(li))
		}
		for p := range n {
			o := refMatvec(L.O, d, c.QDim(), att[p])
			for j := range d {
				xs[p][j] += o[j]
			}
			h := refNorm(xs[p], L.MLPNorm, c.NormEps)
			gate := refMatvec(L.Gate, c.FFNDim, d, h)
			up := refMatvec(L.Up, c.FFNDim, d, h)
			for i := range gate {
				gate[i] = gate[i] / (1 + math.Exp(-gate[i])) * up[i]
			}
			down := refMatvec(L.Down, d, c.FFNDim, gate)
			for j := range d {
				xs[p][j] += down[j]
			}
		}
	}
	out := make([][]float64, len(at))
	for i, p := range at {
		out[i] = refMatvec(w.LMHead, c.Vocab, d, refNorm(xs[p], w.Norm, c.NormEps))
	}
	return out
}

func refMatvec(m []float32, rows, cols int, x []float64) []float64 {
	y := make([]float64, rows)
	for i := range rows {
		for j := range cols {
			y[i] += float64(m[i*cols+j]) * x[j]
		}
	}
	return y
}

func refNorm(x []float64, wt []float32, eps float64) []float64 {
	var ss float64
	for _, v := range x {
		ss += v * v
	}
	inv := 1 / math.Sqrt(ss/float64(len(x))+eps)
	y := make([]float64, len(x))
	for i, v := range x {
		y[i] = v * inv * float64(wt[i])
	}
	return y
}

// refAttention is causal attention of every position (RoPE'd queries and
// keys) over the positions up to it, the last win of them when win > 0.
func refAttention(c Config, L LayerWeights, xn [][]float64, win int) [][]float64 {
	hd, g, n := c.HeadDim, c.Heads/c.KVHeads, len(xn)
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
	qs, ks, vs := make([][]float64, n), make([][]float64, n), make([][]float64, n)
	for p := range n {
		qs[p] = refMatvec(L.Q, c.QDim(), c.Dim, xn[p])
		ks[p] = refMatvec(L.K, c.KVDim(), c.Dim, xn[p])
		vs[p] = refMatvec(L.V, c.KVDim(), c.Dim, xn[p])
		ropeAt(qs[p], c.Heads, p)
		ropeAt(ks[p], c.KVHeads, p)
	}
	out := make([][]float64, n)
	for p := range n {
		first := 0
		if win > 0 {
			first = max(0, p-win+1)
		}
		out[p] = make([]float64, c.QDim())
		for h := range c.Heads {
			kvh := h / g
			scores := make([]float64, p+1-first)
			mx := math.Inf(-1)
			for j := first; j <= p; j++ {
				var s float64
				for i := range hd {
					s += qs[p][h*hd+i] * ks[j][kvh*hd+i]
				}
				scores[j-first] = s / math.Sqrt(float64(hd))
				mx = max(mx, scores[j-first])
			}
			var sum float64
			for j := range scores {
				scores[j] = math.Exp(scores[j] - mx)
				sum += scores[j]
			}
			for j, sc := range scores {
				for i := range hd {
					out[p][h*hd+i] += sc / sum * vs[first+j][kvh*hd+i]
				}
			}
		}
	}
	return out
}

// refLinear is gated linear attention: per KV head, S = g·S + k̂⊗v and
// o = q̂ᵀS for each of its query heads, g = σ(x̂·w + 3).
func refLinear(c Config, L LayerWeights, xn [][]float64) [][]float64 {
	hd, g := c.HeadDim, c.Heads/c.KVHeads
	unit := func(v []float64) {
		var ss float64
		for _, x := range v {
			ss += x * x
		}
		if ss > 0 {
			for i := range v {
				v[i] /= math.Sqrt(ss)
			}
		}
	}
	S := make([][]float64, c.KVHeads) // [kv_head][k·hd+v]
	for j := range S {
		S[j] = make([]float64, hd*hd)
	}
	out := make([][]float64, len(xn))
	for p, x := range xn {
		q := refMatvec(L.Q, c.QDim(), c.Dim, x)
		k := refMatvec(L.K, c.KVDim(), c.Dim, x)
		v := refMatvec(L.V, c.KVDim(), c.Dim, x)
		z := refMatvec(L.LinGate, c.KVHeads, c.Dim, x)
		out[p] = make([]float64, c.QDim())
		for j := range c.KVHeads {
			kj := k[j*hd : (j+1)*hd]
			unit(kj)
			gt := 1 / (1 + math.Exp(-z[j]-linGateBias))
			for a := range hd {
				for b := range hd {
					S[j][a*hd+b] = gt*S[j][a*hd+b] + kj[a]*v[j*hd+b]
				}
			}
			for r := range g {
				h := j*g + r
				qh := q[h*hd : (h+1)*hd]
				unit(qh)
				for b := range hd {
					for a := range hd {
						out[p][h*hd+b] += qh[a] * S[j][a*hd+b]
					}
				}
			}
		}
	}
	return out
}

func TestHybridMatchesReference(t *testing.T) {
	c, w, m := loadHybrid(t, 2)
	tokens := randTokens(newRand(21), 300, c.Vocab)
	matchesRef(t, m, c, tokens, []int{1, 2, 16, 24, 25, 47, 128, 129, 257, 300}, func(at []int) [][]float64 {
		return refHybrid(c, w, tokens, at)
	})
}

// matchesRef checks m's cold logits of the first n tokens, for each n of
// lengths, against ref's logits at the positions at (n−1 for each).
func matchesRef(t *testing.T, m Model, c Config, tokens []uint32, lengths []int, ref func(at []int) [][]float64) {
	t.Helper()
	at := make([]int, len(lengths))
	for i, n := range lengths {
		at[i] = n - 1
	}
	want := ref(at)
	for i, n := range lengths {
		got := forward(t, m, c, NewKV(c, n), 0, tokens[:n])
		if e := relErr(got, want[i]); e > 1e-4 {
			t.Errorf("n=%d: logits differ from the reference by %.2g (relative)", n, e)
		}
	}
}

// TestHybridSplitEqualsCold: a suffix computed over the K/V and state a
// first pass left gives the cold logits, for any split, and for any way of
// cutting the prompt (the state is carried from pass to pass).
func TestHybridSplitEqualsCold(t *testing.T) {
	for _, threads := range []int{1, 3} {
		c, _, m := loadHybrid(t, threads)
		r := rand.New(rand.NewPCG(23, uint64(threads)))
		for range 10 {
			n := 2 + r.IntN(300)
			tokens := randTokens(r, n, c.Vocab)
			cold := forward(t, m, c, NewKV(c, n), 0, tokens)
			kv := NewKV(c, n)
			a := 1 + r.IntN(n-1)
			b := a + r.IntN(n-a)
			forward(t, m, c, kv, 0, tokens[:a])
			if b > a {
				forward(t, m, c, kv, a, tokens[a:b])
			}
			warm := forward(t, m, c, kv, b, tokens[b:])
			if e := relErr(warm, cold); e > 1e-4 {
				t.Errorf("threads=%d n=%d cuts %d,%d: warm logits differ from cold by %.2g", threads, n, a, b, e)
			}
		}
	}
}

// resumeKV returns a KV holding only what a reader resuming at block p
// fetches of the prompt src computed, through record payloads: the full
// layers' K/V of blocks [0,p), the sliding layers' of the window's blocks,
// the state after block p−1. Everything else is filled with junk.
func resumeKV(t *testing.T, c Config, src *KV, p int) *KV {
	t.Helper()
	ns := c.Namespace(1, "")
	b := c.BlockTokens
	kv := NewKV(c, src.Cap())
	for i := range kv.data {
		kv.data[i] = 1e4 * float32(i%7-3)
	}
	for g, gr := range ns.Groups.All() {
		payload := make([]byte, ns.GroupBytes(g))
		switch gr.Kind {
		case prefixhash.GroupState:
			if p > 0 {
				putFloats(payload, src.lin.snap(p-1))
				kv.lin.setState(payload, p*b)
			}
		default:
			first := 0
			if gr.Kind == prefixhash.GroupSliding {
				first = max(0, p-gr.WindowBlocks(b))
			}
			for i := first; i < p; i++ {
				src.writeLayers(payload, gr.Layers, i*b, b)
				kv.readLayers(gr.Layers, i*b, b, payload)
			}
		}
	}
	return kv
}

// TestHybridResumeFromRecords is the engine's promise at the model level:
// resuming at any block from the records a reader fetches (every full
// block, the window's blocks, one state) gives the cold logits, and the
// states a pass records at block ends are those of a cold pass however
// the prompt was cut.
func TestHybridResumeFromRecords(t *testing.T) {
	c, _, m := loadHybrid(t, 2)
	r := rand.New(rand.NewPCG(29, 30))
	b := c.BlockTokens
	for range 8 {
		n := b + 1 + r.IntN(280)
		tokens := randTokens(r, n, c.Vocab)
		src := NewKV(c, n)
		cold := forward(t, m, c, src, 0, tokens)
		for _, p := range []int{1, min(2, (n-1)/b), (n - 1) / b, 1 + r.IntN((n-1)/b)} {
			kv := resumeKV(t, c, src, p)
			warm := forward(t, m, c, kv, p*b, tokens[p*b:])
			if e := relErr(warm, cold); e > 1e-4 {
				t.Errorf("n=%d resumed at block %d: logits differ from cold by %.2g", n, p, e)
			}
		}
		cut := NewKV(c, n)
		at := 1 + r.IntN(n-1)
		forward(t, m, c, cut, 0, tokens[:at])
		forward(t, m, c, cut, at, tokens[at:])
		for i := range n / b {
			if e := relErr(cut.lin.snap(i), src.lin.snap(i)); e > 1e-5 {
				t.Errorf("n=%d cut at %d: the state after block %d differs by %.2g", n, at, i, e)
			}
		}
	}
}

// TestHybridForwardState: a pass from a position the state is not at is
// refused, and a cancelled pass leaves the state as it was, so that it can
// be run again.
func TestHybridForwardState(t *testing.T) {
	c, _, m := loadHybrid(t, 2)
	tokens := randTokens(newRand(31), 100, c.Vocab)
	cold := forward(t, m, c, NewKV(c, 100), 0, tokens)
	kv := NewKV(c, 100)
	forward(t, m, c, kv, 0, tokens[:40])
	logits := make([]float32, c.Vocab)
	if err := m.Forward(context.Background(), kv, 50, tokens[50:], logits); err == nil || !strings.Contains(err.Error(), "recurrent state") {
		t.Errorf("forward from 50 with the state at 40: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := m.Forward(ctx, kv, 40, tokens[40:], logits); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled: %v", err)
	}
	if e := relErr(forward(t, m, c, kv, 40, tokens[40:]), cold); e > 1e-4 {
		t.Errorf("after a cancelled pass: logits differ from cold by %.2g", e)
	}
}

func TestHybridConfig(t *testing.T) {
	c := hybridConfig()
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	ns := c.Namespace(7, "")
	if err := ns.Validate(); err != nil {
		t.Fatalf("namespace: %v", err)
	}
	gs := ns.Groups.All()
	if len(gs) != 3 || gs[0].Kind != prefixhash.GroupFull || gs[1].Kind != prefixhash.GroupSliding || gs[2].Kind != prefixhash.GroupState {
		t.Fatalf("groups %v", ns.Groups)
	}
	if !slices.Equal(gs[0].Layers, []int{0, 3}) || !slices.Equal(gs[1].Layers, []int{1, 4}) || !slices.Equal(gs[2].Layers, []int{2}) ||
		gs[1].Window != 24 || gs[2].StateBytes != 4*16*16 || gs[2].KVHeads != 2 {
		t.Errorf("groups %v", ns.Groups)
	}
	plain := tinyConfig()
	if plain.Namespace(7, "").Groups.Len() != 0 || plain.Namespace(7, "") == ns {
		t.Error("a plain model's namespace has groups, or is the hybrid's")
	}
	for _, tc := range []struct {
		edit func(*Config)
		want string
	}{
		{func(c *Config) { c.LayerTypes = "fsl" }, "layer_types"},
		{func(c *Config) { c.LayerTypes = "fsxfs" }, "layer_types"},
		{func(c *Config) { c.LayerTypes = "sslss" }, "no full-attention layer"},
		{func(c *Config) { c.LayerTypes, c.SlidingWindow = "fffff", 0 }, "leave layer_types empty"},
		{func(c *Config) { c.SlidingWindow = 0 }, "sliding_window"},
		{func(c *Config) { c.LayerTypes = "fllfl" }, "sliding_window"},
		{func(c *Config) { c.Attention, c.KVLoraRank, c.RopeDim, c.SlidingWindow = AttentionMLA, 8, 4, 0 }, ""},
	} {
		c := hybridConfig()
		tc.edit(&c)
		err := c.Validate()
		if !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: %v, want one naming %q", c, err, tc.want)
		}
	}
	lin := hybridConfig()
	lin.LayerTypes, lin.SlidingWindow = "flfll", 0
	if err := lin.Validate(); err != nil {
		t.Errorf("full and linear layers only: %v", err)
	} else if g := lin.Namespace(1, "").Groups; g.Len() != 2 || g.At(1).Kind != prefixhash.GroupState {
		t.Errorf("full and linear layers only: groups %v", g)
	}
}
