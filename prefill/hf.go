package prefill

import (
	"encoding/json"
	"fmt"
	"os"
)

// ModelInfo is what a Hugging Face config.json says beside the shape.
type ModelInfo struct {
	// EOS are the ids that end a generation (eos_token_id: one or a list).
	EOS []uint32
}

// LoadConfigJSON reads a Hugging Face Llama config.json (hidden_size,
// num_hidden_layers, num_attention_heads, num_key_value_heads, head_dim,
// intermediate_size, vocab_size, rope_theta, rms_norm_eps,
// max_position_embeddings, eos_token_id) into a Config; fields it lacks
// keep Config's defaults, and BlockTokens is the default. The result is
// validated.
func LoadConfigJSON(path string) (Config, ModelInfo, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return Config{}, ModelInfo{}, fmt.Errorf("prefill: %w", err)
	}
	var f struct {
		ModelType    string          `json:"model_type"`
		Hidden       int             `json:"hidden_size"`
		Layers       int             `json:"num_hidden_layers"`
		Heads        int             `json:"num_attention_heads"`
		KVHeads      int             `json:"num_key_value_heads"`
		HeadDim      int             `json:"head_dim"`
		Intermediate int             `json:"intermediate_size"`
		Vocab        int             `json:"vocab_size"`
		RopeTheta    float64         `json:"rope_theta"`
		NormEps      float64         `json:"rms_norm_eps"`
		MaxPos       int             `json:"max_position_embeddings"`
		EOS          json.RawMessage `json:"eos_token_id"`
	}
	if err := json.Unmarshal(b, &f); err != nil {
		return Config{}, ModelInfo{}, fmt.Errorf("%w: %s: %w", ErrInvalidConfig, path, err)
	}
	if f.ModelType != "" && f.ModelType != "llama" {
		return Config{}, ModelInfo{}, fmt.Errorf("%w: %s: model_type %q; this engine runs llama", ErrInvalidConfig, path, f.ModelType)
	}
	c := Config{Layers: f.Layers, Dim: f.Hidden, Heads: f.Heads, KVHeads: f.KVHeads, HeadDim: f.HeadDim, FFNDim: f.Intermediate,
		Vocab: f.Vocab, RopeTheta: f.RopeTheta, NormEps: f.NormEps, MaxContext: min(f.MaxPos, DefaultMaxContext)}
	if c.KVHeads == 0 {
		c.KVHeads = c.Heads
	}
	if c.HeadDim == 0 && c.Heads > 0 {
		c.HeadDim = c.Dim / c.Heads
	}
	c.EnsureDefaults()
	if err := c.Validate(); err != nil {
		return Config{}, ModelInfo{}, fmt.Errorf("%s: %w", path, err)
	}
	var info ModelInfo
	var one uint32
	var many []uint32
	switch {
	case len(f.EOS) == 0 || string(f.EOS) == "null":
	case json.Unmarshal(f.EOS, &one) == nil:
		info.EOS = []uint32{one}
	case json.Unmarshal(f.EOS, &many) == nil:
		info.EOS = many
	default:
		return Config{}, ModelInfo{}, fmt.Errorf("%w: %s: eos_token_id %s is not an id or a list of ids", ErrInvalidConfig, path, f.EOS)
	}
	return c, info, nil
}
