package prefill

import (
	"errors"
	"fmt"
	"math"
	"strings"

	"github.com/kvmesh/kvmesh/prefixhash"
)

// Config is the shape of the decoder. The zero value is usable: EnsureDefaults
// fills every zero field with the default below. The defaults describe the
// bundled model (see DefaultConfig for why it is shaped the way it is).
type Config struct {
	// Layers is the number of decoder layers. Default 1.
	Layers int
	// Dim is the model width d (the residual stream). Default 768.
	Dim int
	// Heads is the number of query heads. Default 2.
	Heads int
	// KVHeads is the number of key/value heads (grouped-query attention:
	// Heads/KVHeads query heads share one KV head). Must divide Heads.
	// Default 1.
	KVHeads int
	// HeadDim is the size of one head; even (RoPE rotates pairs). Default 64.
	HeadDim int
	// FFNDim is the width of the SwiGLU feed-forward layer. Default 1536.
	FFNDim int
	// Vocab is the vocabulary size, at least 256 so that text tokenized byte
	// by byte always fits. Default 256.
	Vocab int
	// RopeTheta is the RoPE base frequency. Default 10000.
	RopeTheta float64
	// NormEps is the RMSNorm epsilon. Default 1e-5.
	NormEps float64
	// MaxContext is the longest prompt in tokens the engine accepts. It does
	// not change the KV values, so it is not part of the namespace.
	// Default 16384.
	MaxContext int
	// BlockTokens is B, the tokens per cached KV block. Default 64, which
	// makes a default block's payload 32 KiB.
	BlockTokens int
	// Attention is the attention: AttentionGQA (grouped-query, Llama; the
	// default, also when empty) or AttentionMLA (multi-head latent attention, DeepSeek-V2/V3
	// style; see mla.go). With MLA, HeadDim is the width of a head's
	// non-rotary query/key part and of its value, KVHeads is unused, and
	// the KV cache holds one latent vector of KVLoraRank+RopeDim per token
	// and layer (prefixhash.LatentKV).
	Attention string
	// KVLoraRank is MLA's compressed KV width (512 in DeepSeek-V3). MLA
	// only; default 64.
	KVLoraRank int
	// RopeDim is MLA's decoupled rotary width of a query/key head, whose key
	// part is shared by all heads and cached beside the latent (64 in
	// DeepSeek-V3). MLA only; even; default 16.
	RopeDim int
	// QKVBias gives q_proj, k_proj and v_proj a bias each (Qwen2). GQA
	// only. Default false.
	QKVBias bool
	// QKNorm applies an RMSNorm, with weights of HeadDim, to each query and
	// key head before RoPE (Qwen3). GQA only. Default false.
	QKNorm bool
	// SlidingWindow, when above 0, lets a position attend only to itself
	// and the SlidingWindow−1 positions before it, in every layer
	// (Mistral's sliding_window). GQA only. Default 0: the whole prefix.
	SlidingWindow int
	// RopeScaling changes RoPE's frequencies for long contexts, as
	// config.json's rope_scaling declares. The zero value is plain RoPE.
	RopeScaling RopeScaling
}

// RopeScaling is a RoPE frequency scaling, in Hugging Face's terms
// (transformers' modeling_rope_utils). Fields a type does not use are zero.
type RopeScaling struct {
	// Type is "" (none), RopeLinear, RopeLlama3 or RopeYarn.
	Type string
	// Factor is the context extension factor (> 1 for every type).
	Factor float64
	// LowFreqFactor and HighFreqFactor bound Llama 3's smoothing band.
	LowFreqFactor, HighFreqFactor float64
	// OriginalContext is the context the model was pretrained on
	// (original_max_position_embeddings; llama3 and yarn).
	OriginalContext int
	// BetaFast and BetaSlow bound YaRN's ramp, in rotations (defaults 32
	// and 1 when config.json omits them).
	BetaFast, BetaSlow float64
	// AttentionFactor scales cos and sin (YaRN's mscale); 0 reads as
	// YaRN's default 0.1·ln(Factor)+1, and as 1 for the other types.
	AttentionFactor float64
}

// The RoPE scalings a Config may name.
const (
	RopeLinear = "linear"
	RopeLlama3 = "llama3"
	RopeYarn   = "yarn"
)

// The attentions a Config may name.
const (
	AttentionGQA = "gqa"
	AttentionMLA = "mla"
)

// The defaults. See DefaultConfig.
const (
	DefaultLayers      = 1
	DefaultDim         = 768
	DefaultHeads       = 2
	DefaultKVHeads     = 1
	DefaultHeadDim     = 64
	DefaultFFNDim      = 1536
	DefaultVocab       = 256
	DefaultRopeTheta   = 10000.0
	DefaultNormEps     = 1e-5
	DefaultMaxContext  = 16384
	DefaultBlockTokens = 64
	DefaultKVLoraRank  = 64
	DefaultRopeDim     = 16
)

// MinVocab is the smallest vocabulary a Config may have: byte-level
// tokenization needs 256 ids.
const MinVocab = 256

// DefaultConfig returns the bundled model's shape.
//
// The engine stands in for a large model on a 2-core CPU, so it is sized by
// arithmetic. A cold prefill of n tokens costs about 2·n·(P + n·A) FLOPs per
// layer, where P is the parameters per layer and A = Heads·HeadDim the
// attention width (causal attention, upper triangle skipped). With a cached
// fraction c the suffix still attends to the whole prompt, so the warm/cold
// floor is ((1−c)·P + (1−c²)·n·A) / (P + n·A): the more of the cost is in
// the weights rather than in attention, the closer the floor gets to 1−c.
// Real models at 8k tokens have P ≈ 6.5·n·A (Llama-3-8B); a small model
// with A = d cannot, so the default is wide in the weights and narrow in
// attention: d = 768, A = 128 (2 query heads of 64 sharing 1 KV head),
// FFN 1536, one layer. At n = 8192 that is P = 3.83M, n·A = 1.05M, 80 GFLOP
// cold and a floor of 0.119 at c = 0.9. gonum's Sgemm reached 8–12 GFLOP/s
// on these 2 cores when they were quiet (the engine runs at about 75% of
// it), so a cold 8k prefill takes about 9 s; at 27 GFLOP/s, about 4 s. A
// Llama-shaped d = 768 (A = 768, FFN 2048) would be 206 GFLOP with a floor
// of 0.145; d = 512, 114 GFLOP and 0.154; d = 768 with A = 256 and FFN
// 3072 (this package's first default), 160 GFLOP, 18–26 s here.
func DefaultConfig() Config {
	var c Config
	c.EnsureDefaults()
	return c
}

// EnsureDefaults fills zero fields with their defaults.
func (c *Config) EnsureDefaults() {
	def := func(p *int, v int) {
		if *p == 0 {
			*p = v
		}
	}
	def(&c.Layers, DefaultLayers)
	def(&c.Dim, DefaultDim)
	def(&c.Heads, DefaultHeads)
	def(&c.KVHeads, DefaultKVHeads)
	def(&c.HeadDim, DefaultHeadDim)
	def(&c.FFNDim, DefaultFFNDim)
	def(&c.Vocab, DefaultVocab)
	def(&c.MaxContext, DefaultMaxContext)
	def(&c.BlockTokens, DefaultBlockTokens)
	if c.RopeTheta == 0 {
		c.RopeTheta = DefaultRopeTheta
	}
	if c.NormEps == 0 {
		c.NormEps = DefaultNormEps
	}
	if c.Attention == AttentionMLA {
		def(&c.KVLoraRank, DefaultKVLoraRank)
		def(&c.RopeDim, DefaultRopeDim)
	}
}

// ErrInvalidConfig is wrapped by every error Validate returns.
var ErrInvalidConfig = errors.New("prefill: invalid config")

// Limits that keep every size in range of int32 indexing and the block format.
const (
	maxDim        = 1 << 16
	maxMaxContext = 1 << 20
)

// Validate reports the first field that makes c unusable. Call EnsureDefaults
// first: zero fields are invalid here.
func (c Config) Validate() error {
	bad := func(field, format string, args ...any) error {
		return fmt.Errorf("%w: %s: %s", ErrInvalidConfig, field, fmt.Sprintf(format, args...))
	}
	switch {
	case c.Layers < 1 || c.Layers > 1024:
		return bad("layers", "%d is outside 1..1024", c.Layers)
	case c.Dim < 1 || c.Dim > maxDim:
		return bad("dim", "%d is outside 1..%d", c.Dim, maxDim)
	case c.Heads < 1:
		return bad("heads", "%d must be at least 1", c.Heads)
	case c.KVHeads < 1 || c.KVHeads > c.Heads:
		return bad("kv_heads", "%d is outside 1..heads (%d)", c.KVHeads, c.Heads)
	case c.Heads%c.KVHeads != 0:
		return bad("kv_heads", "%d does not divide heads (%d)", c.KVHeads, c.Heads)
	case c.HeadDim < 2 || c.HeadDim%2 != 0 || c.HeadDim > 1024:
		return bad("head_dim", "%d must be even and in 2..1024", c.HeadDim)
	case c.Heads*c.HeadDim > maxDim:
		return bad("heads", "heads×head_dim = %d exceeds %d", c.Heads*c.HeadDim, maxDim)
	case c.FFNDim < 1 || c.FFNDim > 4*maxDim:
		return bad("ffn_dim", "%d is outside 1..%d", c.FFNDim, 4*maxDim)
	case c.Vocab < MinVocab || c.Vocab > 1<<22:
		return bad("vocab", "%d is outside %d..%d (text is tokenized byte by byte)", c.Vocab, MinVocab, 1<<22)
	case !(c.RopeTheta > 1) || c.RopeTheta > 1e12:
		return bad("rope_theta", "%g is outside (1, 1e12]", c.RopeTheta)
	case !(c.NormEps > 0) || c.NormEps > 1:
		return bad("norm_eps", "%g is outside (0, 1]", c.NormEps)
	case c.MaxContext < 1 || c.MaxContext > maxMaxContext:
		return bad("max_context", "%d is outside 1..%d", c.MaxContext, maxMaxContext)
	case c.BlockTokens < 1 || c.BlockTokens > prefixhash.MaxBlockTokens:
		return bad("block_tokens", "%d is outside 1..%d", c.BlockTokens, prefixhash.MaxBlockTokens)
	case c.Attention != "" && c.Attention != AttentionGQA && c.Attention != AttentionMLA:
		return bad("attention", "%q: want %s or %s", c.Attention, AttentionGQA, AttentionMLA)
	case !c.MLA() && (c.KVLoraRank != 0 || c.RopeDim != 0):
		return bad("kv_lora_rank", "kv_lora_rank %d and rope_dim %d are for %s attention only", c.KVLoraRank, c.RopeDim, AttentionMLA)
	case c.Attention == AttentionMLA && (c.KVLoraRank < 1 || c.KVLoraRank > maxDim):
		return bad("kv_lora_rank", "%d is outside 1..%d", c.KVLoraRank, maxDim)
	case c.Attention == AttentionMLA && (c.RopeDim < 2 || c.RopeDim%2 != 0 || c.RopeDim > 1024):
		return bad("rope_dim", "%d must be even and in 2..1024", c.RopeDim)
	case c.Attention == AttentionMLA && c.Heads*(c.HeadDim+c.RopeDim) > maxDim:
		return bad("heads", "heads×(head_dim+rope_dim) = %d exceeds %d", c.Heads*(c.HeadDim+c.RopeDim), maxDim)
	case c.MLA() && (c.QKVBias || c.QKNorm || c.SlidingWindow != 0):
		return bad("attention", "qkv_bias, qk_norm and sliding_window are for %s attention only", AttentionGQA)
	case c.SlidingWindow < 0:
		return bad("sliding_window", "%d is negative", c.SlidingWindow)
	}
	return c.RopeScaling.validate()
}

func (r RopeScaling) validate() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: rope_scaling: %s", ErrInvalidConfig, fmt.Sprintf(format, args...))
	}
	switch r.Type {
	case "":
		if r != (RopeScaling{}) {
			return bad("parameters without a type")
		}
		return nil
	case RopeLinear, RopeLlama3, RopeYarn:
	default:
		return bad("type %q: want %s, %s or %s", r.Type, RopeLinear, RopeLlama3, RopeYarn)
	}
	switch {
	case !(r.Factor >= 1) || r.Factor > 1e6:
		return bad("factor %g is outside [1, 1e6]", r.Factor)
	case r.Type == RopeLlama3 && !(r.LowFreqFactor > 0 && r.HighFreqFactor > r.LowFreqFactor):
		return bad("llama3 needs 0 < low_freq_factor (%g) < high_freq_factor (%g)", r.LowFreqFactor, r.HighFreqFactor)
	case r.Type != RopeLinear && (r.OriginalContext < 1 || r.OriginalContext > maxMaxContext):
		return bad("original_max_position_embeddings %d is outside 1..%d", r.OriginalContext, maxMaxContext)
	case r.Type == RopeYarn && !(r.BetaFast > r.BetaSlow && r.BetaSlow > 0):
		return bad("yarn needs beta_fast (%g) > beta_slow (%g) > 0", r.BetaFast, r.BetaSlow)
	case math.IsNaN(r.AttentionFactor) || r.AttentionFactor < 0 || r.AttentionFactor > 100:
		return bad("attention_factor %g is outside [0, 100]", r.AttentionFactor)
	}
	return nil
}

// String spells the scaling for a model id: "" for none.
func (r RopeScaling) String() string {
	switch r.Type {
	case "":
		return ""
	case RopeLinear:
		return fmt.Sprintf("linear%g", r.Factor)
	case RopeLlama3:
		return fmt.Sprintf("llama3-%g-%g-%g-%d", r.Factor, r.LowFreqFactor, r.HighFreqFactor, r.OriginalContext)
	}
	return fmt.Sprintf("yarn-%g-%d-%g-%g-%g", r.Factor, r.OriginalContext, r.BetaFast, r.BetaSlow, r.AttentionFactor)
}

// MLA reports whether c is multi-head latent attention.
func (c Config) MLA() bool { return c.Attention == AttentionMLA }

// AttnDim returns the width of attention's output, the input of o_proj:
// Heads·HeadDim (with MLA, the value heads).
func (c Config) AttnDim() int { return c.Heads * c.HeadDim }

// CacheDim returns what one token caches per layer and part: KVDim for
// GQA (a K and a V of this width), KVLoraRank+RopeDim for MLA (one latent).
func (c Config) CacheDim() int {
	if c.MLA() {
		return c.KVLoraRank + c.RopeDim
	}
	return c.KVDim()
}

// qkvWidth returns the width of the stacked input projections: Q, K and V
// for GQA, Q and kv_a (the latent and the rotary key) for MLA.
func (c Config) qkvWidth() int {
	if c.MLA() {
		return c.QDim() + c.CacheDim()
	}
	return c.QDim() + 2*c.KVDim()
}

// cacheParts returns the tensors cached per layer: 2 (K and V) for GQA,
// 1 (the latent) for MLA.
func (c Config) cacheParts() int {
	if c.MLA() {
		return 1
	}
	return 2
}

// QDim returns the width of the queries: Heads·HeadDim, or with MLA
// Heads·(HeadDim+RopeDim).
func (c Config) QDim() int {
	if c.MLA() {
		return c.Heads * (c.HeadDim + c.RopeDim)
	}
	return c.Heads * c.HeadDim
}

// KVDim returns KVHeads·HeadDim, the width of one token's K (or V) in one
// layer.
func (c Config) KVDim() int { return c.KVHeads * c.HeadDim }

// LayerParams returns the number of weights of one decoder layer that take
// part in matrix products (norm weights excluded).
func (c Config) LayerParams() int {
	if c.MLA() {
		// q_proj, kv_a_proj, kv_b_proj (run over the whole context on every
		// pass, but counted here once per new position), o_proj, the FFN.
		return c.Dim*(c.QDim()+c.CacheDim()) + c.KVLoraRank*2*c.AttnDim() + c.AttnDim()*c.Dim + 3*c.Dim*c.FFNDim
	}
	return c.Dim*(c.QDim()+2*c.KVDim()) + c.QDim()*c.Dim + 3*c.Dim*c.FFNDim
}

// ForwardFLOPs returns the arithmetic cost of computing positions
// [start, start+n) given the K/V of [0, start): the matrix products of every
// layer for the n new positions, causal attention (QKᵀ and PV) of each new
// position over every position up to itself, and the LM head of the last
// position. Element-wise work (norms, RoPE, softmax) is not counted.
func (c Config) ForwardFLOPs(start, n int) float64 {
	if n <= 0 {
		return 0
	}
	rows := float64(n)
	// Σ over new positions p of (p+1) keys.
	keys := rows*float64(start) + rows*(rows+1)/2
	perLayer := 2*rows*float64(c.LayerParams()) + 4*keys*float64(c.QDim())
	return float64(c.Layers)*perLayer + 2*float64(c.Vocab)*float64(c.Dim)
}

// variant spells what a GQA model computes beyond Llama's: "" for Llama.
// The weights digest covers biases and norms; this covers what no tensor
// holds.
func (c Config) variant() string {
	var b strings.Builder
	if c.QKVBias {
		b.WriteString("-qkvbias")
	}
	if c.QKNorm {
		b.WriteString("-qknorm")
	}
	if c.SlidingWindow > 0 {
		fmt.Fprintf(&b, "-swa%d", c.SlidingWindow)
	}
	if r := c.RopeScaling.String(); r != "" {
		b.WriteString("-" + r)
	}
	return b.String()
}

// Namespace returns the namespace of the KV blocks this model produces with
// weights whose digest is weightsDigest (see Weights.Digest). The model id
// spells out every field that changes the KV values and the weights digest,
// so another model, or the same shape with other weights, never shares a
// block with this one. c must be valid.
func (c Config) Namespace(weightsDigest uint64, tenantSalt string) prefixhash.Namespace {
	if c.MLA() {
		return prefixhash.Namespace{
			Model: fmt.Sprintf("kvmesh/mla-l%d-d%d-h%d-hd%d-r%d-c%d-f%d-v%d-rope%g-eps%g/w%016x",
				c.Layers, c.Dim, c.Heads, c.HeadDim, c.RopeDim, c.KVLoraRank, c.FFNDim, c.Vocab, c.RopeTheta, c.NormEps, weightsDigest),
			DType:       prefixhash.Float32,
			BlockTokens: c.BlockTokens,
			Layers:      c.Layers,
			Layout:      prefixhash.LatentKV,
			LatentDim:   c.CacheDim(),
			TenantSalt:  tenantSalt,
		}
	}
	return prefixhash.Namespace{
		Model: fmt.Sprintf("kvmesh/llama-l%d-d%d-h%d-kv%d-hd%d-f%d-v%d-rope%g-eps%g%s/w%016x",
			c.Layers, c.Dim, c.Heads, c.KVHeads, c.HeadDim, c.FFNDim, c.Vocab, c.RopeTheta, c.NormEps, c.variant(), weightsDigest),
		DType:       prefixhash.Float32,
		BlockTokens: c.BlockTokens,
		Layers:      c.Layers,
		KVHeads:     c.KVHeads,
		HeadDim:     c.HeadDim,
		TenantSalt:  tenantSalt,
	}
}
