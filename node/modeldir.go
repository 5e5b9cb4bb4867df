package node

import (
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"slices"

	"github.com/kvmesh/kvmesh/block"
	"github.com/kvmesh/kvmesh/prefill"
	"github.com/kvmesh/kvmesh/tokenizer"
)

// modelDir is what a Hugging Face model directory tells the node beside
// the weights, which the engine loads (prefill.Options.ModelDir).
type modelDir struct {
	cfg      prefill.Config
	tok      tokenizer.Tokenizer
	eos      []uint32
	sampling prefill.SamplingDefaults
}

// openModelDir reads dir's config.json, generation_config.json and
// tokenizer files; shape carries the node's BlockTokens and its
// MaxContext cap.
func openModelDir(dir string, shape prefill.Config, maxBlockBytes int) (modelDir, error) {
	cfg, info, err := prefill.LoadConfigJSON(filepath.Join(dir, "config.json"))
	if err == nil {
		err = prefill.LoadGenerationConfig(filepath.Join(dir, "generation_config.json"), &info)
	}
	if err != nil {
		return modelDir{}, fmt.Errorf("node: Prefill.ModelDir: %w", err)
	}
	cfg.BlockTokens = shape.BlockTokens
	cfg.MaxContext = min(cfg.MaxContext, shape.MaxContext)
	if size := block.EncodedLen(cfg.BlockTokens, cfg.Namespace(0, "").BlockBytes()); size > maxBlockBytes {
		return modelDir{}, &OptionError{Field: "Prefill.ModelDir", Msg: fmt.Sprintf("the model's blocks are %d bytes encoded, over MaxBlockBytes (%d)", size, maxBlockBytes)}
	}
	m := modelDir{cfg: cfg, tok: tokenizer.Bytes{}, eos: info.EOS, sampling: info.Sampling}
	if fileExists(filepath.Join(dir, "tokenizer.json")) {
		d, err := tokenizer.LoadDir(dir)
		if err != nil {
			return modelDir{}, fmt.Errorf("node: Prefill.ModelDir: %w", err)
		}
		m.tok = d
		for _, id := range d.EOS() {
			if !slices.Contains(m.eos, id) {
				m.eos = append(m.eos, id)
			}
		}
	}
	return m, nil
}

// modelError makes an error about the model's files an OptionError that
// names the option to fix (the flag, on the command line), and passes
// others on.
func modelError(err error) error {
	switch {
	case errors.Is(err, prefill.ErrModelTooLarge):
		return &OptionError{Field: "Prefill.MaxModelBytes", Msg: err.Error()}
	case errors.Is(err, prefill.ErrCheckpoint), errors.Is(err, prefill.ErrSafetensors), errors.Is(err, prefill.ErrWeights),
		errors.Is(err, prefill.ErrInvalidConfig), errors.Is(err, tokenizer.ErrFormat), errors.Is(err, tokenizer.ErrTemplate),
		errors.Is(err, fs.ErrNotExist):
		return &OptionError{Field: "Prefill.ModelDir", Msg: err.Error()}
	}
	return err
}
