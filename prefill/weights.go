package prefill

import (
	"encoding/binary"
	"fmt"
	"math"

	"github.com/cespare/xxhash/v2"
)

// Weights are the decoder's parameters in float32. Matrices are row-major
// [out][in], as in Hugging Face Llama checkpoints (y = x·Wᵀ).
type Weights struct {
	Embed  []float32 // [Vocab][Dim]
	Layers []LayerWeights
	Norm   []float32 // [Dim], the final RMSNorm
	LMHead []float32 // [Vocab][Dim]

	// release frees memory the weights were loaded into (LoadCheckpoint);
	// nil for weights on the Go heap.
	release func() error
}

// Release frees the memory of weights LoadCheckpoint loaded; no model may
// use them any more. It does nothing for other weights, and the second
// time.
func (w *Weights) Release() error {
	if w == nil || w.release == nil {
		return nil
	}
	err := w.release()
	w.release = nil
	*w = Weights{}
	return err
}

// LayerWeights are the parameters of one decoder layer. GQA uses Q, K, V
// and O; MLA uses Q, KVA, KVANorm, KVB and O.
type LayerWeights struct {
	AttnNorm []float32 // [Dim]
	Q        []float32 // [QDim][Dim]
	K        []float32 // [KVHeads·HeadDim][Dim]
	V        []float32 // [KVHeads·HeadDim][Dim]
	// MLA: kv_a_proj_with_mqa [KVLoraRank+RopeDim][Dim] (the latent and the
	// shared rotary key), kv_a_layernorm [KVLoraRank], and kv_b_proj
	// [Heads·2·HeadDim][KVLoraRank] (per head its non-rotary key rows, then
	// its value rows).
	KVA, KVANorm, KVB []float32
	// Config.QKVBias: the biases of q_proj [QDim], k_proj and v_proj
	// [KVDim]. Config.QKNorm: q_norm and k_norm [HeadDim].
	QBias, KBias, VBias []float32
	QNorm, KNorm        []float32
	O                   []float32 // [Dim][Heads·HeadDim]
	MLPNorm             []float32 // [Dim]
	Gate                []float32 // [FFNDim][Dim]
	Up                  []float32 // [FFNDim][Dim]
	Down                []float32 // [Dim][FFNDim]
}

// tensor is one named parameter: its Hugging Face Llama name, shape, and
// where it lives in Weights.
type tensor struct {
	name  string
	shape []int
	data  *[]float32
	kind  tensorKind
}

type tensorKind uint8

const (
	kindNorm   tensorKind = iota // initialized to ones
	kindEmbed                    // unit variance
	kindLinear                   // variance 1/fan_in
	kindBias                     // uniform ±1/8
)

func (t tensor) elems() int {
	n := 1
	for _, d := range t.shape {
		n *= d
	}
	return n
}

// tensors lists the parameters of c in canonical order, pointing into w.
// The order and names are part of the weights digest. len(w.Layers) must be
// c.Layers.
func (c Config) tensors(w *Weights) []tensor {
	if len(w.Layers) != c.Layers {
		panic(fmt.Sprintf("prefill: weights with %d layers for a config of %d", len(w.Layers), c.Layers))
	}
	ts := []tensor{{"model.embed_tokens.weight", []int{c.Vocab, c.Dim}, &w.Embed, kindEmbed}}
	for i := range w.Layers {
		l := &w.Layers[i]
		p := fmt.Sprintf("model.layers.%d.", i)
		ts = append(ts,
			tensor{p + "input_layernorm.weight", []int{c.Dim}, &l.AttnNorm, kindNorm},
			tensor{p + "self_attn.q_proj.weight", []int{c.QDim(), c.Dim}, &l.Q, kindLinear})
		if c.MLA() {
			ts = append(ts,
				tensor{p + "self_attn.kv_a_proj_with_mqa.weight", []int{c.CacheDim(), c.Dim}, &l.KVA, kindLinear},
				tensor{p + "self_attn.kv_a_layernorm.weight", []int{c.KVLoraRank}, &l.KVANorm, kindNorm},
				tensor{p + "self_attn.kv_b_proj.weight", []int{2 * c.AttnDim(), c.KVLoraRank}, &l.KVB, kindLinear})
		} else {
			// Q, K and V, and their biases, are listed in a row: a loader
			// that lays tensors out in this order makes them one matrix.
			ts = append(ts,
				tensor{p + "self_attn.k_proj.weight", []int{c.KVDim(), c.Dim}, &l.K, kindLinear},
				tensor{p + "self_attn.v_proj.weight", []int{c.KVDim(), c.Dim}, &l.V, kindLinear})
			if c.QKVBias {
				ts = append(ts,
					tensor{p + "self_attn.q_proj.bias", []int{c.QDim()}, &l.QBias, kindBias},
					tensor{p + "self_attn.k_proj.bias", []int{c.KVDim()}, &l.KBias, kindBias},
					tensor{p + "self_attn.v_proj.bias", []int{c.KVDim()}, &l.VBias, kindBias})
			}
			if c.QKNorm {
				ts = append(ts,
					tensor{p + "self_attn.q_norm.weight", []int{c.HeadDim}, &l.QNorm, kindNorm},
					tensor{p + "self_attn.k_norm.weight", []int{c.HeadDim}, &l.KNorm, kindNorm})
			}
		}
		ts = append(ts,
			tensor{p + "self_attn.o_proj.weight", []int{c.Dim, c.AttnDim()}, &l.O, kindLinear},
			tensor{p + "post_attention_layernorm.weight", []int{c.Dim}, &l.MLPNorm, kindNorm},
			tensor{p + "mlp.gate_proj.weight", []int{c.FFNDim, c.Dim}, &l.Gate, kindLinear},
			tensor{p + "mlp.up_proj.weight", []int{c.FFNDim, c.Dim}, &l.Up, kindLinear},
			tensor{p + "mlp.down_proj.weight", []int{c.Dim, c.FFNDim}, &l.Down, kindLinear},
		)
	}
	return append(ts,
		tensor{"model.norm.weight", []int{c.Dim}, &w.Norm, kindNorm},
		tensor{"lm_head.weight", []int{c.Vocab, c.Dim}, &w.LMHead, kindLinear},
	)
}

// Check reports whether w has exactly the tensors c needs.
func (w *Weights) Check(c Config) error {
	if len(w.Layers) != c.Layers {
		return fmt.Errorf("prefill: weights have %d layers, config has %d", len(w.Layers), c.Layers)
	}
	for _, t := range c.tensors(w) {
		if len(*t.data) != t.elems() {
			return fmt.Errorf("prefill: tensor %s has %d elements, shape %v needs %d", t.name, len(*t.data), t.shape, t.elems())
		}
	}
	return nil
}

// SeededWeights returns the weights of c generated from seed. They depend
// only on (c, seed): integer arithmetic and correctly rounded float32
// operations, no math library transcendental and no math/rand, so every
// machine and Go version produces the same bits (a golden test pins them).
// Linear weights are uniform with variance 1/fan_in, embeddings uniform with
// unit variance, norm weights 1 + uniform(±1/8) so that the tests notice a
// norm weight applied to the wrong element. c must be valid.
func SeededWeights(c Config, seed uint64) *Weights {
	w := &Weights{Layers: make([]LayerWeights, c.Layers)}
	for _, t := range c.tensors(w) {
		data := make([]float32, t.elems())
		rng := splitmix{state: seed ^ xxhash.Sum64String(t.name)}
		var scale, offset float32
		switch t.kind {
		case kindNorm:
			scale, offset = 1.0/8, 1
		case kindEmbed:
			scale = float32(math.Sqrt(3))
		case kindLinear:
			scale = float32(math.Sqrt(3 / float64(t.shape[len(t.shape)-1])))
		case kindBias:
			scale = 1.0 / 8
		}
		for i := range data {
			data[i] = offset + float32(rng.uniform()*scale) // the conversion forbids fusing into an FMA
		}
		*t.data = data
	}
	return w
}

// splitmix is SplitMix64, a fixed and tiny generator: its output is part of
// the seeded weights' definition.
type splitmix struct{ state uint64 }

func (s *splitmix) next() uint64 {
	s.state += 0x9e3779b97f4a7c15
	z := s.state
	z = (z ^ z>>30) * 0xbf58476d1ce4e5b9
	z = (z ^ z>>27) * 0x94d049bb133111eb
	return z ^ z>>31
}

// uniform returns a float32 uniform in [-1, 1), exactly a multiple of 2^-23.
func (s *splitmix) uniform() float32 {
	return float32(int32(s.next()>>40)-1<<23) * (1.0 / (1 << 23))
}

// weightsDigestMagic versions the digest's encoding.
const weightsDigestMagic = "kvmesh/weights/v1"

// Digest returns a stable 64-bit digest of the weights of c: xxhash64 over
// each tensor's name, shape and little-endian float32 bytes, in canonical
// order. Equal weights give equal digests whatever their source (seed or
// safetensors file); it is part of the namespace. w must pass Check(c).
func (w *Weights) Digest(c Config) uint64 {
	var d xxhash.Digest
	d.Reset()
	var hdr []byte
	hdr = binary.LittleEndian.AppendUint32(hdr, uint32(len(weightsDigestMagic)))
	hdr = append(hdr, weightsDigestMagic...)
	d.Write(hdr)
	for _, t := range c.tensors(w) {
		hdr = hdr[:0]
		hdr = binary.LittleEndian.AppendUint32(hdr, uint32(len(t.name)))
		hdr = append(hdr, t.name...)
		hdr = binary.LittleEndian.AppendUint32(hdr, uint32(len(t.shape)))
		for _, s := range t.shape {
			hdr = binary.LittleEndian.AppendUint64(hdr, uint64(s))
		}
		d.Write(hdr)
		writeFloats(&d, *t.data)
	}
	return d.Sum64()
}

// writeFloats writes f as little-endian float32 bytes to d.
func writeFloats(d *xxhash.Digest, f []float32) {
	if littleEndian {
		d.Write(floatBytes(f))
		return
	}
	var buf [4096]byte
	for len(f) > 0 {
		n := min(len(f), len(buf)/4)
		for i, v := range f[:n] {
			binary.LittleEndian.PutUint32(buf[4*i:], math.Float32bits(v))
		}
		d.Write(buf[:4*n])
		f = f[n:]
	}
}
