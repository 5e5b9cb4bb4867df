package prefill

import (
	"context"
	"fmt"
	"math"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"

	"gonum.org/v1/gonum/blas"
	"gonum.org/v1/gonum/blas/gonum"
)

// CPUOptions configure the CPU backend.
type CPUOptions struct {
	// Threads is the number of goroutines one forward pass runs attention
	// tiles and element-wise work on. gonum's Sgemm spreads the large matrix
	// products over GOMAXPROCS goroutines by itself. Default
	// runtime.GOMAXPROCS(0).
	Threads int
}

// EnsureDefaults fills zero fields with their defaults.
func (o *CPUOptions) EnsureDefaults() {
	if o.Threads == 0 {
		o.Threads = runtime.GOMAXPROCS(0)
	}
}

// Validate names the first bad field.
func (o CPUOptions) Validate() error {
	if o.Threads < 1 || o.Threads > 1024 {
		return fmt.Errorf("%w: threads: %d is outside 1..1024", ErrInvalidConfig, o.Threads)
	}
	return nil
}

// CPU is the backend that runs on the host with gonum's BLAS.
type CPU struct{ opts CPUOptions }

var _ Backend = (*CPU)(nil)

// NewCPU returns the CPU backend. opts are completed with EnsureDefaults.
func NewCPU(opts CPUOptions) (*CPU, error) {
	opts.EnsureDefaults()
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	return &CPU{opts: opts}, nil
}

// Name implements Backend.
func (*CPU) Name() string { return "cpu/gonum" }

// Tiling. Linear layers run on rowChunk rows at a time, which bounds the
// feed-forward scratch while keeping gonum's 64×64 blocking busy. Attention
// runs on tiles of about attnRows query rows (tokens × the query heads of one
// KV head, stacked so grouped-query attention makes one tall product) against
// attnKeys keys; a score tile is 256 KiB and stays in L2.
const (
	rowChunk = 512
	attnRows = 256
	attnKeys = 256
)

type cpuLayer struct {
	attnNorm, mlpNorm []float32
	qkv               *matrix   // [qkvWidth][Dim]: q_proj, k_proj, v_proj stacked (MLA: q_proj, kv_a_proj)
	qkvBias           []float32 // [qkvWidth]: the Q, K and V biases stacked (Config.QKVBias); nil without
	qNorm, kNorm      []float32 // [HeadDim] (Config.QKNorm); nil without
	kvaNorm           []float32 // MLA: kv_a_layernorm
	kvb               *matrix   // MLA: kv_b_proj [Heads·2·HeadDim][KVLoraRank]; nil without MLA
	o                 *matrix   // [Dim][AttnDim]
	gateUp            *matrix   // [2·FFN][Dim]: gate_proj, up_proj stacked
	down              *matrix   // [Dim][FFN]
}

// cpuModel is the forward pass of every backend: the element-wise work and
// attention run here, on the host; the products with weight matrices run
// on a pass from passes (the host's gonum for the CPU backend, a device for
// the device backend).
type cpuModel struct {
	cfg      Config
	threads  int
	embed    []float32
	norm     []float32
	lmHead   *matrix
	layers   []cpuLayer
	mats     []*matrix // every weight matrix, in order of matrix.id
	passes   passes
	cos, sin []float32 // [MaxContext][HeadDim/2]
	scratch  sync.Pool // *cpuScratch
}

var _ Model = (*cpuModel)(nil)

// Load implements Backend. It stacks the projections that read the same
// input into one matrix each (QKV, gate+up), so each becomes one product.
func (b *CPU) Load(cfg Config, w *Weights) (Model, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if err := w.Check(cfg); err != nil {
		return nil, err
	}
	m := newModel(cfg, w, b.opts.Threads)
	m.passes = hostPasses{threads: b.opts.Threads}
	return m, nil
}

// newModel prepares w for a forward pass on threads goroutines: it stacks
// the projections that read the same input into one matrix each (QKV,
// gate+up), so each becomes one product. The caller sets passes.
func newModel(cfg Config, w *Weights, threads int) *cpuModel {
	m := &cpuModel{cfg: cfg, threads: threads, embed: w.Embed, norm: w.Norm}
	mat := func(rows, cols int, data []float32) *matrix {
		x := &matrix{id: len(m.mats), rows: rows, cols: cols, data: data}
		m.mats = append(m.mats, x)
		return x
	}
	d, ffn := cfg.Dim, cfg.FFNDim
	for _, l := range w.Layers {
		L := cpuLayer{
			attnNorm: l.AttnNorm,
			mlpNorm:  l.MLPNorm,
			qkv:      mat(cfg.qkvWidth(), d, stacked(l.Q, l.K, l.V, l.KVA)), // K, V empty with MLA, KVA without
			qNorm:    l.QNorm,
			kNorm:    l.KNorm,
			kvaNorm:  l.KVANorm,
			o:        mat(d, cfg.AttnDim(), l.O),
			gateUp:   mat(2*ffn, d, stacked(l.Gate, l.Up)),
			down:     mat(d, ffn, l.Down),
		}
		if cfg.MLA() {
			L.kvb = mat(2*cfg.Heads*cfg.HeadDim, cfg.KVLoraRank, l.KVB)
		}
		if cfg.QKVBias {
			L.qkvBias = stacked(l.QBias, l.KBias, l.VBias)
		}
		m.layers = append(m.layers, L)
	}
	m.lmHead = mat(cfg.Vocab, d, w.LMHead)
	rd := cfg.HeadDim
	if cfg.MLA() {
		rd = cfg.RopeDim
	}
	m.cos, m.sin = ropeTable(cfg.MaxContext, rd, cfg.RopeTheta, cfg.RopeScaling)
	return m
}

// stacked returns the concatenation of parts: a view when they already lie
// one after the other in memory (a checkpoint loader lays them out so),
// else a copy.
func stacked(parts ...[]float32) []float32 {
	var all []float32
	for _, p := range parts {
		switch {
		case len(p) == 0:
		case len(all) == 0:
			all = p
		case cap(all) >= len(all)+len(p) && &all[:len(all)+1][len(all)] == &p[0]:
			all = all[:len(all)+len(p)]
		default:
			return slices.Concat(parts...)
		}
	}
	return all
}

// Close implements Model.
func (m *cpuModel) Close() error { return m.passes.close() }

// cpuScratch is the working memory of one forward pass, pooled across
// passes. Slices grow to the largest pass seen.
type cpuScratch struct {
	x    []float32 // [s][Dim], the residual stream
	qkv  []float32 // [s][qkvWidth]
	attn []float32 // [s][AttnDim]
	xn   []float32 // [rowChunk][Dim], normed input of a chunk
	gu   []float32 // [rowChunk][2·FFN]
	h    []float32 // [Dim], the last position after the final norm
	// tiles holds one attention tile's scratch per worker.
	tiles []*tileScratch
	// MLA: the expanded k_nope and v of every position ([n][Heads·2·HeadDim]),
	// every head's keys ([Heads][n][HeadDim+RopeDim]), one score tile per worker.
	mlaKV, mlaK []float32
	mlaScores   [][]float32
}

type tileScratch struct {
	q, s, o []float32
	m, l    []float32
}

func grow(b []float32, n int) []float32 {
	if cap(b) < n {
		return make([]float32, n)
	}
	return b[:n]
}

func (m *cpuModel) getScratch(s int) *cpuScratch {
	c := m.cfg
	sc, _ := m.scratch.Get().(*cpuScratch)
	if sc == nil {
		sc = &cpuScratch{}
	}
	chunk := min(s, rowChunk)
	sc.x = grow(sc.x, s*c.Dim)
	sc.qkv = grow(sc.qkv, s*c.qkvWidth())
	sc.attn = grow(sc.attn, s*c.AttnDim())
	sc.xn = grow(sc.xn, chunk*c.Dim)
	sc.gu = grow(sc.gu, chunk*2*c.FFNDim)
	sc.h = grow(sc.h, c.Dim)
	g := c.Heads / c.KVHeads
	rows := max(1, attnRows/g) * g
	for len(sc.tiles) < m.threads {
		sc.tiles = append(sc.tiles, &tileScratch{
			q: make([]float32, rows*c.HeadDim),
			s: make([]float32, rows*attnKeys),
			o: make([]float32, rows*c.HeadDim),
			m: make([]float32, rows),
			l: make([]float32, rows),
		})
	}
	return sc
}

var impl gonum.Implementation

// linear computes C = A·Bᵀ + beta·C for A [m][k] (row stride lda), B [n][k]
// (a weight matrix, row stride ldb) and C [m][n] (row stride ldc).
func linear(m, n, k int, a []float32, lda int, b []float32, ldb int, beta float32, c []float32, ldc int) {
	impl.Sgemm(blas.NoTrans, blas.Trans, m, n, k, 1, a, lda, b, ldb, beta, c, ldc)
}

// linearCancel is linear cut into products of at most about cancelFLOPs
// each (by ranges of output columns: rows of B), with a check of ctx before
// each, so that a cancelled forward pass stops within one such product
// rather than after a whole feed-forward matrix. The results are those of
// one product: each output column is computed the same way either way.
func linearCancel(ctx context.Context, m, n, k int, a []float32, lda int, b []float32, ldb int, beta float32, c []float32, ldc int) error {
	cols := max(64, min(n, cancelFLOPs/max(1, 2*m*k)/64*64))
	for c0 := 0; c0 < n; c0 += cols {
		if err := ctx.Err(); err != nil {
			return err
		}
		linear(m, min(cols, n-c0), k, a, lda, b[c0*ldb:], ldb, beta, c[c0:], ldc)
	}
	return nil
}

// cancelFLOPs bounds the arithmetic of a product linearCancel runs without
// looking at its context: a few ms on two cores. Cutting the products this
// fine costs nothing measurable (best of six cold 2048-token prefills:
// 0.96 s cut at 32 MFLOP, 1.03 s at 128, 1.16 s whole).
const cancelFLOPs = 32 << 20

// parallel runs f over [0, n) split into contiguous ranges, one per thread,
// and waits for all of them.
func (m *cpuModel) parallel(n int, f func(lo, hi int)) {
	t := min(m.threads, n/16)
	if t <= 1 {
		f(0, n)
		return
	}
	var wg sync.WaitGroup
	for i := range t {
		lo, hi := n*i/t, n*(i+1)/t
		wg.Go(func() { f(lo, hi) })
	}
	wg.Wait()
}

// Forward implements Model.
func (m *cpuModel) Forward(ctx context.Context, kv *KV, start int, tokens []uint32, logits []float32) error {
	c := m.cfg
	s := len(tokens)
	n := start + s
	switch {
	case s < 1 || start < 0 || n > c.MaxContext:
		return fmt.Errorf("prefill: forward of positions [%d, %d) with max context %d", start, n, c.MaxContext)
	case !kv.fits(c, n):
		return fmt.Errorf("prefill: forward of %d positions into a KV of %d", n, kv.Cap())
	case len(logits) != c.Vocab && len(logits) != s*c.Vocab:
		return fmt.Errorf("prefill: logits of length %d for %d positions and a vocabulary of %d", len(logits), s, c.Vocab)
	}
	for i, t := range tokens {
		if int(t) >= c.Vocab {
			return fmt.Errorf("prefill: token %d at %d outside the vocabulary of %d", t, start+i, c.Vocab)
		}
	}
	p, err := m.passes.get()
	if err != nil {
		return err
	}
	defer m.passes.put(p)
	sc := m.getScratch(s)
	defer m.scratch.Put(sc)

	d, q, kvd, ffn := c.Dim, c.QDim(), c.KVDim(), c.FFNDim
	w, ad := c.qkvWidth(), c.AttnDim()
	half := c.HeadDim / 2
	x := sc.x[:s*d]
	for i, t := range tokens {
		copy(x[i*d:(i+1)*d], m.embed[int(t)*d:(int(t)+1)*d])
	}
	for li := range m.layers {
		if err := ctx.Err(); err != nil {
			return err
		}
		L := &m.layers[li]
		// Q, K, V (MLA: Q and the latent) of the new positions.
		for r0 := 0; r0 < s; r0 += rowChunk {
			rows := min(rowChunk, s-r0)
			xn := sc.xn[:rows*d]
			m.parallel(rows, func(lo, hi int) {
				for i := lo; i < hi; i++ {
					rmsNorm(xn[i*d:(i+1)*d], x[(r0+i)*d:(r0+i+1)*d], L.attnNorm, c.NormEps)
				}
			})
			if err := p.linear(ctx, L.qkv, rows, xn, d, 0, sc.qkv[r0*w:], w); err != nil {
				return err
			}
			if L.qkvBias != nil {
				m.parallel(rows, func(lo, hi int) {
					for i := lo; i < hi; i++ {
						row := sc.qkv[(r0+i)*w : (r0+i+1)*w]
						for j, b := range L.qkvBias[:len(row)] {
							row[j] += b
						}
					}
				})
			}
		}
		if c.MLA() {
			if err := m.attentionMLA(ctx, p, sc, L, kv.Latent(li), start, s); err != nil {
				return err
			}
		} else {
			// RoPE on Q and K; K and V into the cache.
			K, V := kv.K(li), kv.V(li)
			m.parallel(s, func(lo, hi int) {
				for i := lo; i < hi; i++ {
					p := start + i
					row := sc.qkv[i*w : (i+1)*w]
					cs, sn := m.cos[p*half:(p+1)*half], m.sin[p*half:(p+1)*half]
					if L.qNorm != nil {
						headNorm(row[:q], L.qNorm, c.NormEps)
						headNorm(row[q:q+kvd], L.kNorm, c.NormEps)
					}
					rope(row[:q], c.Heads, c.HeadDim, cs, sn)
					rope(row[q:q+kvd], c.KVHeads, c.HeadDim, cs, sn)
					copy(K[p*kvd:(p+1)*kvd], row[q:q+kvd])
					copy(V[p*kvd:(p+1)*kvd], row[q+kvd:])
				}
			})
			if err := m.attention(ctx, sc, start, s, K[:n*kvd], V[:n*kvd]); err != nil {
				return err
			}
		}
		// Output projection and feed-forward, both added to the residual.
		for r0 := 0; r0 < s; r0 += rowChunk {
			if err := ctx.Err(); err != nil {
				return err
			}
			rows := min(rowChunk, s-r0)
			xr := x[r0*d : (r0+rows)*d]
			if err := p.linear(ctx, L.o, rows, sc.attn[r0*ad:], ad, 1, xr, d); err != nil {
				return err
			}
			xn := sc.xn[:rows*d]
			m.parallel(rows, func(lo, hi int) {
				for i := lo; i < hi; i++ {
					rmsNorm(xn[i*d:(i+1)*d], xr[i*d:(i+1)*d], L.mlpNorm, c.NormEps)
				}
			})
			gu := sc.gu[:rows*2*ffn]
			if err := p.linear(ctx, L.gateUp, rows, xn, d, 0, gu, 2*ffn); err != nil {
				return err
			}
			m.parallel(rows, func(lo, hi int) {
				for i := lo; i < hi; i++ {
					swiGLU(gu[i*2*ffn:i*2*ffn+ffn], gu[i*2*ffn+ffn:(i+1)*2*ffn])
				}
			})
			if err := p.linear(ctx, L.down, rows, gu, 2*ffn, 1, xr, d); err != nil {
				return err
			}
		}
	}
	if s > 1 && len(logits) == s*c.Vocab {
		return m.headAll(ctx, p, sc, x, s, logits)
	}
	h := sc.h[:d]
	rmsNorm(h, x[(s-1)*d:], m.norm, c.NormEps)
	return p.head(ctx, m.lmHead, h, logits)
}

// headAll computes the logits of every one of the s positions of x into
// logits ([s][Vocab]): the final norm of each row, then one product with
// the LM head per chunk of rows, so that the head is read once for all of
// them (what makes verifying proposed tokens cheaper than decoding them).
func (m *cpuModel) headAll(ctx context.Context, p pass, sc *cpuScratch, x []float32, s int, logits []float32) error {
	d, v := m.cfg.Dim, m.cfg.Vocab
	for r0 := 0; r0 < s; r0 += rowChunk {
		rows := min(rowChunk, s-r0)
		xn := sc.xn[:rows*d]
		for i := range rows {
			rmsNorm(xn[i*d:(i+1)*d], x[(r0+i)*d:(r0+i+1)*d], m.norm, m.cfg.NormEps)
		}
		if err := p.linear(ctx, m.lmHead, rows, xn, d, 0, logits[r0*v:], v); err != nil {
			return err
		}
	}
	return nil
}

// attention computes causal grouped-query attention of the s new positions
// (queries in sc.qkv, K/V of all start+s positions in K and V) into sc.attn.
// Work is cut into (KV head, query tile) items that the threads take from a
// shared counter, longest first; each item walks the key tiles up to its last
// query and never touches the upper triangle beyond the diagonal tile.
func (m *cpuModel) attention(ctx context.Context, sc *cpuScratch, start, s int, K, V []float32) error {
	c := m.cfg
	g := c.Heads / c.KVHeads
	tq := max(1, attnRows/g)
	tiles := (s + tq - 1) / tq
	items := int64(tiles * c.KVHeads)
	var next atomic.Int64
	var stop atomic.Bool
	work := func(ts *tileScratch) {
		for !stop.Load() {
			it := next.Add(1) - 1
			if it >= items {
				return
			}
			if ctx.Err() != nil {
				stop.Store(true)
				return
			}
			t := tiles - 1 - int(it)/c.KVHeads
			kvh := int(it) % c.KVHeads
			i0 := t * tq
			if !m.attendTile(ctx, ts, sc, kvh, start, i0, min(tq, s-i0), K, V) {
				stop.Store(true)
				return
			}
		}
	}
	workers := min(m.threads, int(items))
	var wg sync.WaitGroup
	for i := 1; i < workers; i++ {
		ts := sc.tiles[i]
		wg.Go(func() { work(ts) })
	}
	work(sc.tiles[0])
	wg.Wait()
	return ctx.Err()
}

// attendTile computes the attention of new positions [i0, i0+nq) (absolute
// positions start+i0...) for the query heads of KV head kvh, with an online
// softmax over key tiles (running max m, running sum l, rescaled output o).
// It checks ctx before every key tile, so that a long context does not make
// a cancelled pass linger, and reports false when it stopped for it.
func (m *cpuModel) attendTile(ctx context.Context, ts *tileScratch, sc *cpuScratch, kvh, start, i0, nq int, K, V []float32) bool {
	c := m.cfg
	g := c.Heads / c.KVHeads
	hd, q, kvd := c.HeadDim, c.QDim(), c.KVDim()
	w := q + 2*kvd
	rows := nq * g
	// Gather the tile's queries: row t·g+r is token i0+t, head kvh·g+r,
	// scaled by 1/sqrt(head_dim).
	scale := float32(1 / math.Sqrt(float64(hd)))
	qg := ts.q[:rows*hd]
	for t := range nq {
		src := sc.qkv[(i0+t)*w+kvh*g*hd:]
		for j, v := range src[:g*hd] {
			qg[t*g*hd+j] = v * scale
		}
	}
	o, mx, l := ts.o[:rows*hd], ts.m[:rows], ts.l[:rows]
	clear(o)
	clear(l)
	for i := range mx {
		mx[i] = float32(math.Inf(-1))
	}
	p0 := start + i0 // the tile's first query position
	end := p0 + nq   // keys [0, end)
	first := 0       // the first key any query of the tile sees
	if win := c.SlidingWindow; win > 0 {
		first = max(0, p0-win+1) / attnKeys * attnKeys
	}
	for k0 := first; k0 < end; k0 += attnKeys {
		if ctx.Err() != nil {
			return false
		}
		kn := min(attnKeys, end-k0)
		sm := ts.s[:rows*attnKeys]
		linear(rows, kn, hd, qg, hd, K[k0*kvd+kvh*hd:], kvd, 0, sm, attnKeys)
		for t := range nq {
			// Keys k0+lo..p0+t are visible: the causal mask, and the
			// sliding window's lower bound.
			lo, valid := 0, min(kn, p0+t+1-k0)
			if win := c.SlidingWindow; win > 0 {
				lo = min(max(0, p0+t-win+1-k0), kn)
			}
			for r := range g {
				row := t*g + r
				srow := sm[row*attnKeys : row*attnKeys+kn]
				if valid <= lo {
					clear(srow)
					continue
				}
				clear(srow[:lo])
				rmax := srow[lo]
				for _, v := range srow[lo+1 : valid] {
					rmax = max(rmax, v)
				}
				if rmax > mx[row] {
					corr := expf(mx[row] - rmax)
					l[row] *= corr
					orow := o[row*hd : (row+1)*hd]
					for j := range orow {
						orow[j] *= corr
					}
					mx[row] = rmax
				}
				var sum float32
				mr := mx[row]
				for j, v := range srow[lo:valid] {
					e := expf(v - mr)
					srow[lo+j] = e
					sum += e
				}
				clear(srow[valid:])
				l[row] += sum
			}
		}
		impl.Sgemm(blas.NoTrans, blas.NoTrans, rows, hd, kn, 1, sm, attnKeys, V[k0*kvd+kvh*hd:], kvd, 1, o, hd)
	}
	for t := range nq {
		dst := sc.attn[(i0+t)*q+kvh*g*hd:]
		for r := range g {
			row := t*g + r
			inv := 1 / l[row]
			for j, v := range o[row*hd : (row+1)*hd] {
				dst[r*hd+j] = v * inv
			}
		}
	}
	return true
}
