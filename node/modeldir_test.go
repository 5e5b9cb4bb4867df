package node

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kvmesh/kvmesh/prefill"
	"github.com/kvmesh/kvmesh/tokenizer"
	"github.com/kvmesh/kvmesh/tokenizer/tokenizertest"
)

// writeModelDir writes a small Hugging Face Llama directory: config.json,
// model.safetensors (seeded weights) and a byte-level BPE tokenizer.json
// whose <|im_end|> (266) is the EOS.
func writeModelDir(t *testing.T) (string, prefill.Config, *prefill.Weights) {
	t.Helper()
	cfg := prefill.Config{Layers: 2, Dim: 64, Heads: 4, KVHeads: 2, HeadDim: 16, FFNDim: 96, Vocab: tokenizertest.Vocab,
		MaxContext: 1024, BlockTokens: 16}
	cfg.EnsureDefaults()
	return writeModelDirOf(t, cfg, nil)
}

// writeModelDirOf is writeModelDir of a model shaped cfg, with more
// config.json fields.
func writeModelDirOf(t *testing.T, cfg prefill.Config, more map[string]any) (string, prefill.Config, *prefill.Weights) {
	t.Helper()
	dir := t.TempDir()
	fields := map[string]any{"model_type": "llama", "hidden_size": cfg.Dim, "num_hidden_layers": cfg.Layers,
		"num_attention_heads": cfg.Heads, "num_key_value_heads": cfg.KVHeads, "intermediate_size": cfg.FFNDim,
		"vocab_size": cfg.Vocab, "rope_theta": cfg.RopeTheta, "rms_norm_eps": cfg.NormEps, "max_position_embeddings": 1024,
		"eos_token_id": 266}
	for k, v := range more {
		fields[k] = v
	}
	j, _ := json.Marshal(fields)
	w := prefill.SeededWeights(cfg, 3)
	for name, b := range map[string][]byte{"config.json": j, "tokenizer.json": tokenizertest.File()} {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := prefill.SaveWeights(filepath.Join(dir, "model.safetensors"), cfg, w); err != nil {
		t.Fatal(err)
	}
	return dir, cfg, w
}

// TestOpenAIModelDir: a node serving a model directory tokenizes with its
// tokenizer.json, renders chats as ChatML, stops at its EOS, and generates
// what a cold engine of those weights does; repeats hit the cache.
func TestOpenAIModelDir(t *testing.T) {
	dir, cfg, w := writeModelDir(t)
	pn := startPrefillNode(t, "", nil, func(o *Options) {
		o.Prefill = PrefillOptions{ModelDir: dir, Model: prefill.Config{BlockTokens: 16}}
	}, nil)
	tok, err := tokenizer.Load(filepath.Join(dir, "tokenizer.json"))
	if err != nil {
		t.Fatal(err)
	}
	cold, err := prefill.New(nil, prefill.Options{Config: cfg, Weights: w})
	if err != nil {
		t.Fatal(err)
	}
	defer cold.Close()
	want := func(prompt []uint32) string {
		g, err := cold.Generate(context.Background(), prompt, prefill.GenerateOptions{MaxTokens: 12, Stop: [][]uint32{{266}}})
		if err != nil {
			t.Fatal(err)
		}
		return string([]rune(string(tok.Decode(g.Tokens)))) // the API's text: an invalid byte is U+FFFD
	}
	prompt := strings.Repeat("hello world, ", 12)
	ids := tok.Encode(prompt)
	if len(ids) >= len(prompt) {
		t.Fatalf("the test tokenizer made %d tokens of %d bytes", len(ids), len(prompt))
	}
	req := map[string]any{"model": "kvmesh", "prompt": prompt, "max_tokens": 12, "temperature": 0}
	first := parseCompletion(t, callAPI(t, "POST", apiURL(pn.Node, "/v1/completions"), "", req), false)
	if first.Prompt != len(ids) || first.Text != want(ids) {
		t.Errorf("completion %+v, want %d prompt tokens and text %q", first, len(ids), want(ids))
	}
	pn.Node.prefill.engine.Flush(context.Background())
	again := parseCompletion(t, callAPI(t, "POST", apiURL(pn.Node, "/v1/completions"), "", req), false)
	if hit := min(len(ids)/16*16, len(ids)-1); again.Text != first.Text || again.Cached != hit {
		t.Errorf("repeat %+v, want the same text and %d cached", again, hit)
	}
	chat := map[string]any{"model": "kvmesh", "max_tokens": 12, "temperature": 0,
		"messages": []map[string]string{{"role": "system", "content": prompt}, {"role": "user", "content": "hello"}}}
	chatIDs := tok.Encode("<|im_start|>system\n" + prompt + "<|im_end|>\n<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n")
	got := parseCompletion(t, callAPI(t, "POST", apiURL(pn.Node, "/v1/chat/completions"), "", chat), true)
	if got.Prompt != len(chatIDs) || got.Text != want(chatIDs) {
		t.Errorf("chat %+v, want %d prompt tokens (ChatML) and text %q", got, len(chatIDs), want(chatIDs))
	}

	o := Options{Prefill: PrefillOptions{ModelDir: dir, WeightsPath: "w.safetensors"}}
	o.EnsureDefaults()
	if err := o.Validate(); err == nil || !strings.Contains(err.Error(), "ModelDir") {
		t.Errorf("ModelDir with WeightsPath: %v", err)
	}
}
