package prefill

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"slices"
)

// Architectures is the model_type values of config.json the engine runs.
var Architectures = []string{"llama", "mistral", "qwen2", "qwen3"}

// ModelInfo is what a Hugging Face config.json (and generation_config.json)
// says beside the shape.
type ModelInfo struct {
	// Arch is config.json's model_type ("llama" when it has none).
	Arch string
	// EOS are the ids that end a generation (eos_token_id: one or a list;
	// generation_config.json's, when it has one, else config.json's).
	EOS []uint32
	// BOS is bos_token_id, when config.json names one.
	BOS *uint32
	// TieEmbeddings is tie_word_embeddings: the LM head is the embedding
	// matrix. When config.json does not say, a checkpoint without
	// lm_head.weight is read as tied.
	TieEmbeddings *bool
	// DType is the checkpoint's declared dtype (torch_dtype), for messages.
	DType string
	// Sampling holds generation_config.json's defaults, when it has them.
	Sampling SamplingDefaults
}

// SamplingDefaults are a model's own sampling defaults
// (generation_config.json). Nil fields are not set.
type SamplingDefaults struct {
	Temperature *float64
	TopP        *float64
}

// Values returns the temperature and top_p of a request that names
// neither: the model's, else OpenAI's (temperature 1, top_p 0 read as 1),
// each clamped to what GenerateOptions accepts.
func (s SamplingDefaults) Values() (temperature, topP float64) {
	temperature = 1
	if t := s.Temperature; t != nil && !math.IsNaN(*t) {
		temperature = min(max(*t, 0), MaxTemperature)
	}
	if t := s.TopP; t != nil && *t > 0 && *t <= 1 {
		topP = *t
	}
	return temperature, topP
}

// hfConfig is the part of config.json the engine reads.
type hfConfig struct {
	ModelType     string          `json:"model_type"`
	Hidden        int             `json:"hidden_size"`
	Layers        int             `json:"num_hidden_layers"`
	Heads         int             `json:"num_attention_heads"`
	KVHeads       int             `json:"num_key_value_heads"`
	HeadDim       int             `json:"head_dim"`
	Intermediate  int             `json:"intermediate_size"`
	Vocab         int             `json:"vocab_size"`
	RopeTheta     float64         `json:"rope_theta"`
	NormEps       float64         `json:"rms_norm_eps"`
	MaxPos        int             `json:"max_position_embeddings"`
	EOS           json.RawMessage `json:"eos_token_id"`
	BOS           json.RawMessage `json:"bos_token_id"`
	Tie           *bool           `json:"tie_word_embeddings"`
	HiddenAct     string          `json:"hidden_act"`
	AttnBias      bool            `json:"attention_bias"`
	MLPBias       bool            `json:"mlp_bias"`
	SlidingWindow *int            `json:"sliding_window"`
	UseSliding    *bool           `json:"use_sliding_window"`
	PartialRotary *float64        `json:"partial_rotary_factor"`
	TorchDType    string          `json:"torch_dtype"`
	DType         string          `json:"dtype"`
	RopeScaling   json.RawMessage `json:"rope_scaling"`
	// RopeParameters is where newer configs keep rope_theta and the scaling.
	RopeParameters json.RawMessage `json:"rope_parameters"`
}

type hfRope struct {
	Type            string   `json:"type"`
	RopeType        string   `json:"rope_type"`
	RopeTheta       float64  `json:"rope_theta"`
	Factor          float64  `json:"factor"`
	LowFreqFactor   float64  `json:"low_freq_factor"`
	HighFreqFactor  float64  `json:"high_freq_factor"`
	OriginalMaxPos  int      `json:"original_max_position_embeddings"`
	BetaFast        float64  `json:"beta_fast"`
	BetaSlow        float64  `json:"beta_slow"`
	AttentionFactor *float64 `json:"attention_factor"`
	Mscale          float64  `json:"mscale"`
	MscaleAllDim    float64  `json:"mscale_all_dim"`
}

// LoadConfigJSON reads a Hugging Face config.json of a llama, mistral,
// qwen2 or qwen3 model (hidden_size, num_hidden_layers,
// num_attention_heads, num_key_value_heads, head_dim, intermediate_size,
// vocab_size, rope_theta, rope_scaling, rms_norm_eps, sliding_window,
// max_position_embeddings, tie_word_embeddings, eos_token_id) into a
// Config; fields it lacks keep Config's defaults, and BlockTokens is the
// default. What the engine cannot compute (another model_type, another
// activation, biases Llama does not have, dynamic RoPE) is refused by
// name. The result is validated.
func LoadConfigJSON(path string) (Config, ModelInfo, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return Config{}, ModelInfo{}, fmt.Errorf("prefill: %w", err)
	}
	c, info, err := parseConfigJSON(b)
	if err != nil {
		return Config{}, ModelInfo{}, fmt.Errorf("%w: %s: %w", ErrInvalidConfig, path, err)
	}
	return c, info, nil
}

func parseConfigJSON(b []byte) (Config, ModelInfo, error) {
	var f hfConfig
	if err := json.Unmarshal(b, &f); err != nil {
		return Config{}, ModelInfo{}, err
	}
	info := ModelInfo{Arch: f.ModelType, TieEmbeddings: f.Tie, DType: f.TorchDType}
	if info.Arch == "" {
		info.Arch = "llama"
	}
	if info.DType == "" {
		info.DType = f.DType
	}
	if !slices.Contains(Architectures, info.Arch) {
		return Config{}, ModelInfo{}, fmt.Errorf("model_type %q is not supported; this engine runs %v", f.ModelType, Architectures)
	}
	switch {
	case f.HiddenAct != "" && f.HiddenAct != "silu":
		return Config{}, ModelInfo{}, fmt.Errorf("hidden_act %q: this engine runs silu (SwiGLU)", f.HiddenAct)
	case f.AttnBias && info.Arch != "qwen2":
		return Config{}, ModelInfo{}, errors.New("attention_bias: biases on q/k/v/o_proj are not supported for " + info.Arch)
	case f.MLPBias:
		return Config{}, ModelInfo{}, errors.New("mlp_bias: biases on the MLP are not supported")
	case f.PartialRotary != nil && *f.PartialRotary != 1:
		return Config{}, ModelInfo{}, fmt.Errorf("partial_rotary_factor %g: only full RoPE is supported", *f.PartialRotary)
	}
	c := Config{Layers: f.Layers, Dim: f.Hidden, Heads: f.Heads, KVHeads: f.KVHeads, HeadDim: f.HeadDim, FFNDim: f.Intermediate,
		Vocab: f.Vocab, RopeTheta: f.RopeTheta, NormEps: f.NormEps, MaxContext: min(f.MaxPos, DefaultMaxContext)}
	switch info.Arch {
	case "qwen2":
		c.QKVBias = true
	case "qwen3":
		c.QKNorm = true
	}
	if f.SlidingWindow != nil && *f.SlidingWindow > 0 {
		switch {
		case info.Arch == "mistral":
			c.SlidingWindow = *f.SlidingWindow
		case f.UseSliding != nil && *f.UseSliding:
			// Qwen's window covers only the layers from max_window_layers
			// on: hybrid groups, not yet.
			return Config{}, ModelInfo{}, fmt.Errorf("use_sliding_window: %s's sliding window over some layers is not supported", info.Arch)
		}
	}
	if c.KVHeads == 0 {
		c.KVHeads = c.Heads
	}
	if c.HeadDim == 0 && c.Heads > 0 {
		c.HeadDim = c.Dim / c.Heads
	}
	scaling := f.RopeScaling
	if len(f.RopeParameters) > 0 && string(f.RopeParameters) != "null" {
		var rp hfRope
		if err := json.Unmarshal(f.RopeParameters, &rp); err != nil {
			return Config{}, ModelInfo{}, fmt.Errorf("rope_parameters: %w", err)
		}
		if c.RopeTheta == 0 {
			c.RopeTheta = rp.RopeTheta
		}
		if len(scaling) == 0 || string(scaling) == "null" {
			scaling = f.RopeParameters
		}
	}
	var err error
	if c.RopeScaling, err = parseRopeScaling(scaling, f.MaxPos); err != nil {
		return Config{}, ModelInfo{}, err
	}
	c.EnsureDefaults()
	if err := c.Validate(); err != nil {
		return Config{}, ModelInfo{}, err
	}
	if info.EOS, err = tokenIDs(f.EOS); err != nil {
		return Config{}, ModelInfo{}, fmt.Errorf("eos_token_id %s is not an id or a list of ids", f.EOS)
	}
	if bos, err := tokenIDs(f.BOS); err == nil && len(bos) == 1 {
		info.BOS = &bos[0]
	}
	return c, info, nil
}

// parseRopeScaling reads rope_scaling (or rope_parameters); maxPos is
// max_position_embeddings, YaRN's original context when it names none.
func parseRopeScaling(raw json.RawMessage, maxPos int) (RopeScaling, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return RopeScaling{}, nil
	}
	var r hfRope
	if err := json.Unmarshal(raw, &r); err != nil {
		return RopeScaling{}, fmt.Errorf("rope_scaling: %w", err)
	}
	typ := r.RopeType
	if typ == "" {
		typ = r.Type
	}
	sc := RopeScaling{Type: typ, Factor: r.Factor, OriginalContext: r.OriginalMaxPos}
	switch typ {
	case "", "default":
		return RopeScaling{}, nil
	case RopeLinear:
		sc.OriginalContext = 0
	case RopeLlama3:
		sc.LowFreqFactor, sc.HighFreqFactor = r.LowFreqFactor, r.HighFreqFactor
	case RopeYarn:
		if sc.OriginalContext == 0 {
			sc.OriginalContext = maxPos
		}
		sc.BetaFast, sc.BetaSlow = r.BetaFast, r.BetaSlow
		if sc.BetaFast == 0 {
			sc.BetaFast = 32
		}
		if sc.BetaSlow == 0 {
			sc.BetaSlow = 1
		}
		mscale := func(s, m float64) float64 {
			if s <= 1 {
				return 1
			}
			return 0.1*m*math.Log(s) + 1
		}
		switch {
		case r.AttentionFactor != nil:
			sc.AttentionFactor = *r.AttentionFactor
		case r.Mscale != 0 && r.MscaleAllDim != 0:
			sc.AttentionFactor = mscale(sc.Factor, r.Mscale) / mscale(sc.Factor, r.MscaleAllDim)
		default:
			sc.AttentionFactor = mscale(sc.Factor, 1)
		}
	default:
		return RopeScaling{}, fmt.Errorf("rope_scaling type %q is not supported (linear, llama3, yarn)", typ)
	}
	return sc, sc.validate()
}

// tokenIDs reads a token id or a list of them; null or absent is none.
func tokenIDs(raw json.RawMessage) ([]uint32, error) {
	var one uint32
	var many []uint32
	switch {
	case len(raw) == 0 || string(raw) == "null":
		return nil, nil
	case json.Unmarshal(raw, &one) == nil:
		return []uint32{one}, nil
	case json.Unmarshal(raw, &many) == nil:
		return many, nil
	}
	return nil, errors.New("not a token id or a list of them")
}

// LoadGenerationConfig reads a generation_config.json into info: its
// eos_token_id (which replaces config.json's), temperature and top_p. A
// missing file changes nothing.
func LoadGenerationConfig(path string, info *ModelInfo) error {
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("prefill: %w", err)
	}
	var f struct {
		EOS         json.RawMessage `json:"eos_token_id"`
		Temperature *float64        `json:"temperature"`
		TopP        *float64        `json:"top_p"`
	}
	if err := json.Unmarshal(b, &f); err != nil {
		return fmt.Errorf("%w: %s: %w", ErrInvalidConfig, path, err)
	}
	eos, err := tokenIDs(f.EOS)
	if err != nil {
		return fmt.Errorf("%w: %s: eos_token_id %s: %w", ErrInvalidConfig, path, f.EOS, err)
	}
	if len(eos) > 0 {
		info.EOS = eos
	}
	// As vLLM reads them: the values, whatever do_sample says.
	info.Sampling.Temperature, info.Sampling.TopP = f.Temperature, f.TopP
	return nil
}
