package node

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
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

// openDraft returns the engine options of o's draft model (DraftDir):
// its shape from its config.json, under the model's BlockTokens and
// MaxContext. Its tokenizer.json must be the model's: a draft of another
// tokenizer guesses tokens that mean something else.
func openDraft(o *PrefillOptions, maxBlockBytes int) (*prefill.Options, error) {
	d, err := openModelDir(o.DraftDir, o.Model, maxBlockBytes)
	if err != nil {
		return nil, &OptionError{Field: "Prefill.DraftDir", Msg: err.Error()}
	}
	read := func(dir string) ([]byte, error) {
		if dir == "" {
			return nil, nil // the seeded model: byte tokens
		}
		b, err := os.ReadFile(filepath.Join(dir, "tokenizer.json"))
		if errors.Is(err, fs.ErrNotExist) {
			return nil, nil
		}
		return b, err
	}
	mine, err := read(o.ModelDir)
	if err != nil {
		return nil, &OptionError{Field: "Prefill.ModelDir", Msg: err.Error()}
	}
	its, err := read(o.DraftDir)
	if err != nil {
		return nil, &OptionError{Field: "Prefill.DraftDir", Msg: err.Error()}
	}
	switch {
	case mine == nil && its != nil:
		return nil, &OptionError{Field: "Prefill.DraftDir", Msg: "the draft has a tokenizer.json, the model none (byte tokens): a draft must share the model's tokenizer"}
	case mine != nil && its == nil:
		return nil, &OptionError{Field: "Prefill.DraftDir", Msg: "the draft has no tokenizer.json (byte tokens), the model has one: a draft must share the model's tokenizer"}
	case !bytes.Equal(mine, its):
		return nil, &OptionError{Field: "Prefill.DraftDir", Msg: "the draft's tokenizer.json differs from the model's: a draft must share the model's tokenizer"}
	}
	return &prefill.Options{Config: d.cfg, ModelDir: o.DraftDir, MaxModelBytes: o.MaxModelBytes}, nil
}

// modelError makes an error about the model's files an OptionError that
// names the option to fix (the flag, on the command line), and passes
// others on.
func modelError(err error) error {
	switch {
	case errors.Is(err, prefill.ErrDraft):
		return &OptionError{Field: "Prefill.DraftDir", Msg: err.Error()}
	case errors.Is(err, prefill.ErrModelTooLarge):
		return &OptionError{Field: "Prefill.MaxModelBytes", Msg: err.Error()}
	case errors.Is(err, prefill.ErrCheckpoint), errors.Is(err, prefill.ErrSafetensors), errors.Is(err, prefill.ErrWeights),
		errors.Is(err, prefill.ErrInvalidConfig), errors.Is(err, tokenizer.ErrFormat), errors.Is(err, tokenizer.ErrTemplate),
		errors.Is(err, fs.ErrNotExist):
		return &OptionError{Field: "Prefill.ModelDir", Msg: err.Error()}
	}
	return err
}
