package prefill

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"

	"github.com/kvmesh/kvmesh/prefixhash"
)

// Hybrid models (Config.LayerTypes) mix three kinds of layer:
//
//   - full attention ('f'), Llama's;
//   - sliding-window attention ('s'): attention over the SlidingWindow
//     positions up to the query (Gemma 3's and gpt-oss's local layers);
//   - gated linear attention ('l'), whose cache is a fixed-size recurrent
//     state per KV head rather than keys and values per token. It is the
//     simplest member of the family Qwen3-Next's Gated DeltaNet and Mamba's
//     state-space layers belong to: with q̂ and k̂ a token's query and key
//     heads scaled to unit length, v its value head and g = σ(x̂·w + 3) a
//     decay in (0, 1) per KV head (x̂ the layer's normed input, w its
//     linear_attn.gate weights; the 3 makes seeded weights remember some
//     tens of tokens),
//
//     S_t = g_t·S_{t−1} + k̂_t ⊗ v_t,   o_t = q̂_tᵀ S_t
//
//     with no RoPE (the decay orders the tokens). S is HeadDim × HeadDim
//     per KV head; the query heads of a KV head share it as they share
//     keys in grouped-query attention.
//
// The KV blocks of such a model are a namespace with groups
// (prefixhash.Groups): the full layers' K/V (group 0, the anchor), the
// sliding layers' K/V (a sliding group of the model's window) and the
// linear layers' states (a state group: group g's record of block i is
// the state after block i's last token). A prefill resumes at the longest
// prefix P whose full blocks, window before P and state at P are all
// cached (prefixhash.Resume); the engine asks a GroupCache for it.

// linGateBias is added to a linear layer's gate before the sigmoid.
const linGateBias = 3

// Kinds of layer in Config.LayerTypes.
const (
	LayerFull    = 'f'
	LayerSliding = 's'
	LayerLinear  = 'l'
)

// Hybrid reports whether c is a hybrid model (Config.LayerTypes set): its
// blocks are then records of groups.
func (c Config) Hybrid() bool { return c.LayerTypes != "" }

// layerType returns the kind of layer l.
func (c Config) layerType(l int) byte {
	switch {
	case c.LayerTypes != "":
		return c.LayerTypes[l]
	case c.SlidingWindow > 0:
		return LayerSliding
	}
	return LayerFull
}

// window returns the attention window of layer l: 0 for the whole prefix.
func (c Config) window(l int) int {
	if c.layerType(l) == LayerSliding {
		return c.SlidingWindow
	}
	return 0
}

// linearLayers returns the number of gated linear-attention layers.
func (c Config) linearLayers() int { return strings.Count(c.LayerTypes, string(rune(LayerLinear))) }

// stateFloats returns the size of one linear layer's state in float32s:
// KVHeads·HeadDim·HeadDim.
func (c Config) stateFloats() int { return c.KVHeads * c.HeadDim * c.HeadDim }

func (c Config) validateLayerTypes(bad func(field, format string, args ...any) error) error {
	t := c.LayerTypes
	if t == "" {
		return nil
	}
	switch {
	case c.MLA():
		return bad("layer_types", "hybrid layer plans are for %s attention only", AttentionGQA)
	case c.QKNorm && strings.IndexByte(t, LayerLinear) >= 0:
		return bad("layer_types", "linear-attention layers do not take qk_norm (qwen3's q/k norms)")
	case len(t) != c.Layers:
		return bad("layer_types", "%q has %d letters for %d layers", t, len(t), c.Layers)
	}
	for i := range len(t) {
		switch t[i] {
		case LayerFull, LayerSliding, LayerLinear:
		default:
			return bad("layer_types", "layer %d is %q: want %c (full attention), %c (sliding window) or %c (linear attention)",
				i, t[i], LayerFull, LayerSliding, LayerLinear)
		}
	}
	sliding := strings.IndexByte(t, LayerSliding) >= 0
	switch {
	case strings.IndexByte(t, LayerFull) < 0:
		return bad("layer_types", "%q has no full-attention layer (%c): the full layers anchor the others' records", t, LayerFull)
	case strings.Trim(t, string(rune(LayerFull))) == "":
		return bad("layer_types", "every layer is full attention: leave layer_types empty")
	case sliding && c.SlidingWindow < 1:
		return bad("sliding_window", "the sliding layers of %q need a window", t)
	case !sliding && c.SlidingWindow != 0:
		return bad("sliding_window", "%d with no sliding layer in %q", c.SlidingWindow, t)
	}
	return nil
}

// hfLayerTypes maps config.json's layer_types to Config.LayerTypes.
var hfLayerTypes = map[string]byte{"full_attention": LayerFull, "sliding_attention": LayerSliding, "linear_attention": LayerLinear}

// setLayerTypes sets c's layer plan from config.json's layer_types (one
// per layer: full_attention, sliding_attention, linear_attention) and
// sliding_window. A plan of full layers only is a plain model, one of
// sliding layers only a plain model with a window; anything else is a
// hybrid (LayerTypes). A kind of layer the engine does not run is refused
// by name.
func (c *Config) setLayerTypes(types []string, window *int) error {
	if len(types) != c.Layers {
		return fmt.Errorf("layer_types: %d entries for %d layers (num_hidden_layers)", len(types), c.Layers)
	}
	plan := make([]byte, len(types))
	for i, t := range types {
		k, ok := hfLayerTypes[t]
		if !ok {
			return fmt.Errorf("layer_types[%d]: %q is not supported; this engine runs full_attention, sliding_attention and linear_attention layers", i, t)
		}
		plan[i] = k
	}
	p := string(plan)
	sliding := strings.IndexByte(p, LayerSliding) >= 0
	if sliding {
		if window == nil || *window < 1 {
			return errors.New("sliding_window: the sliding_attention layers of layer_types need one")
		}
		c.SlidingWindow = *window
	}
	switch strings.Trim(p, p[:1]) {
	case "": // every layer of one kind
		if p[0] == LayerLinear {
			return errors.New("layer_types: every layer is linear_attention; a hybrid needs a full_attention layer")
		}
	default:
		c.LayerTypes = p
	}
	return nil
}

// groups returns the groups of a hybrid model's namespace: its full layers
// (group 0), then its sliding layers, then its linear layers' states, each
// group only when the model has such layers.
func (c Config) groups() prefixhash.Groups {
	var full, sliding, linear []int
	for l := range c.Layers {
		switch c.LayerTypes[l] {
		case LayerFull:
			full = append(full, l)
		case LayerSliding:
			sliding = append(sliding, l)
		default:
			linear = append(linear, l)
		}
	}
	kv := func(kind prefixhash.GroupKind, window int, layers []int) prefixhash.Group {
		return prefixhash.Group{Kind: kind, Window: window, Layers: layers, Layout: prefixhash.SplitKV, DType: prefixhash.Float32,
			KVHeads: c.KVHeads, HeadDim: c.HeadDim}
	}
	gs := []prefixhash.Group{kv(prefixhash.GroupFull, 0, full)}
	if sliding != nil {
		gs = append(gs, kv(prefixhash.GroupSliding, c.SlidingWindow, sliding))
	}
	if linear != nil {
		gs = append(gs, prefixhash.Group{Kind: prefixhash.GroupState, Layers: linear, Layout: prefixhash.StateKV,
			DType: prefixhash.Float32, KVHeads: c.KVHeads, StateBytes: 4 * c.HeadDim * c.HeadDim})
	}
	return prefixhash.MustGroups(gs...)
}

// linState is the recurrent state of a KV's linear layers: the state after
// its first pos positions, and the state after each block's last token,
// which a prefill publishes as the state group's records.
type linState struct {
	ordinal []int // layer → its index among the linear layers, -1 for others
	size    int   // float32s of one layer's state (Config.stateFloats)
	block   int   // BlockTokens
	pos     int
	cur     []float32 // [linear layer][kv_head][HeadDim (v)][HeadDim (k)]
	snaps   []float32 // [block][linear layer][...as cur]
}

// newLinState returns the states of c's linear layers for a KV of tokens
// tokens, or nil when c has none.
func newLinState(c Config, tokens int) *linState {
	n := c.linearLayers()
	if n == 0 {
		return nil
	}
	s := &linState{ordinal: make([]int, c.Layers), size: c.stateFloats(), block: c.BlockTokens}
	o := 0
	for l := range c.Layers {
		s.ordinal[l] = -1
		if c.layerType(l) == LayerLinear {
			s.ordinal[l] = o
			o++
		}
	}
	s.cur = make([]float32, n*s.size)
	s.snaps = make([]float32, tokens/c.BlockTokens*n*s.size)
	return s
}

// fits reports whether s (nil for none) is the states of c's linear layers
// for tokens tokens.
func (s *linState) fits(c Config, tokens int) bool {
	n := c.linearLayers()
	if s == nil || n == 0 {
		return s == nil && n == 0
	}
	return len(s.ordinal) == c.Layers && s.size == c.stateFloats() && s.block == c.BlockTokens && len(s.cur) == n*s.size &&
		len(s.snaps) >= tokens/c.BlockTokens*n*s.size
}

// snap returns the states after block i's last token, every linear
// layer's in a row: the payload of the state group's record of block i.
func (s *linState) snap(i int) []float32 {
	n := len(s.cur)
	return s.snaps[i*n : (i+1)*n]
}

// setState makes the state after the first pos positions the one in
// payload (a state record's).
func (s *linState) setState(payload []byte, pos int) {
	getFloats(s.cur, payload[:4*len(s.cur)])
	s.pos = pos
}

// readLayers copies a group's record payload, the K/V of layers, into
// tokens [t0, t0+n).
func (kv *KV) readLayers(layers []int, t0, n int, payload []byte) {
	kv.blockRuns(layers, t0, n, func(run []float32) {
		getFloats(run, payload[:4*len(run)])
		payload = payload[4*len(run):]
	})
}

// writeLayers copies tokens [t0, t0+n) of layers into dst as a group's
// record payload.
func (kv *KV) writeLayers(dst []byte, layers []int, t0, n int) {
	kv.blockRuns(layers, t0, n, func(run []float32) {
		putFloats(dst[:4*len(run)], run)
		dst = dst[4*len(run):]
	})
}

// beginStates readies sc's copy of kv's recurrent states for a forward
// pass from start: zero from position 0, else kv's, which must be the
// state after start positions. A pass works on the copy and commits it
// (commitStates) only once it is done, so a cancelled pass can be run
// again.
func (m *cpuModel) beginStates(sc *cpuScratch, kv *KV, start int) error {
	s := kv.lin
	if s == nil {
		return nil
	}
	if start > 0 && s.pos != start {
		return fmt.Errorf("prefill: forward from position %d with the recurrent state after %d", start, s.pos)
	}
	sc.lin = grow(sc.lin, len(s.cur))
	if start == 0 {
		clear(sc.lin)
	} else {
		copy(sc.lin, s.cur)
	}
	return nil
}

func commitStates(sc *cpuScratch, kv *KV, n int) {
	if s := kv.lin; s != nil {
		copy(s.cur, sc.lin)
		s.pos = n
	}
}

// gates computes the decay gates of a linear layer's rows rows of normed
// input xn into dst ([rows][KVHeads]): σ(xn·w + linGateBias) per KV head.
func (m *cpuModel) gates(L *cpuLayer, xn []float32, rows int, dst []float32) {
	c := m.cfg
	d := c.Dim
	m.parallel(rows, func(lo, hi int) {
		for i := lo; i < hi; i++ {
			x := xn[i*d : (i+1)*d]
			for j := range c.KVHeads {
				var z float32
				for k, w := range L.linGate[j*d : (j+1)*d] {
					z += w * x[k]
				}
				dst[i*c.KVHeads+j] = 1 / (1 + expf(-z-linGateBias))
			}
		}
	})
}

// linearAttention runs gated linear attention (see the top of this file)
// over the s new positions of layer li, whose queries, keys and values are
// in sc.qkv and gates in sc.gate, from the state in sc.lin, into sc.attn.
// It records the state after each block's last token in kv.
func (m *cpuModel) linearAttention(ctx context.Context, sc *cpuScratch, kv *KV, li, start, s int) error {
	c := m.cfg
	hd, q, kvd := c.HeadDim, c.QDim(), c.KVDim()
	w, g, ad := c.qkvWidth(), c.Heads/c.KVHeads, c.AttnDim()
	ls := kv.lin
	o := ls.ordinal[li]
	st := sc.lin[o*ls.size : (o+1)*ls.size]
	// Every query and key head to unit length.
	m.parallel(s, func(lo, hi int) {
		for t := lo; t < hi; t++ {
			row := sc.qkv[t*w:]
			for h := range c.Heads + c.KVHeads {
				unit(row[h*hd : (h+1)*hd])
			}
		}
	})
	if err := ctx.Err(); err != nil {
		return err
	}
	// One column of one KV head's state is a unit of work: the recurrence
	// runs down the tokens, the columns are independent.
	m.parallel(c.KVHeads*hd, func(lo, hi int) {
		for u := lo; u < hi; u++ {
			kvh, col := u/hd, u%hd
			row := st[u*hd : (u+1)*hd]
			for t := range s {
				x := sc.qkv[t*w : (t+1)*w]
				gt := sc.gate[t*c.KVHeads+kvh]
				v := x[q+kvd+kvh*hd+col]
				k := x[q+kvh*hd : q+(kvh+1)*hd]
				for i := range row {
					row[i] = gt*row[i] + v*k[i]
				}
				for r := range g {
					h := kvh*g + r
					var dot float32
					for i, qi := range x[h*hd : (h+1)*hd] {
						dot += qi * row[i]
					}
					sc.attn[t*ad+h*hd+col] = dot
				}
				if p := start + t + 1; p%ls.block == 0 {
					copy(ls.snap(p/ls.block - 1)[o*ls.size+u*hd:], row)
				}
			}
		}
	})
	return ctx.Err()
}

// unit scales v to unit length (a zero vector stays zero).
func unit(v []float32) {
	var ss float64
	for _, x := range v {
		ss += float64(x) * float64(x)
	}
	if ss == 0 {
		return
	}
	inv := float32(1 / math.Sqrt(ss))
	for i := range v {
		v[i] *= inv
	}
}
