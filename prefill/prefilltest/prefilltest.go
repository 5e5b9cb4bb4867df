// Package prefilltest makes small Hugging Face checkpoints and their
// logits with an independent PyTorch implementation (hfref.py, run by
// Debian's python3 with python3-torch), for the tests and benchmarks of the
// bundled engine. The script follows transformers' published definitions
// of llama, mistral, qwen2 and qwen3, and reads and writes safetensors
// itself; nothing of kvmesh's is involved.
package prefilltest

import (
	_ "embed"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

//go:embed hfref.py
var script []byte

// Python returns a python3 that imports torch and numpy, or an error that
// says what to install.
func Python() (string, error) {
	for _, py := range []string{"/usr/bin/python3", "python3"} {
		if exec.Command(py, "-c", "import torch, numpy").Run() == nil {
			return py, nil
		}
	}
	return "", fmt.Errorf("prefilltest: no python3 with torch and numpy: apt-get install python3-torch python3-numpy (.ci/run does)")
}

// Script writes hfref.py into dir and returns its path.
func Script(dir string) (string, error) {
	path := filepath.Join(dir, "hfref.py")
	return path, os.WriteFile(path, script, 0o644)
}

// Model is one checkpoint of a suite.
type Model struct {
	Name   string         `json:"name"`
	Arch   string         `json:"arch"`   // config.json's model_type
	DType  string         `json:"dtype"`  // f32, bf16 or f16
	Shards int            `json:"shards"` // 1: model.safetensors; more: an index
	Seed   int            `json:"seed"`
	Config map[string]any `json:"config"` // config.json's fields
	Prompt []uint32       `json:"prompt"`
}

// Prompt returns n token ids below vocab, from seed.
func Prompt(n, vocab int, seed uint64) []uint32 {
	p := make([]uint32, n)
	x := seed
	for i := range p {
		x = x*6364136223846793005 + 1442695040888963407
		p[i] = uint32(x>>33) % uint32(vocab)
	}
	return p
}

// Archs returns one small model per architecture, each with a feature of
// its family on: real head-count ratios with grouped-query attention;
// llama tied, in bf16, two shards, with Llama 3's RoPE scaling; mistral in
// f16 with a sliding window shorter than the prompt; qwen2 with q/k/v
// biases, tied, bf16 in three shards, YaRN; qwen3 with q/k norms, a
// head_dim that is not hidden/heads, bf16, linear RoPE scaling. Prompts
// are promptTokens long.
func Archs(promptTokens int) []Model {
	const vocab = 512 // room for the tokenizer fixtures of package tokenizer
	base := func(hidden, layers, heads, kv, ffn int) map[string]any {
		return map[string]any{"hidden_size": hidden, "num_hidden_layers": layers, "num_attention_heads": heads,
			"num_key_value_heads": kv, "intermediate_size": ffn, "vocab_size": vocab, "max_position_embeddings": 4096,
			"rms_norm_eps": 1e-5, "bos_token_id": 1, "eos_token_id": 2}
	}
	llama := base(96, 3, 8, 2, 160)
	llama["head_dim"] = 16
	llama["tie_word_embeddings"] = true
	llama["rope_theta"] = 500000.0
	llama["rope_scaling"] = map[string]any{"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
		"high_freq_factor": 4.0, "original_max_position_embeddings": 16384}
	mistral := base(64, 2, 8, 2, 128)
	mistral["sliding_window"] = 40
	mistral["rope_theta"] = 1000000.0
	qwen2 := base(56, 2, 7, 1, 96)
	qwen2["tie_word_embeddings"] = true
	qwen2["rope_theta"] = 1000000.0
	qwen2["use_sliding_window"] = false
	qwen2["sliding_window"] = 32768
	qwen2["rope_scaling"] = map[string]any{"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64}
	qwen3 := base(64, 2, 4, 2, 128)
	qwen3["head_dim"] = 32
	qwen3["tie_word_embeddings"] = false
	qwen3["rope_theta"] = 1000000.0
	qwen3["rope_scaling"] = map[string]any{"rope_type": "linear", "factor": 2.0}
	return []Model{
		{Name: "llama", Arch: "llama", DType: "bf16", Shards: 2, Seed: 1, Config: llama, Prompt: Prompt(promptTokens, vocab, 1)},
		{Name: "mistral", Arch: "mistral", DType: "f16", Shards: 1, Seed: 2, Config: mistral, Prompt: Prompt(promptTokens, vocab, 2)},
		{Name: "qwen2", Arch: "qwen2", DType: "bf16", Shards: 3, Seed: 3, Config: qwen2, Prompt: Prompt(promptTokens, vocab, 3)},
		{Name: "qwen3", Arch: "qwen3", DType: "bf16", Shards: 2, Seed: 4, Config: qwen3, Prompt: Prompt(promptTokens, vocab, 4)},
	}
}

// Suite writes each model's checkpoint to out/NAME with one run of
// hfref.py and returns, per model, the reference logits of every prompt
// position ([position][vocab]). It skips the test when no python3 with
// torch is at hand, unless CI is set (CI installs it).
func Suite(t testing.TB, out string, models []Model) [][][]float64 {
	t.Helper()
	py, err := Python()
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatal(err)
		}
		t.Skip(err)
	}
	path, err := Script(out)
	if err != nil {
		t.Fatal(err)
	}
	spec, _ := json.Marshal(map[string]any{"models": models})
	specPath := filepath.Join(out, "spec.json")
	if err := os.WriteFile(specPath, spec, 0o644); err != nil {
		t.Fatal(err)
	}
	if b, err := exec.Command(py, path, "suite", specPath, out).CombinedOutput(); err != nil {
		t.Fatalf("hfref.py suite: %v\n%s", err, b)
	}
	all := make([][][]float64, len(models))
	for i, m := range models {
		b, err := os.ReadFile(filepath.Join(out, m.Name, "logits.f64"))
		if err != nil {
			t.Fatal(err)
		}
		vocab := int(m.Config["vocab_size"].(int))
		if len(b) != 8*vocab*len(m.Prompt) {
			t.Fatalf("%s: %d bytes of logits for %d positions of %d", m.Name, len(b), len(m.Prompt), vocab)
		}
		rows := make([][]float64, len(m.Prompt))
		for p := range rows {
			rows[p] = make([]float64, vocab)
			for j := range rows[p] {
				rows[p][j] = math.Float64frombits(binary.LittleEndian.Uint64(b[8*(p*vocab+j):]))
			}
		}
		all[i] = rows
	}
	return all
}

// MaxRelErr returns max|got−want| / max|want|: the error relative to the
// logits' scale.
func MaxRelErr(got []float32, want []float64) float64 {
	var diff, scale float64
	for i := range want {
		diff = max(diff, math.Abs(float64(got[i])-want[i]))
		scale = max(scale, math.Abs(want[i]))
	}
	return diff / max(scale, 1e-30)
}
