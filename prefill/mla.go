package prefill

import (
	"context"
	"math"
	"sync"
	"sync/atomic"

	"github.com/kvmesh/kvmesh/prefill/gemm"
)

// Multi-head latent attention (MLA), as in DeepSeek-V2/V3 and Kimi K2, in
// its plain (unabsorbed) form. Per layer and token, with x the normed input:
//
//	q          = x·q_projᵀ, per head [nope (HeadDim) | rope (RopeDim)]
//	[c | k_pe] = x·kv_a_projᵀ, c of KVLoraRank, k_pe of RopeDim
//	latent     = [RMSNorm(c)·kv_a_layernorm | RoPE(k_pe)]      ← cached
//	[k_nope_h | v_h] = latent_c·kv_b_projᵀ, per head            ← at attention time
//	k_h        = [k_nope_h | RoPE'd k_pe] (k_pe shared by every head)
//	q_h        = [q_nope_h | RoPE(q_pe_h)]
//	out_h      = softmax(q_h·k_hᵀ / sqrt(HeadDim+RopeDim), causal)·v_h
//
// The cache holds one latent of KVLoraRank+RopeDim per token and layer (576
// for DeepSeek-V3), not a K and a V per head: that is the
// prefixhash.LatentKV layout, and a prefix hit loads latents, from which the
// suffix's attention expands K and V again. Production kernels absorb
// kv_b_proj into the query and output projections instead of expanding; the
// result is the same up to rounding, and expanding keeps this one short.

// attentionMLA runs one MLA layer's attention for the s new positions
// [start, start+s): their q and [c | k_pe] are in sc.qkv; it writes their
// latents into lat ([token][KVLoraRank+RopeDim]) and their attention output
// into sc.attn. The latents' expansion (kv_b_proj) runs on p, like every
// product with a weight matrix.
func (m *cpuModel) attentionMLA(ctx context.Context, p pass, sc *cpuScratch, L *cpuLayer, lat []float32, start, s int) error {
	c := m.cfg
	q, r, rd, hd, heads := c.QDim(), c.KVLoraRank, c.RopeDim, c.HeadDim, c.Heads
	w, cd, qh := c.qkvWidth(), c.CacheDim(), hd+rd
	n := start + s
	half := rd / 2
	m.parallel(s, func(lo, hi int) {
		for i := lo; i < hi; i++ {
			p := start + i
			row := sc.qkv[i*w : (i+1)*w]
			cs, sn := m.cos[p*half:(p+1)*half], m.sin[p*half:(p+1)*half]
			dst := lat[p*cd : (p+1)*cd]
			rmsNorm(dst[:r], row[q:q+r], L.kvaNorm, c.NormEps)
			copy(dst[r:], row[q+r:q+cd])
			rope(dst[r:], 1, rd, cs, sn)
			for h := range heads {
				rope(row[h*qh+hd:(h+1)*qh], 1, rd, cs, sn)
			}
		}
	})
	// Expand every position's latent into its per-head k_nope and v.
	kvw := 2 * heads * hd
	sc.mlaKV = grow(sc.mlaKV, n*kvw)
	if err := p.linear(ctx, L.kvb, n, lat, cd, 0, sc.mlaKV, kvw); err != nil {
		return err
	}
	// Each head's keys, [n][HeadDim+RopeDim]: its k_nope beside the shared k_pe.
	sc.mlaK = grow(sc.mlaK, heads*n*qh)
	m.parallel(n, func(lo, hi int) {
		for j := lo; j < hi; j++ {
			for h := range heads {
				k := sc.mlaK[(h*n+j)*qh : (h*n+j+1)*qh]
				copy(k[:hd], sc.mlaKV[j*kvw+h*2*hd:])
				copy(k[hd:], lat[j*cd+r:(j+1)*cd])
			}
		}
	})
	tiles := (s + attnRows - 1) / attnRows
	items := int64(tiles * heads)
	var next atomic.Int64
	work := func(scores *[]float32) {
		for {
			it := next.Add(1) - 1
			if it >= items || ctx.Err() != nil {
				return
			}
			t := tiles - 1 - int(it)/heads // longest tiles first
			h := int(it) % heads
			i0 := t * attnRows
			m.attendMLATile(sc, scores, h, start, i0, min(attnRows, s-i0), n)
		}
	}
	workers := min(m.threads, int(items))
	for len(sc.mlaScores) < workers {
		sc.mlaScores = append(sc.mlaScores, nil)
	}
	var wg sync.WaitGroup
	for i := 1; i < workers; i++ {
		wg.Go(func() { work(&sc.mlaScores[i]) })
	}
	work(&sc.mlaScores[0])
	wg.Wait()
	return ctx.Err()
}

// attendMLATile computes head h's attention for new positions [i0, i0+nq)
// over keys [0, start+i0+nq), scores held whole (a tile's rows times the
// context): plain softmax, no online rescaling.
func (m *cpuModel) attendMLATile(sc *cpuScratch, scores *[]float32, h, start, i0, nq, n int) {
	c := m.cfg
	hd, qh, heads := c.HeadDim, c.HeadDim+c.RopeDim, c.Heads
	w, kvw, ad := c.qkvWidth(), 2*heads*c.HeadDim, c.AttnDim()
	keys := start + i0 + nq
	*scores = grow(*scores, nq*keys)
	sm := *scores
	scale := float32(1 / math.Sqrt(float64(qh)))
	_ = gemm.MulT(context.Background(), 1, nq, keys, qh, scale, sc.qkv[i0*w+h*qh:], w,
		sc.mlaK[h*n*qh:], qh, 0, sm, keys)
	for t := range nq {
		row := sm[t*keys : (t+1)*keys]
		valid := start + i0 + t + 1
		mx := row[0]
		for _, v := range row[1:valid] {
			mx = max(mx, v)
		}
		var sum float32
		for j, v := range row[:valid] {
			e := expf(v - mx)
			row[j] = e
			sum += e
		}
		clear(row[valid:])
		inv := 1 / sum
		for j := range row[:valid] {
			row[j] *= inv
		}
	}
	_ = gemm.Mul(context.Background(), 1, nq, hd, keys, 1, sm, keys, sc.mlaKV[h*2*hd+hd:], kvw,
		0, sc.attn[i0*ad+h*hd:], ad)
}
