package prefill

import (
	"context"
	"fmt"
)

// Backend turns weights into a runnable model on some device. The CPU
// backend (NewCPU) runs on gonum's BLAS; the device backend (NewDevice) runs
// its matrix products on a GPU. Both keep the contract: K/V enter and leave
// through a host-side KV, because that is what the store holds.
type Backend interface {
	// Name identifies the backend in logs and metrics ("cpu/gonum").
	Name() string
	// Load prepares w, the weights of cfg, for this backend. cfg is valid and
	// w passes Check(cfg). The model may keep references to w's slices and
	// never modifies them.
	Load(cfg Config, w *Weights) (Model, error)
}

// Model is a loaded decoder. Forward may be called concurrently, each call
// with its own KV.
type Model interface {
	// Forward computes positions [start, start+len(tokens)) of a sequence
	// whose K/V for [0, start) are already in kv: it writes the new
	// positions' K/V into kv and the logits of the last position into logits
	// (len cfg.Vocab), or of every new position when logits holds them all
	// ([len(tokens)][cfg.Vocab]: a speculative step verifies its proposals
	// so). len(tokens) ≥ 1, start+len(tokens) ≤ kv.Cap(), every token <
	// cfg.Vocab. It stops early with ctx's error when ctx is done.
	Forward(ctx context.Context, kv *KV, start int, tokens []uint32, logits []float32) error
	// Close releases the model's resources (device memory). Forward must not
	// be running or called after it.
	Close() error
}

// KV holds the attention keys and values of one sequence in host memory,
// in the layout attention reads: [layer][K|V][token][kv_head][head_dim],
// float32, keys after RoPE (GQA), or [layer][token][latent] with latent =
// the normalised compressed KV ‖ the rotary key part after RoPE (MLA). The
// K (or V, or latent) of tokens [a, b) in one layer is therefore one
// contiguous run. A block payload is [layer][kv_head][K|V][token][head_dim]
// (package block): readBlock and writeBlock transpose, one head_dim run
// per token, head and tensor (one run per layer for MLA, or one head).
type KV struct {
	layers, parts, stride, cap int
	heads                      int // KV heads (1 for MLA: the latent is one run)
	data                       []float32
}

// NewKV returns a KV for up to tokens tokens of a model shaped by c.
func NewKV(c Config, tokens int) *KV {
	if tokens < 0 {
		panic(fmt.Sprintf("prefill: NewKV(%d tokens)", tokens))
	}
	p := c.cacheParts()
	heads := 1
	if !c.MLA() {
		heads = c.KVHeads
	}
	return &KV{layers: c.Layers, parts: p, stride: c.CacheDim(), heads: heads, cap: tokens, data: make([]float32, c.Layers*p*tokens*c.CacheDim())}
}

// Cap returns the number of tokens kv can hold.
func (kv *KV) Cap() int { return kv.cap }

// part returns part i of layer l, [token][stride] for Cap tokens.
func (kv *KV) part(l, i int) []float32 {
	n := kv.cap * kv.stride
	o := (l*kv.parts + i) * n
	return kv.data[o : o+n]
}

// K returns the keys of layer l, [token][kv_head][head_dim] for Cap tokens.
// The slice aliases kv. GQA only.
func (kv *KV) K(l int) []float32 { return kv.part(l, 0) }

// V returns the values of layer l, laid out as K. GQA only.
func (kv *KV) V(l int) []float32 { return kv.part(l, 1) }

// Latent returns the cached latents of layer l, [token][latent] for Cap
// tokens. The slice aliases kv. MLA only.
func (kv *KV) Latent(l int) []float32 { return kv.part(l, 0) }

// fits reports whether kv was made for c and holds tokens tokens.
func (kv *KV) fits(c Config, tokens int) bool {
	return kv.layers == c.Layers && kv.parts == c.cacheParts() && kv.stride == c.CacheDim() && kv.cap >= tokens &&
		(c.MLA() && kv.heads == 1 || kv.heads == c.KVHeads)
}

// blockRuns calls f for the runs of the tokens [t0, t0+n) in the order of
// a block's payload: per layer, per KV head, K then V (or the latent), per
// token. With one head (or MLA) a layer's K of the n tokens is one run.
func (kv *KV) blockRuns(t0, n int, f func(run []float32)) {
	hd := kv.stride / kv.heads
	for l := range kv.layers {
		if kv.heads == 1 {
			for i := range kv.parts {
				f(kv.part(l, i)[t0*kv.stride : (t0+n)*kv.stride])
			}
			continue
		}
		for h := range kv.heads {
			for i := range kv.parts {
				p := kv.part(l, i)
				for t := t0; t < t0+n; t++ {
					o := t*kv.stride + h*hd
					f(p[o : o+hd])
				}
			}
		}
	}
}

// readBlock copies a block payload (little-endian float32) into tokens
// [t0, t0+n). len(payload) must be the block's payload length.
func (kv *KV) readBlock(t0, n int, payload []byte) {
	kv.blockRuns(t0, n, func(run []float32) {
		getFloats(run, payload[:4*len(run)])
		payload = payload[4*len(run):]
	})
}

// writeBlock copies tokens [t0, t0+n) into dst as a block payload.
func (kv *KV) writeBlock(dst []byte, t0, n int) {
	kv.blockRuns(t0, n, func(run []float32) {
		putFloats(dst[:4*len(run)], run)
		dst = dst[4*len(run):]
	})
}
