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
	// (len cfg.Vocab). len(tokens) ≥ 1, start+len(tokens) ≤ kv.Cap(), every
	// token < cfg.Vocab. It stops early with ctx's error when ctx is done.
	Forward(ctx context.Context, kv *KV, start int, tokens []uint32, logits []float32) error
	// Close releases the model's resources (device memory). Forward must not
	// be running or called after it.
	Close() error
}

// KV holds the attention keys and values of one sequence in host memory, in
// the layout of a block's payload stretched over the whole sequence:
// [layer][K|V][token][kv_head][head_dim], float32. Keys are stored after
// RoPE. The K (or V) of tokens [a, b) in one layer is therefore one
// contiguous run, and a block is 2·Layers such runs.
type KV struct {
	layers, stride, cap int
	data                []float32
}

// NewKV returns a KV for up to tokens tokens of a model shaped by c.
func NewKV(c Config, tokens int) *KV {
	if tokens < 0 {
		panic(fmt.Sprintf("prefill: NewKV(%d tokens)", tokens))
	}
	return &KV{layers: c.Layers, stride: c.KVDim(), cap: tokens, data: make([]float32, c.Layers*2*tokens*c.KVDim())}
}

// Cap returns the number of tokens kv can hold.
func (kv *KV) Cap() int { return kv.cap }

// K returns the keys of layer l, [token][kv_head][head_dim] for Cap tokens.
// The slice aliases kv.
func (kv *KV) K(l int) []float32 {
	n := kv.cap * kv.stride
	return kv.data[2*l*n : (2*l+1)*n]
}

// V returns the values of layer l, laid out as K.
func (kv *KV) V(l int) []float32 {
	n := kv.cap * kv.stride
	return kv.data[(2*l+1)*n : (2*l+2)*n]
}

// fits reports whether kv was made for c and holds tokens tokens.
func (kv *KV) fits(c Config, tokens int) bool {
	return kv.layers == c.Layers && kv.stride == c.KVDim() && kv.cap >= tokens
}

// blockRuns calls f for each of the 2·Layers contiguous runs of the tokens
// [t0, t0+n): first layer 0's K, then its V, then layer 1's, ... This is
// the order of a block's payload.
func (kv *KV) blockRuns(t0, n int, f func(run []float32)) {
	for l := range kv.layers {
		f(kv.K(l)[t0*kv.stride : (t0+n)*kv.stride])
		f(kv.V(l)[t0*kv.stride : (t0+n)*kv.stride])
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
